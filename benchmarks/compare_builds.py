#!/usr/bin/env python3
"""Two builds of the shipped ops, the same calls, timed in alternating processes: did a change slow an op?

    git worktree add /tmp/before <commit>                  # a source checkout of the build to compare with
    python benchmarks/compare_builds.py --before /tmp/before --ops gla,rwkv7 --shapes 4x4096x16x128
    python benchmarks/compare_builds.py --before /tmp/before --ops gated_delta_rule --shapes 4x4096x16x128x32 \
        --after-override '{"fwd_wu": {"num_warps": 2}}'    # Qwen3-Next's grouped call, a plan variant after
    python benchmarks/compare_builds.py --variants '{"fwd_solve": {"num_warps": 2}}' '{"fwd_wu": {"num_stages": 2}}' \
        --ops gated_delta_rule --shapes 4x4096x16x128x32     # plan variants of this build, in one process

Each build runs in its own process (its own fla_gen, generated packages and plans, so a change anywhere is
compared), ``--rounds`` times each, alternating before, after, before, after: a GPU that runs faster or slower
for a stretch lands on both sides. Every process times, per op and shape, the chunk op's forward (no autograd)
and forward+backward on the same inputs (fixed seed: the packages' INPUTS roles, gates logsigmoid(randn) / 16
in fp32, unit-norm keys, beta sigmoid(randn), RWKV-7-style a = -k̂, b = η k̂), each a do_bench median after a
warm-up call. The table gives each side's median over its rounds and the worst pair: min over rounds of
before / after (below 1: the change is slower in at least one round), and beside it the GPU's kernel time of the
same calls (torch.profiler, medians over the rounds, their ratio before / after): it leaves out the time the GPU
waits for the host, which can move one process's wall times by 10-25% (docs/performance.md). A shape's optional
fifth field is the number of value heads HV (grouped heads: v, the gates and beta of the ops that declare them get
HV heads).

``--variants`` compares plan overrides of this one build instead, all in one process (one compile each, so a
variant costs seconds rather than a process per round): per op and shape, rounds of the plan's own launch
configs, then each variant, ..., the same timings and the worst pair, plan / variant, and each one's kernel time
(in the last round) with plan / variant of it. Each variant's output is checked against the plan's (relative norm
error of the forward's output, printed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OVERRIDE_ENV = "FLA_GEN_PLAN_OVERRIDE"  # fla_gen.runtime.dispatch reads it; each side's process gets its own
OPS = ("linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "dplr", "rwkv7")


def _inputs(pkg, shape, seed: int, device: str = "cuda", dtype: str = "bfloat16", gate_scale: float = 1.0):
    """The package's chunk-op tensors for shape (B, T, H, D) or (B, T, H, D, HV), in its INPUTS order
    (``dtype``, gates fp32); layouts with G (grouped value heads) get HV heads. Per-token log gates are
    logsigmoid(randn) / 16 times ``gate_scale``."""
    import torch
    import torch.nn.functional as F

    B, T, H, D = shape[:4]
    HV = shape[4] if len(shape) == 5 else H
    if HV != H and not any("G" in layout for _n, layout, _r, _o in pkg.INPUTS):
        raise ValueError(f"{pkg.__name__} has no grouped value heads: shape {shape} asks for HV={HV} != H={H}")
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*s):
        return torch.randn(*s, device=device, generator=gen)

    out, direction = [], F.normalize(randn(B, T, H, D), dim=-1)
    for _name, layout, role, optional in pkg.INPUTS:
        per_token = layout.startswith("BT")
        if optional and not per_token:  # a per-head constant gate left out: the per-token one is given
            out.append(None)
            continue
        heads = HV if "G" in layout else H
        size = (B, T, heads) + ((D,) if layout.endswith(("K", "V")) else ()) if per_token else (heads,)
        if role == "gate":
            x = gate_scale * F.logsigmoid(randn(*size)) / 16 if per_token else torch.full(size, -0.03, device=device)
        elif role == "rank1_read":
            x = -direction
        elif role == "rank1_write":
            x = direction * torch.sigmoid(randn(B, T, H, 1))
        elif role in ("query", "key"):
            x = F.normalize(randn(*size), dim=-1)
        elif role == "value":
            x = randn(*size)
        else:
            x = torch.sigmoid(randn(*size))
        out.append((x.float() if role == "gate" else x.to(getattr(torch, dtype))).requires_grad_(True))
    return out


def _calls(fn, args: list):
    """(forward without autograd, forward+backward, the leaves whose .grad each call resets) of fn on ``args``,
    both compiled by one warm-up call."""
    import torch

    leaves = [a for a in args if a is not None]
    do = torch.randn_like(fn(*args)[0])

    def forward():
        with torch.no_grad():
            fn(*args)

    def forward_backward():
        fn(*args)[0].backward(do)

    forward_backward()  # compile both directions before timing
    return forward, forward_backward, leaves


def _time_call(fn, args: list, do_bench, kernels: bool = False) -> list[float | None]:
    """Median ms of fn's forward (no autograd) and forward+backward on ``args``, after a warm-up call; with
    ``kernels`` also the GPU's kernel time of the same two calls (_ops.kernel_ms: every kernel's duration over 20
    calls; None off CUDA). Two builds run in two processes, and a host that slows one of them moves its wall times
    but not its kernel times."""
    forward, forward_backward, leaves = _calls(fn, args)
    times = [do_bench(f, warmup=25, rep=100, grad_to_none=leaves, return_mode="median")
             for f in (forward, forward_backward)]
    if kernels:
        import _ops

        times += [_ops.kernel_ms(f, leaves) for f in (forward, forward_backward)]
    return times


def _chunk_op(op: str):
    """(package, its chunk_* function) of ``generated.<op>`` in this process's build."""
    import importlib

    pkg = importlib.import_module(f"generated.{op}")
    return pkg, getattr(pkg, next(n for n in dir(pkg) if n.startswith("chunk_")))


