#!/usr/bin/env python3
"""The decode step of a spec whose transforms run inline (no autograd) at other recurrent_fwd tiles.

    python benchmarks/experiments/s11_decode_transforms/decode_tiles.py [--spec gated_delta_rule_rope] [--out F]

Session 11's ncu run of benchmarks/bench_decode.py: gated_delta_rule_rope's recurrent_fwd took 255 registers
(8 B spilled, `fla-gen aot`) at the plan's [128, 64] state tile on 4 warps, so two programs fit an SM, and the
step reached 48% of the copy bandwidth against 94% for gated_delta_rule without transforms. Here the plan's
recurrent_fwd config is replaced in the imported package (RECURRENT_PLANS) by each variant in turn, and the
decode step (T = 1, B = 64, H = 16, K = V = 128, bf16, fp32 state in and out) is timed, with its outputs checked
against the plan's. With ``--device cpu --dtype float32`` under TRITON_INTERPRET=1 it checks the variants only.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "experiments")]

from _ops import interleaved_times  # noqa: E402
from harness import add_run_options, timer, warm_up_clocks, write_record  # noqa: E402

from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402

VARIANTS = ((64, 4), (32, 4), (16, 4), (64, 8), (32, 8))  # (BV, warps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="gated_delta_rule_rope")
    p.add_argument("--B", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=None, help="BV:warps,... (default: " +
                   ",".join(f"{bv}:{w}" for bv, w in VARIANTS) + ")")
    add_run_options(p)
    args = p.parse_args()
    bench = timer(args)
    variants = (tuple(tuple(int(x) for x in v.split(":")) for v in args.variants.split(","))
                if args.variants else VARIANTS)
    dtype = getattr(torch, args.dtype)
    B, H, D = (args.B, 16, 128) if args.device == "cuda" else (2, 2, 32)
    rec = load_recurrence(ROOT / "specs" / f"{args.spec}.fla")
    module = importlib.import_module(f"generated.{rec.spec.package}.fused_recurrent")
    fn = getattr(module, f"fused_recurrent_{rec.spec.op}")
    x = sample_inputs(rec, B, 1, H, D, D, dtype, args.device, seed=0)
    inputs = [x[i.name] for i in rec.spec.inputs]
    h0 = torch.randn(B, H, D, D, device=args.device)
    moved = 2 * h0.numel() * 4 + sum(t.numel() * t.element_size() for t in inputs) + B * H * D * 2
    plans = module.RECURRENT_PLANS
    original = dict(plans)

    def call():
        with torch.no_grad():
            return fn(*inputs, initial_state=h0, output_final_state=True)

    def use(bv, warps):
        for key, plan in original.items():
            kernels = tuple((s, dataclasses.replace(c, block_v=bv, num_warps=warps) if s == "recurrent_fwd" else c)
                            for s, c in plan.kernels)
            plans[key] = dataclasses.replace(plan, kernels=kernels)

    def measure(v) -> float:
        use(*v)
        return bench(call)

    ref = [t.clone() for t in call()]
    warm_up_clocks(args, bench)
    errs: dict[tuple[int, int], float] = {}
    try:
        for v in variants:
            use(*v)
            errs[v] = max(float((a.float() - b.float()).norm() / b.float().norm())
                          for a, b in zip(call(), ref, strict=True))
        times = interleaved_times(variants, measure, args.rounds)
    finally:
        plans.clear()
        plans.update(original)
    rows = []
    for (bv, warps), ts in times.items():
        ms = min(ts)
        rows.append({"block_v": bv, "num_warps": warps, "ms": ms, "ms_rounds": ts, "tbs": moved / ms / 1e9,
                     "rel_err": errs[(bv, warps)]})
        print(f"BV {bv:3d} warps {warps}: {ms:.4f} ms  {moved / ms / 1e9:.2f} TB/s  rel err vs plan "
              f"{errs[(bv, warps)]:.1e}  rounds {' '.join(f'{t:.4f}' for t in ts)}", flush=True)
    write_record(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
