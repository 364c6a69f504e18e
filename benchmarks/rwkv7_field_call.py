#!/usr/bin/env python3
"""The RWKV-7 call that used to abort off Ampere, on the GPU: ours against the derived reference.

    python benchmarks/rwkv7_field_call.py [--out $OUT/rwkv7_field.json] [--with-fla]

B=1, T=4096, H=2, K=V=128, bf16, ``cu_seqlens=[0, T]``, an initial state and ``output_final_state``
(the shape of the reports against fla's DPLR kernels with cu_seqlens on sm89/sm90: an MMA -> MMA
layout conversion that aborts in Triton). Runs ``generated.rwkv7.chunk_rwkv7`` forward and backward
and compares o, the final state and every gradient with ``rwkv7_reference`` in float32 (relative
norm error, bf16 tolerance 2e-2). With ``--with-fla`` also runs fla-core's ``chunk_rwkv7`` on the same
inputs in a child process (so a device-side abort there cannot take this script down) and reports its
outcome and its agreement with ours.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

B, T, H, K, V = 1, 4096, 2, 128, 128
NAMES = ("r", "w", "k", "v", "a", "b")


def make_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """RWKV-7's parameterization: w = -softplus(x) - 0.5, a = -k̂, b = k̂ η; r, k, v ~ N(0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    rn = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    kh = F.normalize(rn(B, T, H, K), dim=-1)
    eta = torch.sigmoid(rn(B, T, H, 1))
    x = {"r": rn(B, T, H, K), "w": -F.softplus(rn(B, T, H, K)) - 0.5, "k": rn(B, T, H, K) * K ** -0.5,
         "v": rn(B, T, H, V), "a": -kh, "b": kh * eta}
    x = {n: (t.to(torch.bfloat16) if n != "w" else t) for n, t in x.items()}
    x["h0"] = 0.1 * rn(1, H, K, V)
    return x


def run(fn, x: dict, seed: int = 1):
    leaves = {n: t.cuda().requires_grad_(True) for n, t in x.items()}
    cu = torch.tensor([0, T], dtype=torch.int32, device="cuda")
    o, ht = fn(*[leaves[n] for n in NAMES], scale=1.0, initial_state=leaves["h0"], output_final_state=True,
               cu_seqlens=cu)
    gen = torch.Generator().manual_seed(seed)
    do = torch.randn(o.shape, generator=gen).to(o.dtype).cuda()
    dht = torch.randn(ht.shape, generator=gen).cuda()
    grads = torch.autograd.grad((o.float() * do.float()).sum() + (ht * dht).sum(), list(leaves.values()))
    torch.cuda.synchronize()
    return {"o": o, "final_state": ht, **{f"d{n}": g for n, g in zip(leaves, grads, strict=True)}}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("inf")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def fla_child(path: str) -> None:
    from fla.ops.rwkv7 import chunk_rwkv7

    out = run(chunk_rwkv7, make_inputs())
    torch.save({k: v.cpu() for k, v in out.items()}, path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--with-fla", action="store_true")
    p.add_argument("--fla-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.fla_child:
        fla_child(args.fla_child)
        return 0
    from generated.rwkv7 import chunk_rwkv7, rwkv7_reference

    x = make_inputs()
    ours = run(chunk_rwkv7, x)
    ref = run(lambda *a, **kw: rwkv7_reference(*[t.float() for t in a], **kw), {n: t.float() for n, t in x.items()})
    errors = {k: rel(ours[k], ref[k]) for k in ours}
    report = {"call": f"chunk_rwkv7 B={B} T={T} H={H} K={K} V={V} bf16 cu_seqlens=[0, {T}] h0 + final state",
              "device": torch.cuda.get_device_name(), "ours_vs_reference": errors,
              "pass": all(e <= 2e-2 for e in errors.values())}
    if args.with_fla:
        path = "/tmp/rwkv7_fla_out.pt"
        proc = subprocess.run([sys.executable, __file__, "--fla-child", path], capture_output=True, text=True,
                              timeout=900)
        if proc.returncode == 0:
            fla = torch.load(path)
            report["fla"] = "ran"
            report["fla_vs_reference"] = {k: rel(fla[k].cuda(), ref[k]) for k in fla}
            report["ours_vs_fla"] = {k: rel(ours[k], fla[k].cuda()) for k in fla}
        else:
            report["fla"] = f"failed (rc {proc.returncode}): {proc.stderr.strip()[-400:]}"
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
