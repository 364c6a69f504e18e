#!/usr/bin/env python3
"""Where the fused transform kernels' time goes: the gated_delta_rule_rope transforms split into parts
(rope, l2norm, the scalar ones), each compiled from its own spec, timed alone against a device copy of
the same bytes.

    python benchmarks/transform_breakdown.py [--B 4 --T 4096 --H 16 --D 128] [--out $OUT/breakdown.json]

Each variant is the gated delta rule with a subset of gated_delta_rule_rope's transform lines; its
package is built into a temporary directory and only its transform function (forward, and forward +
backward with random output gradients) is timed with triton.testing.do_bench medians. The kernels'
own GPU time comes from torch.profiler (the call's time includes the host's launch overhead, which
dominates for the small variants). Bandwidth counts q and k read and written once (forward) or read
twice and written once (backward: raw input and output gradient in, input gradient out); "of copy" is
that over a device-to-device copy's bandwidth measured in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import torch  # noqa: E402
import triton  # noqa: E402
from bench_transforms import median_ms  # noqa: E402

from fla_gen.cli import compile_spec  # noqa: E402
from fla_gen.runtime.validate import CallShape  # noqa: E402
from fla_gen.write import write_files  # noqa: E402

HEAD = """op {op}
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H]
input beta: [B, T, H]
{heads}
state S: [K, V]
param scale = K ** -0.5
{transforms}
update S = exp(g) * S
update S = S + beta * outer(k, v - S^T @ k)
output o = scale * S^T @ q
"""
ROPE = "transform q, k = rope(q, k, style=neox, rotary_dim=K, base=10000)"
L2 = "transform q = l2norm(q)\ntransform k = l2norm(k)"
SCALARS = "transform beta = sigmoid(beta)\ntransform g = -exp(A_log) * softplus(g + dt_bias)"
VARIANTS = {
    "tb_full": (ROPE, L2, SCALARS),
    "tb_full_per_row": (ROPE, L2, SCALARS),  # the same, rotary angles per row (tile_of_one_token off)
    "tb_rope_l2": (ROPE, L2),
    "tb_rope": (ROPE,),
    "tb_l2": (L2,),
    "tb_scalars": (SCALARS,),
}


def kernel_ms(fn, names: tuple[str, ...], iters: int = 20) -> dict[str, float]:
    """Per-call CUDA time of each kernel whose name contains one of ``names`` (torch.profiler), over
    ``iters`` calls of fn after one warm-up: the GPU time alone, without the host's launch overhead."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        for n in names:
            if n in e.key:
                out[n] = out.get(n, 0.0) + e.device_time_total / 1e3 / iters
    return out


