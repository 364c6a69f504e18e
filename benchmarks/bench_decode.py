#!/usr/bin/env python3
"""Decode step bandwidth: fused_recurrent_<op> at T = 1 with the state in and out (issue 7's target:
at least 60% of the copy bandwidth for reading and writing the fp32 state).

    python benchmarks/bench_decode.py [--specs linear_attn,dplr,...] [--B 64 --H 16 --D 128] [--out $OUT/decode.json]

``--specs``: spec file stems under specs/ (default: every spec); each runs its generated
``fused_recurrent_<op>`` with the spec's own inputs (per-head parameters and transforms included).

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
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
import triton  # noqa: E402
from _ops import interleaved_times  # noqa: E402

from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default=",".join(sorted(p.stem for p in (ROOT / "specs").glob("*.fla"))),
                        help="spec file stems under specs/ (default: all)")
    parser.add_argument("--B", type=int, default=64)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="timings per op (the fastest is kept)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    B, H, D = args.B, args.H, args.D
    state = torch.randn(B, H, D, D, device="cuda")
    copy_ms = triton.testing.do_bench(lambda: state.clone(), warmup=25, rep=200, return_mode="median")
    copy_tbs = 2 * state.numel() * 4 / copy_ms / 1e9
    calls = {}
    for stem in args.specs.split(","):
        rec = load_recurrence(ROOT / "specs" / f"{stem}.fla")
        op = rec.spec.op
        fn = getattr(importlib.import_module(f"generated.{rec.spec.package}"), f"fused_recurrent_{op}")
        x = sample_inputs(rec, B, 1, H, D, D, torch.bfloat16, "cuda", seed=0)
        args_ = [x[i.name] for i in rec.spec.inputs]
        h0 = torch.randn(B, H, D, D, device="cuda")

        def call(fn=fn, args_=args_, h0=h0):
            with torch.no_grad():
                return fn(*args_, initial_state=h0, output_final_state=True)

        call()
        moved = 2 * h0.numel() * 4 + sum(t.numel() * t.element_size() for t in args_) + B * H * D * 2
        calls[op] = (call, moved)
    times = interleaved_times(calls, lambda op: triton.testing.do_bench(calls[op][0], warmup=25, rep=200,
                                                                       return_mode="median"), args.rounds)
    rows = []
    for op, (_, moved) in calls.items():
        ms = min(times[op])
        tbs = moved / ms / 1e9
        rows.append({"op": op, "ms": ms, "ms_rounds": times[op], "TB/s": tbs, "fraction_of_copy": tbs / copy_tbs})
    print(f"decode T=1 B={B} H={H} K=V={D} bf16, fp32 state in and out; copy {copy_tbs:.2f} TB/s "
          f"({torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__})")
    print(f"{'op':<22} {'ms':>8} {'TB/s':>6} {'of copy':>8}  rounds (ms)")
    for r in rows:
        spread = " ".join(f"{t:.4f}" for t in r["ms_rounds"])
        print(f"{r['op']:<22} {r['ms']:>8.4f} {r['TB/s']:>6.2f} {r['fraction_of_copy']:>8.0%}  {spread}")
    if args.out:
        args.out.write_text(json.dumps({"copy_tbs": copy_tbs, "B": B, "H": H, "D": D, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
