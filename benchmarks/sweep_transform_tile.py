#!/usr/bin/env python3
"""Sweep the launch of the generated transform kernels (rows per program BR, warps) on one GPU.

The transform kernels are memory-bound: each reads its raw rows once and writes the transformed rows
once. This times the forward kernel and the backward kernel of gated_delta_rule_rope's transforms
(rope + l2norm on q, k; sigmoid beta; the A_log / dt_bias gate) for every (BR, warps) pair, against
fla_gen.runtime.launch.row_tile's choice, and prints each one's bandwidth: bytes in + out over the
measured time (triton.testing.do_bench medians).

    python benchmarks/sweep_transform_tile.py [--B 4 --T 4096 --H 16 --D 128] [--out $OUT/transform_tile.json]
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.validate import CallShape  # noqa: E402

OP = "gated_delta_rule_rope"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--rows", default="8,16,32,64", help="BR values")
    parser.add_argument("--warps", default="2,4,8")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "transform_tile.json"
                        if os.environ.get("OUT") else None)
    args = parser.parse_args()
    B, T, H, D = args.B, args.T, args.H, args.D
    module = importlib.import_module(f"generated.{OP}.transforms")
    transforms = getattr(module, f"{OP}_transforms")
    dtype = torch.bfloat16
    q, k = (torch.randn(B, T, H, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    g, beta = (torch.randn(B, T, H, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    A_log, dt_bias = (torch.randn(H, device="cuda", requires_grad=True) for _ in range(2))
    call = CallShape(B=B, T=T, H=H, K=D, V=D, N=B, dtype=dtype, cu_seqlens_cpu=None, HV=H)
    grads = [torch.randn_like(q), torch.randn_like(k), torch.randn(B, T, H, device="cuda"), torch.randn_like(beta)]
    elem = 2
    fwd_bytes = B * T * H * (4 * D * elem + 2 * elem + 4 + elem)  # q, k in and out; g, beta in; g fp32, beta out
    # q, k, g, beta in; their gradients in (g's fp32) and out; A_log / dt_bias partials out (fp32)
    bwd_bytes = B * T * H * (6 * D * elem + 2 * elem + 4 + elem + 2 * elem + 2 * 4)
    # the first row: row_tile's choices, the forward's for both kernels (each direction has its own default)
    default = launch.row_tile(B * T * H, triton.next_power_of_2(D), "fwd")
    backward_default = launch.row_tile(B * T * H, triton.next_power_of_2(D), "bwd")
    print(f"{OP} transforms B={B} T={T} H={H} D={D} bf16 ({torch.cuda.get_device_name()}); row_tile's choice: "
          f"BR={default[0]} warps={default[1]} forward, BR={backward_default[0]} warps={backward_default[1]} "
          f"backward (first row: the forward's for both); fwd moves {fwd_bytes / 1e6:.0f} MB, "
          f"bwd {bwd_bytes / 1e6:.0f} MB")
    print(f"{'BR':>4} {'warps':>5} {'fwd ms':>8} {'GB/s':>6} {'bwd ms':>8} {'GB/s':>6}", flush=True)
    rows = []
    for br, warps in [default, *itertools.product([int(x) for x in args.rows.split(",")],
                                                   [int(x) for x in args.warps.split(",")])]:
        module.row_tile = lambda r, w, direction, br=br, warps=warps: (br, warps)
        try:
            with torch.no_grad():
                fwd = triton.testing.do_bench(lambda: transforms(q, k, g, beta, A_log, dt_bias, call=call),
                                              warmup=10, rep=50, return_mode="median")
            outs = transforms(q, k, g, beta, A_log, dt_bias, call=call)
            total = triton.testing.do_bench(
                lambda: torch.autograd.grad(transforms(q, k, g, beta, A_log, dt_bias, call=call), [q, k, g, beta],
                                            grads), warmup=10, rep=50, return_mode="median")
            del outs
        except Exception as e:  # a config that does not compile (registers) is a result, not a crash
            rows.append({"BR": br, "warps": warps, "error": f"{type(e).__name__}: {str(e)[:120]}"})
            print(f"{br:>4} {warps:>5}  {rows[-1]['error']}", flush=True)
            continue
        bwd = total - fwd
        rows.append({"BR": br, "warps": warps, "fwd_ms": fwd, "bwd_ms": bwd,
                     "fwd_GBps": fwd_bytes / fwd / 1e6, "bwd_GBps": bwd_bytes / bwd / 1e6})
        r = rows[-1]
        print(f"{br:>4} {warps:>5} {fwd:>8.4f} {r['fwd_GBps']:>6.0f} {bwd:>8.4f} {r['bwd_GBps']:>6.0f}", flush=True)
        if args.out:  # after every config, so a time limit keeps what was measured
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"shape": [B, T, H, D], "default": default, "rows": rows}, indent=1))
    module.row_tile = launch.row_tile
    return 0


if __name__ == "__main__":
    sys.exit(main())
