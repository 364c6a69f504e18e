#!/usr/bin/env python3
"""The decode step with transforms: inline in the recurrent kernel (the no-autograd path) against the generated
transform pass followed by the same kernel without them.

    python benchmarks/experiments/s11_decode_transforms/decode_pass.py [--out F]

gated_delta_rule_rope at T = 1, H = 16, K = V = 128, bf16, fp32 state in and out, B in (1, 8, 64). Session 11
measured its inline path at 48% of the copy bandwidth (ncu: latency-bound, 255 registers) against 94% for
gated_delta_rule; other recurrent_fwd tiles did not move it (decode_tiles.py). The pass computes the rotary
angles once per token for all heads and hands the kernel plain rows; every V block of the inline kernel redoes
the transforms of its row. Both paths' outputs are compared. With ``--device cpu --dtype float32`` under
TRITON_INTERPRET=1 it checks the two paths agree.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "benchmarks" / "experiments")]

from _ops import interleaved_times  # noqa: E402
from harness import add_run_options, timer, warm_up_clocks, write_record  # noqa: E402

import generated.gated_delta_rule_rope.fused_recurrent as fr  # noqa: E402
from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.runtime.dispatch import select_plan  # noqa: E402
from fla_gen.runtime.validate import validate_call  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402


def measure(B: int, rec, args: argparse.Namespace, bench, dtype: torch.dtype, H: int, D: int) -> dict:
    """One batch size: both paths' outputs compared, then timed interleaved; the row."""
    x = sample_inputs(rec, B, 1, H, D, D, dtype, args.device, seed=0)
    q, k, v, g, beta, A_log, dt_bias = (x[i.name] for i in rec.spec.inputs)
    h0 = torch.randn(B, H, D, D, device=args.device)
    call = validate_call("decode_pass", fr._ARGS, (q, k, v, g, beta, A_log, dt_bias), params=(("scale", None),),
                         initial_state=h0, output_final_state=True, cu_seqlens=None, cu_seqlens_cpu=None)
    plan = select_plan(fr.RECURRENT_PLANS, q.device, q.dtype, D)
    scale = D ** -0.5

    def inline():
        with torch.no_grad():
            return fr.fused_recurrent_gated_delta_rule_rope(q, k, v, g, beta, A_log, dt_bias, scale=scale,
                                                            initial_state=h0, output_final_state=True)

    def pass_then_kernel():
        with torch.no_grad():
            q2, k2, g2, b2 = fr.gated_delta_rule_rope_transforms(q, k, g, beta, A_log, dt_bias, call=call)
            o, ht, _ = fr.fused_recurrent_fwd(q2, k2, v, g2, b2, scale, h0, True, None, plan)
            return o, ht

    a_out, b_out = inline(), pass_then_kernel()
    err = max(float((a.float() - b.float()).norm() / b.float().norm()) for a, b in zip(a_out, b_out, strict=True))
    paths = {"inline": inline, "pass": pass_then_kernel}
    times = interleaved_times(paths, lambda name: bench(paths[name]), args.rounds)
    moved = 2 * h0.numel() * 4 + sum(t.numel() * t.element_size() for t in (q, k, v, g, beta)) + B * H * D * 2
    row = {"B": B, "rel_err": err, **{f"{n}_ms": min(t) for n, t in times.items()},
           **{f"{n}_rounds": t for n, t in times.items()}, "bytes": moved}
    print(f"B {B:3d}: inline {row['inline_ms']:.4f} ms, pass + kernel {row['pass_ms']:.4f} ms "
          f"({moved / row['pass_ms'] / 1e9:.2f} vs {moved / row['inline_ms'] / 1e9:.2f} TB/s); rel err {err:.1e}; "
          f"rounds {times}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--rounds", type=int, default=3)
    add_run_options(p)
    args = p.parse_args()
    bench = timer(args)
    dtype = getattr(torch, args.dtype)
    H, D = (16, 128) if args.device == "cuda" else (2, 32)
    rec = load_recurrence(ROOT / "specs" / "gated_delta_rule_rope.fla")
    warm_up_clocks(args, bench)
    rows = [measure(int(b), rec, args, bench, dtype, H, D) for b in args.batches.split(",")]
    write_record(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
