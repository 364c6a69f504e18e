"""Experiment variant v0: fwd_h as generated before session 8: v_new = W (-h) + U folded into the dot (U loaded first)."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def delta_rule_fwd_h_kernel(
    k,
    w,
    u,
    h,
    v_new,
    h0,
    ht,
    cu_seqlens,
    chunk_offsets,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # One program per (V block, sequence * head) walks the chunks of its sequence in order with the
    # [BK, BV] block of the state in fp32 registers. BK covers all of K: v_new = U - W h contracts over
    # the whole key dim before the state can be updated. Stores the state at the start of every chunk
    # and v_new (input dtype: both feed tl.dot later).
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T_seq = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
        NT = tl.cdiv(T_seq, BT)
        boh = tl.load(chunk_offsets + i_n).to(tl.int64)
    else:
        bos = i_n.to(tl.int64) * T
        T_seq = T
        NT = tl.cdiv(T, BT)
        boh = i_n.to(tl.int64) * NT
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_kv = m_k[:, None] & m_v[None, :]
    o_kv = o_k[:, None] * V + o_v[None, :]

    b_h = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_h += tl.load(h0 + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.)
    for i_t in range(0, NT):
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T_seq
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        # U is loaded first, as the dot's accumulator, ahead of the state's store: with the same launch
        # config ([256, 32], 8 warps, 2 stages) fwd_h took 0.457 ms at 2x8192x8x256 with U loaded after
        # the store and 0.409-0.412 with it first (H100, across device calls; benchmarks/RESULTS.md, session 7)
        b_vn = tl.load(u + o_tv, mask=m_tv, other=0.).to(tl.float32)
        tl.store(h + ((boh + i_t) * H + i_h) * K * V + o_kv, b_h.to(h.dtype.element_ty), mask=m_kv)
        b_w = tl.load(w + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :], mask=m_t[:, None] & m_k[None, :], other=0.)
        # v_new = U - W h (the state is rounded to the input dtype for the dot, as everywhere)
        b_vn = tl.dot(b_w, (-b_h).to(b_w.dtype), b_vn)
        tl.store(v_new + o_tv, b_vn.to(v_new.dtype.element_ty), mask=m_tv)
        b_kT = tl.load(k + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None], mask=m_k[:, None] & m_t[None, :], other=0.)
        b_h = tl.dot(b_kT, b_vn.to(b_kT.dtype), b_h)
    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + o_kv, b_h, mask=m_kv)


