#!/usr/bin/env python3
"""Session 10's experiment: the delta family's forward with W and U never written to memory.

Today's forward is fwd_wu (per chunk: the inverse Ai = (I + A)^{-1}, then W = Ai diag(beta exp(G)) K and
U = Ai diag(beta) V, both written) and the fused walk (reads q, k, W, U; writes o). W and U are 2 of the 4
[B, T, H, D] tensors written and read back, about 268 of the ~640 MB the forward moves at 4x4096x16x128.

Variants, each "fwd_wu storing Ai only" (+ g_cum) then a walk that rebuilds what it needs per chunk:
- ``w_in_walk``: W = Ai_w K and U = Ai_b V inside the walk (dots off the state's chain), v_new = U - W h.
- ``factored``: v_new = Ai_b (V - exp(G) * (K h)), as U - W h = Ai diag(beta) (V - diag(exp(G)) K h): no W at all,
  one [BT, K] x [K, BV] and one [BT, BT] x [BT, BV] dot on the chain instead of the [BT, K] x [K, BV] of W h.

The Ai-only fwd_wu is generated/gated_delta_rule's fwd_wu kernel cut after its Ai store (source cut at run time,
so its math is the generated kernel's). Dense, bf16, no autograd, no initial or final state; each variant is
checked against the generated forward and the float64 reference (relative norm error). Needs a GPU.

    python benchmarks/experiments/s10_walk_wu/walk_wu.py --out $OUT/walk_wu.json
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import sys

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(os.path.dirname(os.path.dirname(HERE)))]

from benchmarks._ops import OPS, make_inputs, rel_err, scale_for  # noqa: E402
from benchmarks.experiments.harness import add_run_options, jit_from_source, timer, write_record  # noqa: E402
from fla_gen.runtime import launch  # noqa: E402
from fla_gen.runtime.dispatch import select_plan  # noqa: E402


def ai_only_wu_kernel():
    """generated/gated_delta_rule's fwd_wu kernel, cut after it stores Ai, plus its g_cum store."""
    import generated.gated_delta_rule.chunk as gchunk

    src = inspect.getsource(gchunk.gated_delta_rule_fwd_wu_kernel.fn)
    head, _, _ = src.partition("    tl.debug_barrier()\n")
    head = head.replace("def gated_delta_rule_fwd_wu_kernel(", "def ai_only_wu_kernel(")
    tail = (
        "    if USE_G:\n"
        "        b_G = tl.cumsum(tl.load(g + (t0 + o_i) * H + i_h, mask=m_t, other=0.).to(tl.float32), axis=0)\n"
        "        tl.store(g_cum + (t0 + o_i) * H + i_h, b_G, mask=m_t)\n"
    )
    return jit_from_source(head + tail, "ai_only_wu_kernel")


