#!/usr/bin/env python3
"""Session 9's experiment: the scalar-gate family's forward as one walk that also writes the outputs
(fwd_fused) against the state walk + chunk-parallel output kernel (fwd_h + fwd_o), through the public ops,
in one process, on the same inputs (benchmarks/RESULTS.md, session 9).

    python benchmarks/experiments/s9_fused_forward/fused_forward.py --out $OUT/fused_forward.json

For each op and shape: the forward (no autograd) on the split path (launch.fused_walk_block_v forced to 0),
then fwd_fused at each (BV, warps, stages) of CONFIGS (a pinned plan override, so the launcher takes it
whatever the grid), each checked against the split path's output. Prints a table of do_bench medians and
the fused/split ratio, with the grid's program count (V / BV * B * H) on the H100's SMs. Needs a GPU.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import torch
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import overridden_plans  # noqa: E402

# head dim -> (BV, warps, stages): the variants that compile without spills on sm90 (fla-gen aot, session 9),
# less one stage: with a gate, [128, 32] on 4 warps at 1 stage faults (illegal address) on the H100 under
# Triton 3.6 (check_variant.py, dev_isolate.sh); the 2- and 3-stage builds of the same tiles are exact.
CONFIGS = {
    64: [(64, 4, 2), (64, 4, 3), (64, 8, 2), (32, 4, 2), (32, 4, 3), (32, 8, 2)],
    128: [(32, 4, 2), (32, 4, 3), (32, 8, 2), (32, 8, 3), (64, 4, 2), (64, 4, 3), (64, 8, 2), (64, 8, 3),
          (128, 8, 3)],
    256: [(32, 4, 3), (32, 8, 2), (32, 8, 3)],
}
SHAPES = [(4, 4096, 16, 128), (8, 2048, 32, 64), (1, 16384, 16, 128), (2, 8192, 8, 256),
          (2, 4096, 16, 128), (3, 4096, 16, 128), (1, 8192, 32, 128), (8, 2048, 16, 128)]


def forward_of(fn, args, scale):
    """The op's forward on fixed inputs, without autograd: the call that is timed."""
    def forward():
        with torch.no_grad():
            return fn(*args, scale=scale)[0]
    return forward


def autograd_forward_of(fn, args, scale):
    """The same forward on leaves that take gradients (what a training step runs, and bench_ops times)."""
    leaves = [a.detach().requires_grad_(True) for a in args]

    def forward():
        return fn(*leaves, scale=scale)[0]
    return forward


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="linear_attn,simple_gla")
    p.add_argument("--shapes", default=None, help="BxTxHxD,... (default: SHAPES)")
    p.add_argument("--out", default=None)
    p.add_argument("--configs", default=None, help="BV,warps,stages;... for every head dim (default: CONFIGS)")
    a = p.parse_args()
    shapes = SHAPES if a.shapes is None else [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in a.ops.split(","):
        spec = OPS[name]
        fn = getattr(importlib.import_module(f"generated.{name}"), f"chunk_{name}")
        for B, T, H, D in shapes:
            _, args, _ = make_inputs(spec, (B, T, H, D, D), torch.bfloat16, "cuda", seed=B * T + H + D,
                                     requires_grad=False)
            forward = forward_of(fn, args, scale_for(spec, D))
            real = launch.fused_walk_block_v
            launch.fused_walk_block_v = lambda *args: 0
            try:
                ref = forward()
                split = median_ms(forward)
            finally:
                launch.fused_walk_block_v = real
            default = median_ms(forward)
            default_grad = median_ms(autograd_forward_of(fn, args, scale_for(spec, D)))
            row = {"op": name, "shape": f"{B}x{T}x{H}x{D}", "split_ms": split, "default_ms": default,
                   "default_grad_ms": default_grad, "fused": []}
            configs = CONFIGS[D] if a.configs is None else [tuple(int(x) for x in c.split(","))
                                                            for c in a.configs.split(";")]
            for bv, w, st in configs:
                with overridden_plans({"fwd_fused": {"block_v": bv, "num_warps": w, "num_stages": st}}):
                    try:
                        err = rel_err(forward(), ref)
                        ms = median_ms(forward)
                    except Exception as e:  # a variant that fails to compile is a result, not a crash
                        err, ms = float("nan"), float("nan")
                        print(f"{name} {B}x{T}x{H}x{D} {bv},{w},{st}: {type(e).__name__}: {str(e)[:200]}")
                programs = (D // bv) * B * H
                row["fused"].append({"bv": bv, "warps": w, "stages": st, "ms": ms, "err": err,
                                     "programs": programs})
            rows.append(row)
            best = min(row["fused"], key=lambda r: r["ms"] if r["ms"] == r["ms"] else 1e9)
            print(f"{name:12s} {row['shape']:16s} split {split:.3f} default {default:.3f} (with autograd "
                  f"{default_grad:.3f}) best fused {best['ms']:.3f} "
                  f"({best['bv']},{best['warps']},{best['stages']}, {best['programs']} programs) "
                  f"ratio {split / best['ms']:.2f}", flush=True)
            if a.out:
                with open(a.out, "w") as f:
                    json.dump({"device": torch.cuda.get_device_name(0), "sms": sms, "torch": torch.__version__,
                               "rows": rows}, f, indent=1)
    print(f"\n{'op':12s} {'shape':16s} {'split':>7s} " + "  ".join(f"{'cfg':>9s} {'ms':>6s} {'x':>5s} {'err':>7s}"
                                                                    for _ in range(1)))
    for row in rows:
        for r in row["fused"]:
            print(f"{row['op']:12s} {row['shape']:16s} {row['split_ms']:7.3f} {r['bv']:>3d},{r['warps']},{r['stages']}"
                  f"({r['programs']:4d}) {r['ms']:6.3f} {row['split_ms'] / r['ms']:5.2f} {r['err']:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
