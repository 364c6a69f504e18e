#!/usr/bin/env python3
"""Old against new generated kernels in one process: the A/B that a kernel change needs before it lands.

    git archive HEAD~1 generated | tar -x -C scratch/old      # the generated tree before the change
    python benchmarks/ab_packages.py --old scratch/old --ops rwkv7 --shapes 2x8192x8x256 [--out ab.json]

Times between device calls drift by more than most single-kernel changes are worth (benchmarks/RESULTS.md,
session 7), so a change is judged only against the previous kernels run in the same process, on the same
inputs, interleaved: old, new, old, new, keeping each side's fastest median. Both sides are called through
their public op (``chunk_<op>``), autograd wrapper included, exactly as bench_ops.py calls ours.

The old tree is imported as the package ``ab_old`` (its modules import their plans relatively and the
runtime from ``fla_gen``, which both sides share, so a change to ``fla_gen/runtime`` is not A/B-able here).
A package built from the same spec registers under the same torch op name and would reuse the new one's
op (fla_gen/runtime/torch_op.py define_op); the old side is therefore registered under a suffixed name.

Also printed: the relative norm error between the two sides' o and input gradients (the change should not
move them beyond bf16 rounding).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import _ops  # noqa: E402


def import_old_tree(root: Path, package: str):
    """Import ``<root>/generated/<package>`` as ``ab_old.<package>``, its torch ops registered apart."""
    from fla_gen.runtime import torch_op

    if "ab_old" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "ab_old", root / "generated" / "__init__.py", submodule_search_locations=[str(root / "generated")])
        if spec is None or spec.loader is None:
            raise ImportError(f"{root}/generated is not a generated tree")
        mod = importlib.util.module_from_spec(spec)
        sys.modules["ab_old"] = mod
        spec.loader.exec_module(mod)
    registered = dict(torch_op._REGISTERED)
    # a different hash for every known name, so define_op registers the old side as <name>_<hash>
    torch_op._REGISTERED.update({n: ("ab-old", fn) for n, (_, fn) in registered.items()})
    try:
        return importlib.import_module(f"ab_old.{package}")
    finally:
        for n, entry in registered.items():
            torch_op._REGISTERED[n] = entry


def public_chunk_op(module, op: _ops.OpSpec):
    """The package's ``chunk_<op>`` function (fla argument order)."""
    for name in (f"chunk_{op.suffix}", f"chunk_{op.name}"):
        if hasattr(module, name):
            return getattr(module, name)
    raise ImportError(f"{module.__name__} has no chunk_{op.suffix}")


def run_side(fn, args, kwargs, scale, do):
    """o and the input gradients of one forward+backward."""
    for a in args:
        a.grad = None
    o, _ = fn(*args, scale=scale, **kwargs)
    o.backward(do)
    return [o.detach().clone()] + [a.grad.detach().clone() for a in args]


def time_sides(sides: dict, args, kwargs, scale, do, rounds: int) -> dict[str, float]:
    """``<side>_fwd`` / ``<side>_fwdbwd`` ms per side: sides interleaved ``rounds`` times, each keeping its
    fastest do_bench median (forward under no_grad; forward+backward with the inputs' grads reset)."""
    from triton.testing import do_bench

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(*args, scale=scale, **kwargs)
        return run

    def forward_backward(fn):
        def run():
            o, _ = fn(*args, scale=scale, **kwargs)
            o.backward(do)
        return run

    best: dict[str, float] = {}
    for _ in range(rounds):
        for side, fn in sides.items():
            for mode, make in (("fwd", forward), ("fwdbwd", forward_backward)):
                ms = float(do_bench(make(fn), warmup=25, rep=100, grad_to_none=args, return_mode="median"))
                best[f"{side}_{mode}"] = min(best.get(f"{side}_{mode}", float("inf")), ms)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--old", required=True, type=Path, help="directory holding the old generated/ tree")
    p.add_argument("--ops", required=True, help="comma-separated op names (benchmarks/_ops.py OPS)")
    p.add_argument("--shapes", default="issue7", help="BxTxHxD list or preset (default: issue7)")
    p.add_argument("--rounds", type=int, default=2, help="old/new alternations; each side keeps its min")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write the rows as JSON here")
    a = p.parse_args()

    device = "cuda"
    rows = []
    for name in _ops.parse_ops(a.ops):
        op = _ops.OPS[name]
        pkg = next(p for p in op.packages or (op.name,) if importlib.util.find_spec(f"generated.{p}"))
        new_fn = public_chunk_op(importlib.import_module(f"generated.{pkg}"), op)
        old_fn = public_chunk_op(import_old_tree(a.old.resolve(), pkg), op)
        for shape in _ops.parse_shapes(a.shapes):
            B, T, H, K, V = shape
            _, args, kwargs = _ops.make_inputs(op, shape, torch.bfloat16, device, _ops.seed_for(a.seed, name, shape))
            scale = _ops.scale_for(op, K)
            do = torch.randn(B, T, H, V, device=device, dtype=torch.bfloat16)
            outs = {side: run_side(fn, args, kwargs, scale, do) for side, fn in (("old", old_fn), ("new", new_fn))}
            errs = [_ops.rel_err(n, o) for n, o in zip(outs["new"], outs["old"], strict=True)]
            del outs

            best = time_sides({"old": old_fn, "new": new_fn}, args, kwargs, scale, do, a.rounds)
            row = {"op": name, "shape": _ops.shape_str(shape), **best, "max_rel_err_new_vs_old": max(errs)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del args, kwargs, do
            torch.cuda.empty_cache()

    lines = [f"A/B in one process ({torch.cuda.get_device_name()}, torch {torch.__version__}), bf16, ms "
             f"(min over {a.rounds} rounds of do_bench medians); old/new > 1: the change is faster",
             "| op | shape | fwd old | fwd new | old/new | f+b old | f+b new | old/new | max rel err new vs old |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['old_fwd']:.3f} | {r['new_fwd']:.3f} | "
                     f"{r['old_fwd'] / r['new_fwd']:.3f} | {r['old_fwdbwd']:.3f} | {r['new_fwdbwd']:.3f} | "
                     f"{r['old_fwdbwd'] / r['new_fwdbwd']:.3f} | {r['max_rel_err_new_vs_old']:.1e} |")
    print("\n".join(lines))
    _ops.write_json(a.out, {"rows": rows, "table": lines})
    return 0


if __name__ == "__main__":
    sys.exit(main())
