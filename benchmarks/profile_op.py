#!/usr/bin/env python3
"""Per-kernel GPU time of one generated op, forward and forward+backward (torch.profiler).

    python benchmarks/profile_op.py --op dplr_delta_rule --shape 4x4096x16x128 [--mode chunk]

Prints one row per kernel: calls, total and per-call CUDA time over ``--iters`` repetitions after a
warm-up, so a slow kernel is found by measurement rather than guessed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import _ops  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", required=True, choices=sorted(_ops.OPS))
    p.add_argument("--shape", default="4x4096x16x128")
    p.add_argument("--mode", default="chunk")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--gate-lower-bound", type=float, default=None, help="passed as gate_lower_bound")
    args = p.parse_args()
    op = _ops.OPS[args.op]
    shape = _ops.parse_shape(args.shape)
    fn = _ops.resolve_ours(op, args.mode)
    x = _ops.make_inputs(op, shape, torch.bfloat16, "cuda", seed=0)  # (names, args, kwargs)
    _, leaves, _ = x
    scale = _ops.scale_for(op, shape[3])
    extra = {} if args.gate_lower_bound is None else {"gate_lower_bound": args.gate_lower_bound}

    do = None

    def step():
        nonlocal do
        for t in leaves:  # accumulating into .grad would add one elementwise kernel per input
            if isinstance(t, torch.Tensor):
                t.grad = None
        o, _ = fn(*leaves, scale=scale, **extra)
        do = torch.ones_like(o) if do is None else do
        o.backward(do)

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.iters):
            step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "self_device_time_total", 0) > 0:
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            rows[e.key] = (e.count, t)
    total = sum(t for _, t in rows.values())
    print(f"{args.op} {args.mode} {args.shape} bf16 {extra}: fwd+bwd per iteration {total / args.iters / 1000:.3f} ms")
    for name, (count, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {name[:60]:60s} calls/it {count / args.iters:4.1f}  ms/it {t / args.iters / 1000:8.3f}  "
              f"{100 * t / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
