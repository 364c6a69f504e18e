#!/usr/bin/env python3
"""Session 10's experiment: the gated forward walks with the pairwise decays factored into k.

The gated fused walks (fwd_fused of chunk_scalar_gate and chunk_delta, with a gate) build, every chunk and in
every V-block program, the [BT, BT] decay matrix exp(G_i - G_j) (masked where i < j, where it could overflow),
scale v by exp(G_L - G) for the state update, and q h by exp(G). Their loop is about twice the instructions of
the ungated walk (session 9, sass_loop_count.py). With k_s = k exp(-G) (per token):

    o = scale exp(G) * (q h + tril(q k_s^T) v),    h' = exp(G_L) (h + k_s^T v)

(v is v_new for the delta rule): one [BT, K] scaling of k, one row scaling of o, no [BT, BT] exp. exp(-G)
grows with the chunk's gate span -G_L, so a kernel must fall back to the decay matrix when the span is large;
this experiment times the factored path alone (gates logsigmoid(randn) / 16: spans of about 3).

The variant kernels are generated/simple_gla's and generated/gated_delta_rule's fwd_fused kernels (dense, no
initial or final state) with those lines changed. Both sides run the generated preparation (the chunk cumsum;
fwd_wu) and then either the generated walk or the variant, launched with the same tiles, so the difference is
the walk alone. Checked against the generated op and the float64 reference. bf16. Needs a GPU.

    python benchmarks/experiments/s10_factored_walk/factored_walk.py --out $OUT/factored_walk.json
"""

from __future__ import annotations

import argparse
import importlib
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


@triton.jit
def _next_chunk_gate(g_cum, bos, i_t, NT, T, o_i, i_h, H: tl.constexpr, BT: tl.constexpr):
    m_t = i_t * BT + o_i < T
    t0 = bos + i_t * BT
    b_GL = tl.load(g_cum + (t0 + tl.minimum(BT, T - i_t * BT) - 1) * H + i_h, mask=i_t < NT, other=0.)
    b_G = tl.where(m_t, tl.load(g_cum + (t0 + o_i) * H + i_h, mask=m_t, other=0.), b_GL)
    return b_G, b_GL


@triton.jit(do_not_specialize=["T"])
def scalar_factored_walk_kernel(q, k, v, g_cum, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                                BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    NT = tl.cdiv(T, BT)
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_A = o_i[:, None] >= o_i[None, :]
    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    b_G, b_GL = _next_chunk_gate(g_cum, bos, 0, NT, T, o_i, i_h, H, BT)
    for i_t in range(0, NT):
        b_G_next, b_GL_next = _next_chunk_gate(g_cum, bos, i_t + 1, NT, T, o_i, i_h, H, BT)
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T
        b_q = tl.load(q + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :],
                      mask=m_t[:, None] & m_k[None, :], other=0.0)
        b_kT = tl.load(k + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None],
                       mask=m_t[None, :] & m_k[:, None], other=0.0)
        b_v = tl.load(v + t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :],
                      mask=m_t[:, None] & m_v[None, :], other=0.0)
        b_kT = (b_kT * tl.exp(-b_G)[None, :]).to(b_q.dtype)
        b_o = tl.dot(b_q, b_h.to(b_q.dtype))
        b_A = tl.where(m_A, tl.dot(b_q, b_kT), 0.)
        b_o = tl.dot(b_A.to(b_v.dtype), b_v, b_o)
        b_o *= (scale * tl.exp(b_G))[:, None]
        tl.store(o + t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :], b_o.to(o.dtype.element_ty),
                 mask=m_t[:, None] & m_v[None, :])
        b_h = tl.dot(b_kT, b_v, b_h) * tl.exp(b_GL)
        b_G, b_GL = b_G_next, b_GL_next


