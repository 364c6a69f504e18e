"""Experiment variant d0: bwd_dh as generated before session 8: one [BK, BV] tile, dots chained through the accumulator."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def delta_rule_bwd_dh_kernel(
    q,
    k,
    w,
    do,
    dv_local,
    dh,
    dv_new,
    dht,
    dh0,
    cu_seqlens,
    chunk_offsets,
    scale,
    T,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_FINAL_STATE_GRADIENT: tl.constexpr,
    STORE_INITIAL_STATE_GRADIENT: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    # One program per (V block, sequence * head) walks the chunks of its sequence backwards with the
    # [BK, BV] block of the state gradient D in fp32 registers (BK covers all of K: dv_new contracts
    # over it). dh[c] is the gradient w.r.t. the state at the END of chunk c (dht for the last one):
    #   dv_new = dv_local + k @ D
    #   D     <- D + q^T @ (scale do) - W^T @ dv_new
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

    b_dh = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_FINAL_STATE_GRADIENT:
        b_dh += tl.load(dht + i_nh.to(tl.int64) * K * V + o_kv, mask=m_kv, other=0.)
    for i_r in range(0, NT):
        i_t = NT - 1 - i_r
        tl.store(dh + ((boh + i_t) * H + i_h) * K * V + o_kv, b_dh.to(dh.dtype.element_ty), mask=m_kv)
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T_seq
        m_tk = m_t[:, None] & m_k[None, :]
        m_kt = m_k[:, None] & m_t[None, :]
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        # Each [BT, BK] tile is loaded right before its dot, so that without software pipelining
        # (num_stages=1) only one of them needs shared memory at a time. The scale goes on
        # the [BT, BV] side of each product, so the big tiles feed the dots straight from shared memory.
        b_k = tl.load(k + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :], mask=m_tk, other=0.)
        b_dvn = tl.dot(b_k, b_dh.to(b_k.dtype))
        b_do = tl.load(do + o_tv, mask=m_tv, other=0.)
        b_dvn += tl.load(dv_local + o_tv, mask=m_tv, other=0.)
        b_do = (b_do * scale).to(b_do.dtype)
        tl.store(dv_new + o_tv, b_dvn.to(dv_new.dtype.element_ty), mask=m_tv)
        b_qT = tl.load(q + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0.)
        b_dh = tl.dot(b_qT, b_do, b_dh)
        b_wT = tl.load(w + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None], mask=m_kt, other=0.)
        b_dh = tl.dot(b_wT, (-b_dvn).to(b_wT.dtype), b_dh)
    if STORE_INITIAL_STATE_GRADIENT:
        tl.store(dh0 + i_nh.to(tl.int64) * K * V + o_kv, b_dh, mask=m_kv)


