#!/usr/bin/env python3
"""Per-kernel GPU time of one generated op, forward and forward+backward (torch.profiler).

    python benchmarks/profile_op.py --op dplr_delta_rule --shape 4x4096x16x128 [--mode chunk]
    python benchmarks/profile_op.py --op delta_rule --shape 2x8192x8x256 --lib fla --fwd-only

Prints one row per kernel: calls, total and per-call CUDA time over ``--iters`` repetitions after a
warm-up, so a slow kernel is found by measurement rather than guessed. ``--lib fla`` profiles
fla-core's function of the same name (its first calls autotune: seed ``TRITON_CACHE_DIR`` with
saved autotune results, see bench_ops.py ``--autotune-cache``), so the two are compared kernel by
kernel; ``--fwd-only`` leaves the backward out.
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
    p.add_argument("--lib", choices=("ours", "fla"), default="ours")
    p.add_argument("--fwd-only", action="store_true", help="profile the forward alone (no backward)")
    args = p.parse_args()
    op = _ops.OPS[args.op]
    shape = _ops.parse_shape(args.shape)
    fn = (_ops.resolve_ours if args.lib == "ours" else _ops.resolve_fla)(op, args.mode)
    x = _ops.make_inputs(op, shape, torch.bfloat16, "cuda", seed=0)  # (names, args, kwargs)
    _, leaves, _ = x
    scale = _ops.scale_for(op, shape[3])
    extra = {} if args.gate_lower_bound is None else {"gate_lower_bound": args.gate_lower_bound}

    step = _ops.op_step(fn, leaves, {"scale": scale, **extra}, args.fwd_only)

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
    what = "fwd" if args.fwd_only else "fwd+bwd"
    print(f"{args.lib} {args.op} {args.mode} {args.shape} bf16 {extra}: {what} per iteration "
          f"{total / args.iters / 1000:.3f} ms")
    for name, (count, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"  {name[:60]:60s} calls/it {count / args.iters:4.1f}  ms/it {t / args.iters / 1000:8.3f}  "
              f"{100 * t / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
