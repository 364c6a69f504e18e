#!/usr/bin/env python3
"""Session 10's experiment: gla's forward as one walk that also writes the outputs (no chunk states in memory).

gla's forward is cumsum, fwd_h (writes every chunk's [K, V] state), fwd_A (the intra-chunk matrix A, saved for the
backward), fwd_o (reads the states back: o = scale (q exp(G)) h + A v). The variant runs cumsum and fwd_A as
generated, then one program per (V block, sequence x head) walks the chunks with the whole-K state in fp32 registers:
o = (q scale exp(G)) h + A v, then h' = diag(exp(G_L)) h + (k exp(G_L - G))^T v, as the scalar-gate and delta
families' fwd_fused do. The price: the exp(G) factors of q and k are rebuilt in every V-block program. Dense, bf16,
no initial or final state; checked against the generated op and the float64 reference. Needs a GPU.

    python benchmarks/experiments/s10_gla_walk/gla_fused_walk.py --out $OUT/gla_fused_walk.json
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from benchmarks.experiments.harness import add_run_options, timer, write_record  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import select_plan  # noqa: E402


@triton.jit(do_not_specialize=["T"])
def gla_fused_walk_kernel(q, k, v, G, A, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                          BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V
    o_x = o_i[:, None] * (H * K) + o_k[None, :]
    o_xt = o_i[None, :] * (H * K) + o_k[:, None]
    o_y = o_i[:, None] * (H * V) + o_v[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    for i_t in range(tl.cdiv(T, BT)):
        t0 = bos + i_t * BT
        n_t = tl.minimum(T - i_t * BT, BT)
        m_i = o_i < n_t
        m_ik = m_i[:, None] & m_k[None, :]
        m_ki = m_k[:, None] & m_i[None, :]
        m_iv = m_i[:, None] & m_v[None, :]
        p_x = (t0 * H + i_h) * K
        p_y = (t0 * H + i_h) * V
        b_v = tl.load(v + p_y + o_y, mask=m_iv, other=0.)
        b_qg = tl.load(q + p_x + o_x, mask=m_ik, other=0.).to(tl.float32) * \
            (scale * tl.exp(tl.load(G + p_x + o_x, mask=m_ik, other=0.)))
        b_A = tl.load(A + (t0 * H + i_h) * BT + o_i[:, None] * (H * BT) + o_i[None, :], mask=m_i[:, None], other=0.)
        b_o = tl.dot(b_qg.to(b_v.dtype), b_h.to(b_v.dtype))
        b_o = tl.dot(b_A.to(b_v.dtype), b_v, b_o)
        tl.store(o + p_y + o_y, b_o.to(o.dtype.element_ty), mask=m_iv)
        b_gl = tl.load(G + p_x + (n_t - 1) * (H * K) + o_k, mask=m_k, other=0.)
        b_kgt = tl.load(k + p_x + o_xt, mask=m_ki, other=0.).to(tl.float32) * \
            tl.exp(tl.where(m_ki, b_gl[:, None] - tl.load(G + p_x + o_xt, mask=m_ki, other=0.), float("-inf")))
        b_h = b_h * tl.exp(b_gl)[:, None] + tl.dot(b_kgt.to(b_v.dtype), b_v)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128,2x8192x8x256")
    p.add_argument("--configs", default="32,4,1;32,4,2;64,4,1;64,4,2;32,8,2;64,8,2")
    add_run_options(p)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    import generated.gla as pkg
    chunk = pkg.chunk
    bench = timer(a)

    rows = []
    for shape in a.shapes.split(","):
        B, T, H, D = (int(x) for x in shape.split("x"))
        _, args, _ = make_inputs(OPS["gla"], (B, T, H, D, D), dtype, a.device, seed=T + D + 4, requires_grad=False)
        q, k, v, g = args
        scale = scale_for(OPS["gla"], D)
        plan = select_plan(chunk.CHUNK_PLANS, q.device, dtype, D)

        def generated(args=args, scale=scale):
            with torch.no_grad():
                return pkg.chunk_gla(*args, scale=scale)[0]

        ref = generated()
        exact = pkg.reference.gla_reference(*(t.double() for t in args), scale=scale)[0] if B * T <= 20000 else None
        base = bench(generated)
        row = {"shape": shape, "generated_ms": base, "configs": []}
        print(f"gla {shape}: generated forward {base:.3f} ms, err vs fp64 "
              f"{rel_err(ref, exact) if exact is not None else None}", flush=True)
        for cfg in a.configs.split(";"):
            bv, warps, stages = (int(x) for x in cfg.split(","))
            if bv > D:
                continue

            def fused(q=q, k=k, v=v, g=g, scale=scale, plan=plan, bv=bv, warps=warps, stages=stages):
                with torch.no_grad():
                    G = chunk._chunk_gate_cumsum(q, g, None, None, plan)
                    BT = plan.chunk_size
                    cfg_a = plan.config("fwd_A")
                    A = q.new_empty(*q.shape[:3], BT)
                    chunk.gla_fwd_A_kernel[(launch.cdiv(BT, 16), launch.cdiv(q.shape[1], BT), q.shape[0] * q.shape[2])](
                        q, k, G, A, None, None, scale, q.shape[1], H=q.shape[2], K=q.shape[3], BT=BT, BC=16,
                        BK=chunk._tile(cfg_a.block_k, q.shape[3]), IS_VARLEN=False,
                        DOT_PRECISION=launch.dot_precision(q.dtype), DIAG_SPAN=launch.factor_span(q.dtype),
                        num_warps=cfg_a.num_warps, num_stages=cfg_a.num_stages)
                    o = torch.empty_like(v)
                    gla_fused_walk_kernel[(triton.cdiv(v.shape[-1], bv), q.shape[0] * q.shape[2])](
                        q, k, v, G, A, o, scale, q.shape[1], H=q.shape[2], K=q.shape[3], V=v.shape[-1], BT=BT,
                        BK=launch.whole_dim_tile(q.shape[3]), BV=bv, num_warps=warps, num_stages=stages)
                    return o

            entry = {"bv": bv, "warps": warps, "stages": stages}
            try:
                out = fused()
                entry.update(ms=bench(fused), err_vs_op=rel_err(out, ref),
                             err_vs_fp64=rel_err(out, exact) if exact is not None else None)
            except Exception as e:  # noqa: BLE001 -- a config that does not build is a result
                entry.update(ms=float("nan"), error=f"{type(e).__name__}: {str(e)[:160]}")
            row["configs"].append(entry)
            print(f"  fused [{cfg}] {entry['ms']:.3f} ms  x{base / entry['ms']:.2f}  err vs op "
                  f"{entry.get('err_vs_op')} vs fp64 {entry.get('err_vs_fp64')} {entry.get('error', '')}", flush=True)
        rows.append(row)
    write_record(a, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