def build_variant(op: str, lines: tuple[str, ...], out_dir: Path):
    """Build the variant's package under out_dir; return its transform function and the names of the
    inputs it takes (the transformed ones, then the per-head ones)."""
    heads = "input A_log: [H]\ninput dt_bias: [H]" if SCALARS in lines else ""
    spec = out_dir / f"{op}.fla"
    spec.write_text(HEAD.format(op=op, heads=heads, transforms="\n".join(lines)))
    _, files = compile_spec(spec)
    write_files(files, out_dir)
    module = importlib.import_module(f"{op}.transforms")
    if op.endswith("_per_row"):
        module.tile_of_one_token = lambda heads, rows_per_tile: False
    fn = getattr(module, f"{op}_transforms")
    params = inspect.signature(fn).parameters.values()
    return fn, [p.name for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--B", type=int, default=4)
    parser.add_argument("--T", type=int, default=4096)
    parser.add_argument("--H", type=int, default=16)
    parser.add_argument("--D", type=int, default=128)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) / "transform_breakdown.json"
                        if os.environ.get("OUT") else None)
    args = parser.parse_args()
    B, T, H, D = args.B, args.T, args.H, args.D
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    dev = args.device
    call = CallShape(B=B, T=T, H=H, K=D, V=D, N=B, dtype=dtype, cu_seqlens_cpu=None, HV=H)
    gen = torch.Generator(device=dev).manual_seed(0)

    def randn(*shape, dt=dtype):
        return torch.randn(*shape, device=dev, dtype=dt, generator=gen)

    x = {"q": randn(B, T, H, D), "k": randn(B, T, H, D), "g": randn(B, T, H), "beta": randn(B, T, H),
         "A_log": randn(H, dt=torch.float32), "dt_bias": randn(H, dt=torch.float32)}
    elem = torch.finfo(dtype).bits // 8
    big = 2 * B * T * H * D * elem  # q and k
    copy_src = torch.empty(big // elem, device=dev, dtype=dtype)
    copy_dst = torch.empty_like(copy_src)
    copy_ms = median_ms(lambda: copy_dst.copy_(copy_src), dev, warmup=25, rep=200)
    copy_gbs = 2 * big / copy_ms / 1e6
    print(f"copy of q and k ({big / 1e6:.0f} MB each way): {copy_ms:.3f} ms = {copy_gbs:.0f} GB/s", flush=True)

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, tmp)
        for op, lines in VARIANTS.items():
            fn, names = build_variant(op, lines, Path(tmp))
            leaves = [x[n].clone().requires_grad_(True) for n in names]
            with torch.no_grad():
                fwd = median_ms(lambda fn=fn, leaves=leaves: fn(*leaves, call=call), dev, warmup=25, rep=200)
            outs = fn(*leaves, call=call)
            grads = [torch.randn_like(o) for o in outs]

            def fwd_bwd(fn=fn, leaves=leaves, grads=grads):
                torch.autograd.backward(fn(*leaves, call=call), grads)

            both = median_ms(fwd_bwd, dev, warmup=25, rep=200, **({"grad_to_none": leaves} if dev == "cuda" else {}))
            vec = sum(B * T * H * D * elem for n in names if n in ("q", "k"))
            kern = kernel_ms(fwd_bwd, ("transform_fwd_kernel", "transform_bwd_kernel")) if dev == "cuda" else {}
            k_fwd = kern.get("transform_fwd_kernel", float("nan"))
            k_bwd = kern.get("transform_bwd_kernel", float("nan"))
            row = {"variant": op, "transforms": list(lines), "fwd_ms": fwd, "bwd_ms": both - fwd,
                   "kernel_fwd_ms": k_fwd, "kernel_bwd_ms": k_bwd,
                   "kernel_fwd_gbs": 2 * vec / k_fwd / 1e6, "kernel_bwd_gbs": 3 * vec / k_bwd / 1e6}
            rows.append(row)
            print(f"{op:<16} call fwd {fwd:.3f} ms, bwd {both - fwd:.3f} ms; kernels fwd {k_fwd:.3f} ms "
                  f"({row['kernel_fwd_gbs']:.0f} GB/s), bwd {k_bwd:.3f} ms ({row['kernel_bwd_gbs']:.0f} GB/s)",
                  flush=True)
    device = torch.cuda.get_device_name() if dev == "cuda" else dev
    print(f"\ntransform kernels alone, B={B} T={T} H={H} D={D} {args.dtype} ({device}, torch {torch.__version__}, "
          f"triton {triton.__version__}); copy {copy_gbs:.0f} GB/s")
    print("call: the transform function (do_bench median, host overhead included); kernel: its kernel alone")
    print(f"{'variant':<16} {'call fwd':>9} {'call bwd':>9} {'kernel fwd':>11} {'of copy':>8} {'kernel bwd':>11} "
          f"{'of copy':>8}")
    for r in rows:
        print(f"{r['variant']:<16} {r['fwd_ms']:>9.3f} {r['bwd_ms']:>9.3f} {r['kernel_fwd_ms']:>11.3f} "
              f"{r['kernel_fwd_gbs'] / copy_gbs:>8.0%} {r['kernel_bwd_ms']:>11.3f} "
              f"{r['kernel_bwd_gbs'] / copy_gbs:>8.0%}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"shape": {"B": B, "T": T, "H": H, "D": D}, "dtype": args.dtype,
                                        "device": device, "copy_gbs": copy_gbs, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