def child(ops: list[str], shapes: list[tuple[int, int, int, int]], seed: int, gate_scale: float = 1.0) -> dict:
    """Time every (op, shape) in this process's build: {"op shape": [fwd ms, fwd+bwd ms, and their kernel ms]}."""
    import torch
    from triton.testing import do_bench

    sys.path.insert(0, os.getcwd())
    out = {}
    for op in ops:
        pkg, fn = _chunk_op(op)
        for shape in shapes:
            args = _inputs(pkg, shape, seed, gate_scale=gate_scale)
            out[f"{op} {'x'.join(map(str, shape))}"] = _time_call(fn, args, do_bench, kernels=True)
            torch.cuda.empty_cache()
    return out


# A variant whose output differs from the plan's by more than this (relative norm) computes something else: two
# correct orders of the same sums differ by about twice their bf16 error against float64 (4e-3 .. 5e-3 for the
# shipped ops), and a miscompiled kernel by far more (Triton 3.6 on Hopper: 0.07 for the gated delta rule's walk at
# one stage, docs/performance.md).
DIFFERS_FROM_PLAN = 2e-2


def time_variants(ops: list[str], shapes: list[tuple[int, ...]], variants: list[dict], rounds: int,
                  seed: int, device: str = "cuda", dtype: str = "bfloat16", do_bench=None,
                  gate_scale: float = 1.0, kernels: bool | None = None) -> list[str]:
    """The plan's own configs against each override in ``variants``, alternating over ``rounds`` in this process:
    the table's lines (per op, shape and variant: forward and forward+backward medians, worst plan/variant). A
    variant whose output is not within DIFFERS_FROM_PLAN of the plan's is marked in its error cell; one whose call
    fails raises a RuntimeError that names it (each output is synchronized before the next variant runs, so a
    device fault is not reported under a later one). ``device``, ``dtype`` and ``do_bench`` (triton.testing's by
    default) let a test run it in Triton's interpreter; ``kernels`` (default: on CUDA) adds the kernel times."""
    import contextlib

    import torch

    from fla_gen.runtime.dispatch import overridden_plans

    if do_bench is None:
        from triton.testing import do_bench
    if kernels is None:
        kernels = device == "cuda"

    overrides = [None, *variants]

    def plan_of(override):
        return contextlib.nullcontext() if override is None else overridden_plans(override)

    def name_of(override):
        return "the plan" if override is None else json.dumps(override, separators=(",", ":"))

    lines = ["| op | shape | variant | error vs plan | fwd ms | worst plan/variant | kernels fwd (plan/variant) | "
             "f+b ms | worst plan/variant | kernels f+b (plan/variant) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for op in ops:
        pkg, fn = _chunk_op(op)
        for shape in shapes:
            args = _inputs(pkg, shape, seed, device, dtype, gate_scale)
            outputs = []
            for v in overrides:
                try:
                    with plan_of(v), torch.no_grad():
                        outputs.append(fn(*args)[0].float())
                    if device == "cuda":
                        torch.cuda.synchronize()
                except Exception as e:
                    raise RuntimeError(f"{op} at {'x'.join(map(str, shape))}: {name_of(v)} failed: "
                                       f"{type(e).__name__}: {e}") from e
            errors = [((o - outputs[0]).norm() / outputs[0].norm()).item() for o in outputs]
            times = []
            for r in range(rounds):
                times.append([])
                for v in overrides:
                    with plan_of(v):
                        # the kernel time once, in the last round: it does not move with the host
                        times[-1].append(_time_call(fn, args, do_bench, kernels=kernels and r == rounds - 1))
            for i, v in enumerate(overrides):
                cells = []
                for m in (0, 1):
                    mine = [times[r][i][m] for r in range(rounds)]
                    worst = min(times[r][0][m] / times[r][i][m] for r in range(rounds))
                    cells += [f"{statistics.median(mine):.3f}", f"{worst:.3f}"]
                    plan_k, variant_k = (times[-1][j][2 + m] if len(times[-1][j]) > 2 else None for j in (0, i))
                    cells.append("-" if None in (plan_k, variant_k) else f"{variant_k:.3f} ({plan_k / variant_k:.3f})")
                error = f"{errors[i]:.1e}" + ("" if errors[i] <= DIFFERS_FROM_PLAN else " **differs from the plan**")
                lines.append(f"| {op} | {'x'.join(map(str, shape))} | {name_of(v)} | {error} | " + " | ".join(cells)
                             + " |")
            if device == "cuda":
                torch.cuda.empty_cache()
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, help="a source checkout of the build to compare with")
    p.add_argument("--after", type=Path, default=ROOT, help="the other checkout (default: this one)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated packages (default: {','.join(OPS)})")
    p.add_argument("--shapes", default="4x4096x16x128",
                   help="comma-separated BxTxHxD or BxTxHxDxHV (default: 4x4096x16x128)")
    p.add_argument("--rounds", type=int, default=3, help="processes per side, alternating (default: 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gate-scale", type=float, default=1.0,
                   help="multiply the per-token log gates, logsigmoid(randn) / 16 (default 1): e.g. 32, about -1.6 "
                        "per token, moves a 64-token chunk's cumulative gate by tens (the strong-gate paths)")
    for side in ("before", "after"):
        p.add_argument(f"--{side}-override", metavar="JSON",
                       help=f"a plan override for the {side} side only ({OVERRIDE_ENV}'s JSON, e.g. "
                            "'{\"fwd_o\": {\"num_warps\": 8}}'): a plan variant against a build")
    p.add_argument("--variants", nargs="+", metavar="JSON",
                   help="plan overrides of this build to time against its own plan, in one process, instead of "
                        "two builds (e.g. '{\"fwd_solve\": {\"num_warps\": 2}}'); --rounds: alternations")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    ops = [o for o in a.ops.split(",") if o]
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    if a.child:
        print(json.dumps(child(ops, shapes, a.seed, a.gate_scale)))
        return 0
    for shape in shapes:
        if len(shape) not in (4, 5):
            p.error(f"--shapes: {'x'.join(map(str, shape))} is not BxTxHxD or BxTxHxDxHV")
    if a.variants:
        if a.before or a.before_override or a.after_override:
            p.error("--variants times this build's plan variants: it takes no --before or --*-override")
        sys.path.insert(0, str(a.after.resolve()))
        from fla_gen.runtime.dispatch import parse_plan_override

        variants = []
        for text in a.variants:
            try:
                variants.append(parse_plan_override(json.loads(text)))
            except json.JSONDecodeError as e:
                p.error(f"--variants: {text!r} is not JSON ({e})")
            except ValueError as e:
                p.error(f"--variants: {e}")
        print("\n".join(time_variants(ops, shapes, variants, a.rounds, a.seed, gate_scale=a.gate_scale)))
        return 0
    if a.before is None:
        p.error("--before is required (or --variants)")
    sides = {"before": a.before.resolve(), "after": a.after.resolve()}
    overrides = {"before": a.before_override, "after": a.after_override}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for r in range(a.rounds):
        for side, root in sides.items():
            env = {**os.environ, "PYTHONPATH": str(root)}
            env.pop(OVERRIDE_ENV, None)
            if overrides[side]:
                env[OVERRIDE_ENV] = overrides[side]
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--before", ".", "--ops", a.ops,
                   "--shapes", a.shapes, "--seed", str(a.seed), "--gate-scale", str(a.gate_scale)]
            run = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
            if run.returncode:
                print(run.stderr[-3000:], file=sys.stderr)
                return 1
            results[side].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {side}: done", file=sys.stderr, flush=True)
    print("\n".join(builds_table(results["before"], results["after"])))
    return 0


