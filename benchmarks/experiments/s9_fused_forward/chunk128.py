#!/usr/bin/env python3
"""Session 9's experiment: simple_gla's split forward (fwd_h + fwd_o) with 128-token chunks instead of 64, where
the per-chunk states dominate the bytes (head dim 256: a chunk's [K, V] state is 4x its q rows). Calls the
generated chunk_fwd with the plan's chunk_size replaced (no rebuild), dense inputs, no autograd, against the
plan as built; each variant's output against the plan's. Needs a GPU.

    python benchmarks/experiments/s9_fused_forward/chunk128.py --out $OUT/chunk128.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

import torch
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import select_plan  # noqa: E402
from fla_gen.runtime.plan_types import LaunchConfig  # noqa: E402

# (chunk size, {stage: (block_k, block_v, warps, stages)}): the plan's own first, then 128-token chunks
VARIANTS = [
    (64, {}),
    (128, {}),
    (128, {"fwd_o": (64, 64, 8, 2)}),
    (128, {"fwd_o": (64, 32, 4, 2)}),
    (128, {"fwd_o": (64, 64, 8, 2), "fwd_h": (64, 64, 4, 2)}),
    (128, {"fwd_o": (32, 64, 8, 2)}),
]


def with_variant(plan, chunk_size: int, configs: dict) -> object:
    kernels = tuple((name, LaunchConfig(*configs[name], reason="experiment", pinned=True) if name in configs else cfg)
                    for name, cfg in plan.kernels)
    return dataclasses.replace(plan, chunk_size=chunk_size, kernels=kernels)


def forward_of(chunk_fwd, args):
    """chunk_fwd(*args)'s output without autograd: the call that is timed."""
    def forward():
        with torch.no_grad():
            return chunk_fwd(*args)[0]
    return forward


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="2x8192x8x256,1x16384x16x128,4x4096x16x256")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import generated.simple_gla as pkg
    chunk = pkg.chunk
    spec = OPS["simple_gla"]
    launch.fused_walk_block_v = lambda *args: 0  # the split path, as the plan takes it at these shapes
    rows = []
    for shape in a.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        _, (q, k, v, g), _ = make_inputs(spec, (B, T, H, D, D), torch.bfloat16, "cuda", seed=T + D, requires_grad=False)
        scale = scale_for(spec, D)
        plan = select_plan(chunk.CHUNK_PLANS, q.device, q.dtype, D)
        ref = None
        for bt, configs in VARIANTS:
            variant = with_variant(plan, bt, configs)

            forward = forward_of(chunk.chunk_fwd, (q, k, v, g, None, scale, None, False, None, None, None, variant))
            try:
                out = forward()
                ref = out if ref is None else ref
                err = rel_err(out, ref)
                ms = do_bench(forward, warmup=25, rep=200, return_mode="median")
            except Exception as e:  # noqa: BLE001 -- a variant that does not build is a result
                err, ms = float("nan"), float("nan")
                print(f"{shape} BT={bt} {configs}: {type(e).__name__}: {str(e)[:160]}")
            rows.append({"shape": shape, "chunk_size": bt, "configs": {s: list(c) for s, c in configs.items()},
                         "ms": ms, "err_vs_plan": err})
            print(f"{shape:16s} BT={bt:3d} {str(configs):48s} {ms:7.3f} ms  err {err:.1e}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