@triton.jit(do_not_specialize=["T"])
def walk_wu_kernel(q, k, v, beta, Ai, g_cum, o, scale, T, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_G: tl.constexpr,
                   FACTORED: tl.constexpr):
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
    b_G = tl.zeros([BT], dtype=tl.float32)
    b_GL = 0.
    if USE_G:
        m_t0 = o_i < T
        b_GL = tl.load(g_cum + (bos + tl.minimum(BT, T) - 1) * H + i_h)
        b_G = tl.where(m_t0, tl.load(g_cum + (bos + o_i) * H + i_h, mask=m_t0, other=0.), b_GL)
    for i_t in range(0, NT):
        b_G_next = tl.zeros([BT], dtype=tl.float32)
        b_GL_next = 0.
        if USE_G:
            m_tn = (i_t + 1) * BT + o_i < T
            t0n = bos + (i_t + 1) * BT
            b_GL_next = tl.load(g_cum + (t0n + tl.minimum(BT, T - (i_t + 1) * BT) - 1) * H + i_h,
                                mask=i_t + 1 < NT, other=0.)
            b_G_next = tl.where(m_tn, tl.load(g_cum + (t0n + o_i) * H + i_h, mask=m_tn, other=0.), b_GL_next)
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T
        o_tk = t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :]
        m_tk = m_t[:, None] & m_k[None, :]
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_hb = b_h.to(k.dtype.element_ty)
        b_beta = tl.load(beta + (t0 + o_i) * H + i_h, mask=m_t, other=0.).to(tl.float32)
        b_Ai = tl.load(Ai + t0 * H * BT + i_h * BT + o_i[:, None] * (H * BT) + o_i[None, :],
                       mask=m_A & m_t[:, None], other=0.)
        b_Aib = (b_Ai * b_beta[None, :]).to(k.dtype.element_ty)
        b_k = tl.load(k + o_tk, mask=m_tk, other=0.)
        b_v = tl.load(v + o_tv, mask=m_tv, other=0.)
        if FACTORED:
            b_kh = tl.dot(b_k, b_hb)
            if USE_G:
                b_kh = b_kh * tl.exp(b_G)[:, None]
            b_vn = tl.dot(b_Aib, (b_v.to(tl.float32) - b_kh).to(k.dtype.element_ty))
        else:
            if USE_G:
                b_Aiw = (b_Ai * (b_beta * tl.exp(b_G))[None, :]).to(k.dtype.element_ty)
            else:
                b_Aiw = b_Aib
            b_w = tl.dot(b_Aiw, b_k).to(k.dtype.element_ty)
            b_u = tl.dot(b_Aib, b_v).to(k.dtype.element_ty)
            b_vn = b_u.to(tl.float32) - tl.dot(b_w, b_hb)
        b_q = tl.load(q + o_tk, mask=m_tk, other=0.)
        b_kT = tl.load(k + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None],
                       mask=m_k[:, None] & m_t[None, :], other=0.)
        b_vnb = b_vn.to(b_kT.dtype)
        if USE_G:
            b_P = tl.dot(b_q, b_kT) * scale * tl.exp(tl.where(m_A, b_G[:, None] - b_G[None, :], float("-inf")))
            b_o = tl.dot(b_q, b_hb) * (scale * tl.exp(b_G))[:, None]
        else:
            b_P = tl.where(m_A, tl.dot(b_q, b_kT) * scale, 0.)
            b_o = tl.dot(b_q, b_hb) * scale
        b_o = tl.dot(b_P.to(b_vnb.dtype), b_vnb, b_o)
        tl.store(o + o_tv, b_o.to(o.dtype.element_ty), mask=m_tv)
        if USE_G:
            b_vnb = (b_vn * tl.exp(b_GL - b_G)[:, None]).to(b_kT.dtype)
            b_h *= tl.exp(b_GL)
            b_G, b_GL = b_G_next, b_GL_next
        b_h = tl.dot(b_kT, b_vnb, b_h)