def builds_table(before: list[dict], after: list[dict]) -> list[str]:
    """The Markdown table of two builds' rounds (child's dicts, one per process): per op, shape and mode the
    medians, the worst pair of wall times (min over rounds of before / after), and the median kernel times with
    their ratio before / after; then the worst pair over every cell."""
    lines = ["| op | shape | fwd before | fwd after | worst before/after | kernels before -> after | f+b before | "
             "f+b after | worst before/after | kernels before -> after |", "|---|---|---|---|---|---|---|---|---|---|"]
    worst_all = math.inf
    for key in after[0]:
        op, shape = key.split()
        cells = []
        for i in (0, 1):
            walls = [[res[key][i] for res in side] for side in (before, after)]
            worst = min(b / x for b, x in zip(*walls, strict=True))
            worst_all = min(worst_all, worst)
            cells += [f"{statistics.median(walls[0]):.3f}", f"{statistics.median(walls[1]):.3f}", f"{worst:.3f}"]
            kernels = [[res[key][2 + i] for res in side] for side in (before, after)]
            if any(k is None for side in kernels for k in side):
                cells.append("-")
            else:
                k_before, k_after = (statistics.median(side) for side in kernels)
                cells.append(f"{k_before:.3f} -> {k_after:.3f} ({k_before / k_after:.3f})")
        lines.append(f"| {op} | {shape} | " + " | ".join(cells) + " |")
    lines.append(f"worst before/after over every cell and round: {worst_all:.3f}")
    return lines


if __name__ == "__main__":
    sys.exit(main())
