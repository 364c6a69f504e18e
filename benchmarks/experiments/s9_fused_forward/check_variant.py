#!/usr/bin/env python3
"""One fwd_fused config of one op at one shape, in a process of its own (a fault cannot spoil the next
run): its forward against the split path's (fwd_h + fwd_o), bf16, CUDA_LAUNCH_BLOCKING advised.

    python benchmarks/experiments/s9_fused_forward/check_variant.py simple_gla 4x4096x16x128 32,4,1
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import overridden_plans  # noqa: E402


def main() -> int:
    name, shape, cfg = sys.argv[1:4]
    B, T, H, D = (int(x) for x in shape.split("x"))
    bv, w, st = (int(x) for x in cfg.split(","))
    spec = OPS[name]
    fn = getattr(importlib.import_module(f"generated.{name}"), f"chunk_{name}")
    _, args, _ = make_inputs(spec, (B, T, H, D, D), torch.bfloat16, "cuda", seed=7, requires_grad=False)
    scale = scale_for(spec, D)
    real = launch.fused_walk_block_v
    launch.fused_walk_block_v = lambda *args: 0
    with torch.no_grad():
        ref = fn(*args, scale=scale)[0]
    launch.fused_walk_block_v = real
    torch.cuda.synchronize()
    try:
        with torch.no_grad(), overridden_plans({"fwd_fused": {"block_v": bv, "num_warps": w, "num_stages": st}}):
            out = fn(*args, scale=scale)[0]
        torch.cuda.synchronize()
        print(f"{name} {shape} {cfg}: ok, error against the split path {rel_err(out, ref):.2e}")
    except Exception as e:  # noqa: BLE001 -- the fault is the result
        print(f"{name} {shape} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
