#!/usr/bin/env python3
"""Decode step bandwidth: fused_recurrent_<op> at T = 1 with the state in and out (issue 7's target:
at least 60% of the copy bandwidth for reading and writing the fp32 state).

    python benchmarks/bench_decode.py [--ops linear_attn,simple_gla,gla,delta_rule,gated_delta_rule]
                                      [--B 64 --H 16 --D 128] [--out $OUT/decode.json]

Bytes counted: the fp32 state read once and written once, plus the token's inputs and output.
Bandwidth reference: a device-to-device copy of the state in the same run (bytes read + written).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402

from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="linear_attn,simple_gla,gla,delta_rule,gated_delta_rule")
    parser.add_argument("--B", type=int, default=64)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    B, H, D = args.B, args.H, args.D
    state = torch.randn(B, H, D, D, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: state.clone(), warmup=25, rep=200, return_mode="median")
    copy_tbs = 2 * state.numel() * 4 / copy_ms / 1e9
    rows = []
    for op in args.ops.split(","):
        rec = load_recurrence(ROOT / "specs" / f"{op}.fla")
        fn = getattr(importlib.import_module(f"generated.{op}"), f"fused_recurrent_{op}")
        x = sample_inputs(rec, B, 1, H, D, D, torch.bfloat16, "cuda", seed=0)
        args_ = [x[i.name] for i in rec.spec.inputs]
        h0 = torch.randn(B, H, D, D, device="cuda")
        with torch.no_grad():
            def call(fn=fn, args_=args_, h0=h0):
                return fn(*args_, initial_state=h0, output_final_state=True)

            call()
            ms = triton.testing.do_bench(call, warmup=25, rep=200, return_mode="median")
        moved = 2 * h0.numel() * 4 + sum(t.numel() * t.element_size() for t in args_) + B * H * D * 2
        tbs = moved / ms / 1e9
        rows.append({"op": op, "ms": ms, "TB/s": tbs, "fraction_of_copy": tbs / copy_tbs})
    print(f"decode T=1 B={B} H={H} K=V={D} bf16, fp32 state in and out; copy {copy_tbs:.2f} TB/s "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__})")
    print(f"{'op':<18} {'ms':>8} {'TB/s':>6} {'of copy':>8}")
    for r in rows:
        print(f"{r['op']:<18} {r['ms']:>8.4f} {r['TB/s']:>6.2f} {r['fraction_of_copy']:>8.0%}")
    if args.out:
        args.out.write_text(json.dumps({"copy_tbs": copy_tbs, "B": B, "H": H, "D": D, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