def variant_forward(wu_kernel, q, k, v, g, beta, scale, plan, factored, block_v, warps, stages, wu_only=False):
    B, T, H, K = q.shape
    V = v.shape[-1]
    BT = plan.chunk_size
    cfg = plan.config("fwd_wu")

    def forward():
        Ai = k.new_empty(B, T, H, BT)
        g_cum = torch.empty(B, T, H, dtype=torch.float32, device=k.device) if g is not None else None
        wu_kernel[(triton.cdiv(T, BT), B * H)](
            None, k, v, g, g_cum, beta, None, Ai, None, None, None, None, None, scale, T, H=H, K=K, V=V, BT=BT,
            BK=launch.dot_tile(cfg.block_k, K), BV=launch.dot_tile(cfg.block_v, V), USE_G=g is not None,
            DV_LOCAL=False, IS_VARLEN=False, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
        if wu_only:
            return Ai
        o = torch.empty_like(v)
        walk_wu_kernel[(triton.cdiv(V, block_v), B * H)](
            q, k, v, beta, Ai, g_cum, o, scale, T, H=H, K=K, V=V, BT=BT, BK=launch.whole_dim_tile(K), BV=block_v,
            USE_G=g is not None, FACTORED=factored, num_warps=warps, num_stages=stages)
        return o
    return forward


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ops", default="delta_rule,gated_delta_rule")
    p.add_argument("--shapes", default="4x4096x16x128,8x2048x32x64,1x16384x16x128,2x8192x8x256")
    p.add_argument("--configs", default="64,4,2;64,4,3;32,4,2;32,4,3;64,8,2")
    p.add_argument("--variants", default="factored,w_in_walk")
    add_run_options(p)
    p.add_argument("--max-reference-tokens", type=int, default=20000)
    a = p.parse_args()
    dtype = getattr(torch, a.dtype)
    bench = timer(a)
    wu_kernel = ai_only_wu_kernel()
    rows = []
    for op in a.ops.split(","):
        pkg = importlib.import_module(f"generated.{op}")
        fn = getattr(pkg, f"chunk_{op}")
        for shape in a.shapes.split(","):
            B, T, H, D = (int(x) for x in shape.split("x"))
            names, args, _ = make_inputs(OPS[op], (B, T, H, D, D), dtype, a.device, seed=T + D + 1,
                                         requires_grad=False)
            ins = dict(zip(names, args, strict=True))
            q, k, v, beta, g = ins["q"], ins["k"], ins["v"], ins["beta"], ins.get("g")
            scale = scale_for(OPS[op], D)
            plan = select_plan(pkg.chunk.CHUNK_PLANS, q.device, q.dtype, D)

            def plain(fn=fn, args=args, scale=scale):
                with torch.no_grad():
                    return fn(*args, scale=scale)[0]
            ref = plain()
            # the float64 reference only where it is quick (its token loop runs on the device)
            exact = getattr(pkg.reference, f"{op}_reference")(*(t.double() for t in args), scale=scale)[0] \
                if B * T <= a.max_reference_tokens else None
            base = bench(plain)
            wu = bench(variant_forward(wu_kernel, q, k, v, g, beta, scale, plan, True, 32, 4, 2, wu_only=True))
            row = {"op": op, "shape": shape, "generated_ms": base, "ai_only_wu_ms": wu, "variants": []}
            print(f"{op} {shape}: err of generated vs fp64 {rel_err(ref, exact) if exact is not None else 'n/a'}")
            print(f"{op} {shape}: generated forward {base:.3f} ms; Ai-only fwd_wu {wu:.3f} ms", flush=True)
            for variant in a.variants.split(","):
                for cfg in a.configs.split(";"):
                    bv, warps, stages = (int(x) for x in cfg.split(","))
                    if bv > D:
                        continue
                    fwd = variant_forward(wu_kernel, q, k, v, g, beta, scale, plan, variant == "factored", bv, warps,
                                          stages)
                    try:
                        out = fwd()
                        err = rel_err(out, ref)
                        err_exact = rel_err(out, exact) if exact is not None else None
                        ms = bench(fwd)
                    except Exception as e:  # noqa: BLE001 -- a config that does not build is a result
                        err, err_exact, ms = float("nan"), None, float("nan")
                        print(f"  {variant} [{cfg}]: {type(e).__name__}: {str(e)[:160]}")
                    row["variants"].append({"variant": variant, "bv": bv, "warps": warps, "stages": stages, "ms": ms,
                                            "err_vs_generated": err, "err_vs_fp64": err_exact,
                                            "programs": triton.cdiv(D, bv) * B * H})
                    print(f"  {variant:10s} [{cfg}] {ms:.3f} ms  x{base / ms:.2f}  err vs generated {err:.1e} "
                          f"vs fp64 {err_exact}", flush=True)
            rows.append(row)
    write_record(a, rows)
    print("\nop               shape            generated  best variant")
    for r in rows:
        best = min((x for x in r["variants"] if x["ms"] == x["ms"]), key=lambda x: x["ms"], default=None)
        if best:
            print(f"{r['op']:16s} {r['shape']:16s} {r['generated_ms']:.3f}      {best['ms']:.3f} {best['variant']} "
                  f"[{best['bv']},{best['warps']},{best['stages']}] x{r['generated_ms'] / best['ms']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
