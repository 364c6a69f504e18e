#!/usr/bin/env python3
"""One forward of linear_attn and one of simple_gla at 4x4096x16x128 (bf16, the planner's fwd_fused), for
`ncu --kernel-name regex:fwd_fused` to read the walk's stall reasons with and without a gate. Needs a GPU.

    ncu --clock-control none --kernel-name regex:fwd_fused --section WarpStateStats --section SchedulerStats \
        python benchmarks/experiments/s9_fused_forward/profile_fused.py
"""

from __future__ import annotations

import importlib
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, scale_for  # noqa: E402

for name in ("linear_attn", "simple_gla"):
    fn = getattr(importlib.import_module(f"generated.{name}"), f"chunk_{name}")
    _, args, _ = make_inputs(OPS[name], (4, 4096, 16, 128, 128), torch.bfloat16, "cuda", seed=1, requires_grad=False)
    with torch.no_grad():
        fn(*args, scale=scale_for(OPS[name], 128))
    torch.cuda.synchronize()