@triton.jit(do_not_specialize=["T"])
def delta_factored_walk_kernel(q, k, w, u, g_cum, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                               BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
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
    b_G, b_GL = _next_chunk_gate(g_cum, bos, 0, NT, T, o_i, i_h, H, BT)
    for i_t in range(0, NT):
        b_G_next, b_GL_next = _next_chunk_gate(g_cum, bos, i_t + 1, NT, T, o_i, i_h, H, BT)
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
        b_kT = (b_kT * tl.exp(-b_G)[None, :]).to(b_q.dtype)
        b_vnb = b_vn.to(b_kT.dtype)
        b_P = tl.where(m_A, tl.dot(b_q, b_kT), 0.)
        b_o = tl.dot(b_q, b_hb)
        b_o = tl.dot(b_P.to(b_vnb.dtype), b_vnb, b_o)
        b_o *= (scale * tl.exp(b_G))[:, None]
        tl.store(o + o_tv, b_o.to(o.dtype.element_ty), mask=m_tv)
        b_h = tl.dot(b_kT, b_vnb, b_h) * tl.exp(b_GL)
        b_G, b_GL = b_G_next, b_GL_next


def prepared(op, chunk, args, plan):
    """The generated preparation of the walk: (kernel inputs before g_cum's slot, g_cum)."""
    if op == "simple_gla":
        q, k, v, g = args
        B, T, H, _ = q.shape
        g_cum = chunk._chunk_cumsum(g, None, B, T, H, q.device, None, None, plan)
        return (q, k, v), g_cum
    q, k, v, g, beta = args
    w, u, _, _, g_cum = chunk._chunk_wu(q, k, v, g, beta, 1.0, None, None, None, plan)
    return (q, k, w, u), g_cum


def walk_call(op, chunk, args, plan, walk, grid, tail, kwargs):
    """The forward as generated preparation + ``walk``: a no-argument function returning o."""
    def forward():
        ins, g_cum = prepared(op, chunk, args, plan)
        o = torch.empty_like(args[2])
        walk[grid](*ins, g_cum, o, *tail, **kwargs)
        return o
    return forward


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="simple_gla,gated_delta_rule")
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128,2x8192x8x256")
    p.add_argument("--configs", default="32,4,2;32,4,3;64,4,2;64,4,3")
    add_run_options(p)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bench = timer(a)

    rows = []
    for op in a.ops.split(","):
        pkg = importlib.import_module(f"generated.{op}")
        chunk = pkg.chunk
        generated_walk = getattr(chunk, f"{op}_fwd_fused_kernel")
        variant_walk = scalar_factored_walk_kernel if op == "simple_gla" else delta_factored_walk_kernel
        for shape in a.shapes.split(","):
            B, T, H, D = (int(x) for x in shape.split("x"))
            names, args, _ = make_inputs(OPS[op], (B, T, H, D, D), dtype, a.device, seed=T + D + 3,
                                         requires_grad=False)
            scale = scale_for(OPS[op], D)
            plan = select_plan(chunk.CHUNK_PLANS, args[0].device, dtype, D)
            with torch.no_grad():
                ref = getattr(pkg, f"chunk_{op}")(*args, scale=scale)[0]
                exact = getattr(pkg.reference, f"{op}_reference")(*(t.double() for t in args), scale=scale)[0] \
                    if B * T <= 20000 else None
            row = {"op": op, "shape": shape, "configs": []}
            for cfg in a.configs.split(";"):
                bv, warps, stages = (int(x) for x in cfg.split(","))
                if bv > D:
                    continue
                grid = (triton.cdiv(D, bv), B * H)
                tiles = dict(T=T, H=H, K=D, V=D, BT=plan.chunk_size, BK=launch.whole_dim_tile(D), BV=bv,
                             num_warps=warps, num_stages=stages)
                flags = dict(USE_G=True, USE_INITIAL_STATE=False, STORE_FINAL_STATE=False, IS_VARLEN=False)
                if op == "simple_gla":
                    flags["DOT_PRECISION"] = "tf32" if dtype == torch.float32 else "ieee"

                generated = walk_call(op, chunk, args, plan, generated_walk, grid, (None, None, None, scale),
                                      {**tiles, **flags})
                factored = walk_call(op, chunk, args, plan, variant_walk, grid, (scale,), tiles)
                entry = {"bv": bv, "warps": warps, "stages": stages, "programs": grid[0] * grid[1]}
                for name, fn in (("generated", generated), ("factored", factored)):
                    try:
                        out = fn()
                        entry[name] = {"ms": bench(fn), "err_vs_op": rel_err(out, ref),
                                       "err_vs_fp64": rel_err(out, exact) if exact is not None else None}
                    except Exception as e:  # noqa: BLE001 -- a config that does not build is a result
                        entry[name] = {"error": f"{type(e).__name__}: {str(e)[:160]}"}
                row["configs"].append(entry)
                g, f = entry["generated"], entry["factored"]
                print(f"{op} {shape} [{cfg}] generated {g.get('ms', float('nan')):.3f} ms "
                      f"factored {f.get('ms', float('nan')):.3f} ms  errs vs op {g.get('err_vs_op')} / "
                      f"{f.get('err_vs_op')}  vs fp64 {g.get('err_vs_fp64')} / {f.get('err_vs_fp64')}"
                      f"{'  ' + g['error'] if 'error' in g else ''}{'  ' + f['error'] if 'error' in f else ''}",
                      flush=True)
            rows.append(row)
    write_record(a, rows)
    print("\nop               shape            best generated           best factored")
    for r in rows:
        def best(name, r=r):
            ok = [c for c in r["configs"] if "ms" in c[name] and c[name]["ms"] == c[name]["ms"]]
            return min(ok, key=lambda c: c[name]["ms"], default=None)
        bg, bf = best("generated"), best("factored")
        if bg and bf:
            print(f"{r['op']:16s} {r['shape']:16s} {bg['generated']['ms']:.3f} [{bg['bv']},{bg['warps']},"
                  f"{bg['stages']}]   {bf['factored']['ms']:.3f} [{bf['bv']},{bf['warps']},{bf['stages']}]  "
                  f"x{bg['generated']['ms'] / bf['factored']['ms']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
