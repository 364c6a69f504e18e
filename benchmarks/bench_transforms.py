#!/usr/bin/env python3
"""Fused transforms: chunk_gated_delta_rule_rope (rope + l2norm on q, k; sigmoid beta; the A_log/dt_bias
gate, in the generated transform kernels) against the same transforms in torch, then the plain
chunk_gated_delta_rule. bf16 correctness against the float64 reference on a short slice, then the
time of forward and forward + backward of both (triton.testing.do_bench medians).

    python benchmarks/bench_transforms.py [--B 4 --T 4096 --H 16 --D 128] [--out $OUT/transforms.json]

The reference check runs on the first sequence's first --check-T tokens (the step-by-step reference is
slow at T = 4096); the timing runs at the full size. Then a decode step (T = 1, no autograd), where
fused_recurrent applies the transforms inside its own kernel.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402

from fla_gen.cli import load_recurrence  # noqa: E402
from fla_gen.runtime.rotary import rope_positions, rope_reference  # noqa: E402
from fla_gen.runtime.validate import CallShape  # noqa: E402
from fla_gen.sample import relative_error, sample_inputs  # noqa: E402
from fla_gen.verify import TOLERANCE, compare_with_reference  # noqa: E402

OP = "gated_delta_rule_rope"


def torch_transforms(q, k, v, g, beta, A_log, dt_bias):
    """The spec's transforms as separate torch ops (what a model does without fusion)."""
    B, T = q.shape[:2]
    pos = rope_positions(B, T, 0, None, q.device)
    q, k = (rope_reference(t.float(), pos, t.shape[-1], 10000.0, False) for t in (q, k))
    q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))  # the spec's l2norm
    q, k = q.to(v.dtype), k.to(v.dtype)
    g = -A_log.float().exp() * F.softplus(g.float() + dt_bias.float())
    return q, k, v, g, beta.sigmoid()


