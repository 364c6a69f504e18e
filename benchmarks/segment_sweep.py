"""Time a chunk op with its sequences split into segments of each given length against the whole walk, on one
GPU, in one process: the measurement behind an algorithm's SegmentRule (fla_gen/plan.py, fla_gen/runtime/segments.py).

    python benchmarks/segment_sweep.py --ops gated_delta_rule --shapes 1x16384x16x128 --chunks 0,8,16,32
    python benchmarks/segment_sweep.py --ops kda --shapes 1x65536x16x128 --chunks 0,16,64 --backward --check

For each (op, shape), every segment length (``--chunks``: chunks per segment, 0 = the whole walk) is timed
``--rounds`` times, the order reversed every other round (benchmarks/_ops.py interleaved_times), with inputs
that take gradients (the autograd path, as benchmarks/run.py times a forward). A setting's ratio is the worst
round's whole-walk time over its own: above 1, the split is faster in every round. ``rule`` marks the length the
op's own rule picks on this GPU (0: it walks whole). ``--check`` compares o and the final state of every
setting against the float64 reference (bf16 inputs upcast, with an initial state 0.1 * randn), and with
``--backward`` every input gradient against the first setting's (the whole walk's with 0 first). ``--fla`` times
fla-core's chunk function in the same rounds. Inputs: benchmarks/_ops.py make_inputs (gates in fp32, as
benchmarks/run.py passes them); the timed calls pass no initial state.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _autotune import add_autotune_picks_argument, use_autotune_picks  # noqa: E402
from _ops import (  # noqa: E402
    OPS,
    interleaved_times,
    make_inputs,
    parse_ops,
    parse_shapes,
    rel_err,
    resolve_fla,
    resolve_ours,
    scale_for,
)


def _rule_chunks(op_name: str, shape, dtype: torch.dtype) -> int:
    """The segment length the op's own rule picks for a dense call of ``shape`` in ``dtype`` on this GPU (0: whole
    walk), read from the generated package (its SEGMENT_RULE, and its plan's chunk size: the device needs no
    compiler)."""
    from fla_gen.runtime import launch, segments
    from fla_gen.runtime.dispatch import select_plan

    pkg = next(p for p in OPS[op_name].packages or (op_name,) if importlib.util.find_spec(f"generated.{p}"))
    module = importlib.import_module(f"generated.{pkg}.chunk")
    rule = getattr(module, "SEGMENT_RULE", None)
    if rule is None:
        return 0
    B, T, H, K, V = shape
    device = torch.device("cuda")
    nt = launch.cdiv(T, select_plan(module.CHUNK_PLANS, device, dtype, max(K, V)).chunk_size)
    return segments.plan_segment_chunks(B * nt, nt, B * H, H, K, V, launch.sm_count(device), rule)


def sweep(op_name: str, shape, chunk_settings: list[int], rounds: int, quick: bool, backward: bool,
          check: bool, with_fla: bool, seed: int) -> dict:
    """Times (and errors) of every segment length, and of fla-core with ``with_fla``, for one op and shape."""
    import triton

    from fla_gen.runtime.segments import forced_segment_chunks

    op = OPS[op_name]
    ours = resolve_ours(op, "chunk")
    _, args, kwargs = make_inputs(op, shape, torch.bfloat16, "cuda", seed, gate_dtype=torch.float32)
    B, T, H, K, V = shape
    call = dict(kwargs, scale=scale_for(op, K))
    do = torch.randn(B, T, H, V, device="cuda", dtype=torch.bfloat16)
    warmup, rep = (5, 20) if quick else (25, 100)
    libs = {"ours": ours, **({"fla": resolve_fla(op, "chunk")} if with_fla else {})}

    def step(fn, kind):
        def forward():
            return fn(*args, **call)

        def forward_backward():
            for t in args:
                t.grad = None
            fn(*args, **call)[0].backward(do)

        return forward if kind == "fwd" else forward_backward

    out: dict = {"op": op_name, "shape": "x".join(map(str, shape)),
                 "rule_chunks": _rule_chunks(op_name, shape, torch.bfloat16)}
    names = [*chunk_settings, *(["fla"] if with_fla else [])]
    for kind in ("fwd", "fwdbwd") if backward else ("fwd",):
        failed: set = set()

        def measure(name, kind=kind, failed=failed):
            if name in failed:
                return float("nan")
            fn = step(libs["fla" if name == "fla" else "ours"], kind)
            try:
                with forced_segment_chunks(0 if name == "fla" else name):
                    return triton.testing.do_bench(fn, warmup=warmup, rep=rep)
            except Exception as e:  # fla-core refuses its gated backward on Hopper with Triton 3.6: say so
                failed.add(name)
                out.setdefault(str(name), {})[f"{kind}_error"] = f"{type(e).__name__}: {str(e)[:160]}"
                return float("nan")

        times = interleaved_times(names, measure, rounds)
        for name, ms in times.items():
            row = out.setdefault(str(name), {})
            row[f"{kind}_rounds_ms"] = ms
            for base, key in ((0, "whole_over_split"), ("fla", "fla_over_ours")):
                if base in times and name not in (base, "fla"):
                    row[f"{kind}_{key}_worst"] = min(b / m for b, m in zip(times[base], ms, strict=True))
    if check:
        h0 = 0.1 * torch.randn(B, H, K, V, device="cuda")
        reference = resolve_ours(op, "reference")
        with torch.no_grad():
            o_ref, s_ref = reference(*(a.detach().double() for a in args), scale=scale_for(op, K),
                                     initial_state=h0.double(), output_final_state=True,
                                     **{n: t.double() for n, t in kwargs.items()})
        grads_whole = None
        for chunks in chunk_settings:
            leaves = [a.detach().clone().requires_grad_(True) for a in args]
            state = h0.clone().requires_grad_(backward)
            with forced_segment_chunks(chunks):
                o, s = ours(*leaves, **call, initial_state=state, output_final_state=True)
                row = out[str(chunks)]
                row["o_err"], row["final_state_err"] = rel_err(o, o_ref), rel_err(s, s_ref)
                if backward:
                    o.backward(do)
                    grads = [t.grad for t in (*leaves, state)]
                    if grads_whole is None:
                        grads_whole = grads
                    else:
                        row["grad_diff_from_first"] = max(rel_err(g, w)
                                                          for g, w in zip(grads, grads_whole, strict=True))
        del o_ref, s_ref
    torch.cuda.empty_cache()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="gated_delta_rule", help="comma-separated chunk ops (default gated_delta_rule)")
    p.add_argument("--shapes", default="1x16384x16x128", help="comma-separated BxTxHxD (default 1x16384x16x128)")
    p.add_argument("--chunks", default="0,8,16,32",
                   help="comma-separated chunks per segment; 0 is the whole walk (default 0,8,16,32)")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    p.add_argument("--quick", action="store_true", help="shorter do_bench warm-up and repetitions")
    p.add_argument("--backward", action="store_true", help="also time one forward and backward")
    p.add_argument("--check", action="store_true",
                   help="o and the final state against the float64 reference (and gradients against the whole walk)")
    p.add_argument("--fla", action="store_true",
                   help="time fla-core's chunk function too, in the same rounds (its ratio: fla / ours, worst round)")
    add_autotune_picks_argument(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = p.parse_args()
    ops = parse_ops(a.ops)
    try:
        shapes = parse_shapes(a.shapes)
    except ValueError as e:
        p.error(f"--shapes: {e}")
    try:
        chunk_settings = [int(c) for c in a.chunks.split(",") if c]
    except ValueError:
        chunk_settings = []
    if not chunk_settings or any(c < 0 for c in chunk_settings):
        p.error(f"--chunks: expected comma-separated counts >= 0, got {a.chunks!r}")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if not torch.cuda.is_available():
        print("segment_sweep.py times kernels on a GPU: no CUDA device here", file=sys.stderr)
        return 2
    # the swept shapes name the picks (fla's autotune keys leave B and T out: benchmarks/_autotune.py)
    use_autotune_picks(a.autotune_picks, f"segment_sweep-{a.shapes}")
    results = []
    for op_name in ops:
        for shape in shapes:
            results.append(sweep(op_name, shape, chunk_settings, a.rounds, a.quick, a.backward, a.check, a.fla,
                                 a.seed))
            print(json.dumps(results[-1]), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
