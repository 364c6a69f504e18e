#!/usr/bin/env python3
"""Session 9's experiment: delta_rule's forward with its state walk also writing the outputs (fwd_h + fwd_o in
one kernel, as fwd_fused does for the scalar-gate family), against the generated forward (fwd_wu, fwd_h, fwd_o),
same process, same inputs, bf16, dense, no autograd. The variant kernel below is generated/delta_rule's
fwd_h kernel edited by hand: it loads q, builds the intra-chunk product P = causal(q k^T) * scale and writes
o = scale * q h + P v_new each chunk, and stores neither the chunk states nor v_new. fwd_wu is the generated
one. Needs a GPU.

    python benchmarks/experiments/s9_fused_forward/delta_fused.py --out $OUT/delta_fused.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import select_plan  # noqa: E402


@triton.jit(do_not_specialize=["T"])
def delta_fused_walk_kernel(q, k, w, u, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                            BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    # the generated delta_rule_fwd_h_kernel (dense, no initial or final state), plus the output of fwd_o
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    NT = tl.cdiv(T, BT)
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_A = o_i[:, None] >= o_i[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(0, NT):
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_hb = b_h.to(k.dtype.element_ty)
        b_w = tl.load(w + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.)
        b_vn = tl.load(u + o_tv, mask=m_tv, other=0.).to(tl.float32) - tl.dot(b_w, b_hb)
        b_q = tl.load(q + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.)
        b_kT = tl.load(k + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None],
                       mask=m_k[:, None] & m_t[None, :], other=0.)
        b_vnb = b_vn.to(b_kT.dtype)
        b_P = tl.where(m_A, tl.dot(b_q, b_kT) * scale, 0.)
        b_o = tl.dot(b_q, b_hb) * scale
        b_o = tl.dot(b_P.to(b_vnb.dtype), b_vnb, b_o)
        tl.store(o + o_tv, b_o.to(o.dtype.element_ty), mask=m_tv)
        b_h = tl.dot(b_kT, b_vnb, b_h)


def fused_forward_of(chunk, q, k, v, beta, scale, plan, block_v, warps, stages):
    """fwd_wu (generated) then the variant walk; returns a no-grad forward."""
    B, T, H, K = q.shape
    V = v.shape[-1]

    def forward():
        with torch.no_grad():
            w, u, *_ = chunk._chunk_wu(q, k, v, beta, scale, None, None, None, plan)
            o = torch.empty_like(v)
            delta_fused_walk_kernel[(triton.cdiv(V, block_v), B * H)](
                q, k, w, u, o, scale, T, H=H, K=K, V=V, BT=plan.chunk_size, BK=launch.whole_dim_tile(K),
                BV=block_v, num_warps=warps, num_stages=stages)
            return o
    return forward


def plain_forward_of(fn, args, scale):
    def forward():
        with torch.no_grad():
            return fn(*args, scale=scale)[0]
    return forward


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128,2x8192x8x256")
    p.add_argument("--configs", default="64,4,2;64,4,3;32,4,2;32,4,3;64,8,2;128,8,2")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import generated.delta_rule as pkg
    chunk = pkg.chunk
    rows = []
    for shape in a.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        _, (q, k, v, beta), _ = make_inputs(OPS["delta_rule"], (B, T, H, D, D), torch.bfloat16, "cuda", seed=T + D,
                                            requires_grad=False)
        scale = scale_for(OPS["delta_rule"], D)
        plan = select_plan(chunk.CHUNK_PLANS, q.device, q.dtype, D)
        plain = plain_forward_of(pkg.chunk_delta_rule, (q, k, v, beta), scale)
        ref = plain()
        base = do_bench(plain, warmup=25, rep=200, return_mode="median")
        row = {"shape": shape, "generated_ms": base, "fused": []}
        print(f"{shape:16s} generated forward {base:.3f} ms", flush=True)
        for cfg in a.configs.split(";"):
            bv, warps, stages = (int(x) for x in cfg.split(","))
            if bv > D:
                continue
            fused = fused_forward_of(chunk, q, k, v, beta, scale, plan, bv, warps, stages)
            try:
                err = rel_err(fused(), ref)
                ms = do_bench(fused, warmup=25, rep=200, return_mode="median")
            except Exception as e:  # noqa: BLE001 -- a config that does not build is a result
                err, ms = float("nan"), float("nan")
                print(f"  {cfg}: {type(e).__name__}: {str(e)[:160]}")
            row["fused"].append({"bv": bv, "warps": warps, "stages": stages, "ms": ms, "err": err,
                                 "programs": triton.cdiv(D, bv) * B * H})
            print(f"  fused [{cfg}] {ms:.3f} ms  x{base / ms:.2f}  err vs generated {err:.1e}", flush=True)
        rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