def median_ms(fn, device: str, warmup: int = 10, rep: int = 100, **kwargs) -> float:
    """triton.testing.do_bench's median on a GPU; one timed call elsewhere (a smoke run)."""
    if device == "cuda":
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median", **kwargs)
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--check-T", type=int, default=256)
    parser.add_argument("--decode-B", type=int, default=64)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"),
                        help="fp16 for an interpreter smoke run (the interpreter has no bf16 arithmetic)")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (with TRITON_INTERPRET=1) for a smoke run")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "transforms.json"
                        if os.environ.get("OUT") else None)
    args = parser.parse_args()
    B, T, H, D = args.B, args.T, args.H, args.D
    fused_pkg = importlib.import_module(f"generated.{OP}")
    plain = importlib.import_module("generated.gated_delta_rule").chunk_gated_delta_rule
    fused = getattr(fused_pkg, f"chunk_{OP}")
    rec = load_recurrence(ROOT / "specs" / f"{OP}.fla")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]

    # bf16 correctness of the fused op on a slice, against the float64 reference.
    x = sample_inputs(rec, 1, args.check_T, H, D, D, dtype, args.device, seed=0)
    check = compare_with_reference(fused, getattr(fused_pkg, f"{OP}_reference"), x, dtype, name=f"chunk_{OP}")
    errors, failures = dict(check.errors), check.failures()
    tol_fwd = TOLERANCE[dtype][0]

    # Timing at full size.
    x = sample_inputs(rec, B, T, H, D, D, dtype, args.device, seed=1)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    names = list(leaves)

    def run_fused(backward: bool):
        o, _ = fused(*[leaves[n] for n in names])
        if backward:
            o.backward(do_full)

    def run_unfused(backward: bool):
        o, _ = plain(*torch_transforms(*[leaves[n] for n in names]))
        if backward:
            o.backward(do_full)

    # The floor of any fusion: the plain op on inputs transformed beforehand (transforms cost nothing).
    with torch.no_grad():
        pre = {n: t.detach().clone().requires_grad_(True)
               for n, t in zip(("q", "k", "v", "g", "beta"), torch_transforms(*[leaves[n] for n in names]),
                               strict=True)}

    def run_pretransformed(backward: bool):
        o, _ = plain(*pre.values())
        if backward:
            o.backward(do_full)

    do_full = torch.randn(B, T, H, D, device=args.device, dtype=dtype)
    rows = []
    for label, fn in (("fused", run_fused), ("torch transforms + op", run_unfused),
                      ("op alone (pre-transformed)", run_pretransformed)):
        row = {"variant": label}
        for mode, bwd in (("fwd", False), ("fwd+bwd", True)):
            if not bwd:
                with torch.no_grad():
                    row[f"{mode}_ms"] = median_ms(lambda fn=fn: fn(False), args.device)
            else:
                grad_to_none = {"grad_to_none": list(leaves.values())} if args.device == "cuda" else {}
                row[f"{mode}_ms"] = median_ms(lambda fn=fn: fn(True), args.device, **grad_to_none)
        rows.append(row)
    # The transforms alone: what fusion saves is the gap between these two lines.
    transforms = getattr(importlib.import_module(f"generated.{OP}.transforms"), f"{OP}_transforms")
    call = CallShape(B=B, T=T, H=H, K=D, V=D, N=B, dtype=dtype, cu_seqlens_cpu=None, HV=H)
    with torch.no_grad():
        t_torch = median_ms(lambda: torch_transforms(*[leaves[n] for n in names]), args.device)
        t_kernel = median_ms(lambda: transforms(*[leaves[n] for n in ("q", "k", "g", "beta", "A_log", "dt_bias")],
                                                call=call), args.device)
        # full-size agreement of the transform kernels with the same transforms in fp32 torch
        mine = transforms(*[leaves[n] for n in ("q", "k", "g", "beta", "A_log", "dt_bias")], call=call)
        ref32 = torch_transforms(*[leaves[n].float() for n in names])
        ref32 = dict(zip(("q", "k", "v", "g", "beta"), ref32, strict=True))
        full = {f"full {n}": relative_error(a, ref32[n]) for n, a in zip(("q", "k", "g", "beta"), mine, strict=True)}
        errors.update(full)
        failures.update({k: e for k, e in full.items() if not e <= tol_fwd})
    # bytes the transform kernels must move: q, k read and written; g, beta read; g (fp32) and beta written
    elem = torch.finfo(dtype).bits // 8
    moved = B * T * H * (4 * D * elem + 2 * elem + 4 + elem)

    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    # Decode step (T = 1, state in and out, no autograd): fused_recurrent applies the transforms inside its
    # kernel, against torch transforms then the plain fused_recurrent op.
    dec_B = args.decode_B
    xd = sample_inputs(rec, dec_B, 1, H, D, D, dtype, args.device, seed=2)
    dec_args = [xd[n] for n in names]
    h0 = torch.randn(dec_B, H, D, D, device=args.device)
    fused_rec = getattr(fused_pkg, f"fused_recurrent_{OP}")
    plain_rec = importlib.import_module("generated.gated_delta_rule").fused_recurrent_gated_delta_rule
    with torch.no_grad():
        decode = {
            "fused (transforms in the kernel)": median_ms(
                lambda: fused_rec(*dec_args, initial_state=h0, output_final_state=True), args.device),
            "torch transforms + op": median_ms(
                lambda: plain_rec(*torch_transforms(*dec_args), initial_state=h0, output_final_state=True),
                args.device),
        }

    print(f"{OP} B={B} T={T} H={H} K=V={D} {args.dtype} ({device}, torch {torch.__version__}, "
          f"triton {triton.__version__})")
    print(f"{args.dtype} vs float64 reference (first {args.check_T} tokens): "
          + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()) + ("  FAIL " + str(failures) if failures else "  ok"))
    print(f"{'variant':<24} {'fwd ms':>8} {'fwd+bwd ms':>11}")
    for r in rows:
        print(f"{r['variant']:<24} {r['fwd_ms']:>8.3f} {r['fwd+bwd_ms']:>11.3f}")
    print(f"torch transforms alone (fwd): {t_torch:.3f} ms; generated transform kernel alone (fwd): {t_kernel:.3f} ms "
          f"= {moved / t_kernel / 1e6:.0f} GB/s of its {moved / 1e6:.0f} MB in + out")
    print(f"decode step T=1 B={dec_B} (no autograd, fp32 state in and out):")
    for label, ms in decode.items():
        print(f"  {label:<34} {ms:>8.4f} ms")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shape": {"B": B, "T": T, "H": H, "D": D}, "dtype": args.dtype,
                                        "device": device, "errors": errors,
                                        "failures": failures, "rows": rows, "torch_transforms_fwd_ms": t_torch,
                                        "transform_kernel_fwd_ms": t_kernel, "transform_kernel_bytes": moved,
                                        "decode_B": dec_B, "decode_ms": decode},
                                       indent=2))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
