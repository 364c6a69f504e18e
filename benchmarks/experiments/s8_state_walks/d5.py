"""Experiment variant d5: bwd_dh on [64, BV] row blocks (two of them: K <= 128 only), do loaded first (adopted, generalised)."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def delta_rule_bwd_dh_kernel(
    q, k, w, do, dv_local, dh, dv_new, dht, dh0, cu_seqlens, chunk_offsets, scale, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_FINAL_STATE_GRADIENT: tl.constexpr, STORE_INITIAL_STATE_GRADIENT: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    # experiment: fla's structure, the state gradient as [64, BV] row blocks (K = 128: two of them)
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = i_n.to(tl.int64) * T
    T_seq = T
    NT = tl.cdiv(T, BT)
    boh = i_n.to(tl.int64) * NT
    o_i = tl.arange(0, BT)
    o_k = tl.arange(0, 64)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_kv = o_k[:, None] * V + o_v[None, :]
    b_dh1 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 64:
        b_dh2 = tl.zeros([64, BV], dtype=tl.float32)
    for i_r in range(0, NT):
        i_t = NT - 1 - i_r
        p_dh = dh + ((boh + i_t) * H + i_h) * K * V + o_kv
        tl.store(p_dh, b_dh1.to(dh.dtype.element_ty), mask=m_v[None, :])
        if K > 64:
            tl.store(p_dh + 64 * V, b_dh2.to(dh.dtype.element_ty), mask=m_v[None, :])
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T_seq
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        b_do = tl.load(do + o_tv, mask=m_tv, other=0.)
        p_k = k + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :]
        b_dvn = tl.dot(tl.load(p_k, mask=m_t[:, None], other=0.), b_dh1.to(k.dtype.element_ty))
        if K > 64:
            b_dvn = tl.dot(tl.load(p_k + 64, mask=m_t[:, None], other=0.), b_dh2.to(k.dtype.element_ty), b_dvn)
        b_dvn += tl.load(dv_local + o_tv, mask=m_tv, other=0.)
        tl.store(dv_new + o_tv, b_dvn.to(dv_new.dtype.element_ty), mask=m_tv)
        p_q = q + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None]
        p_w = w + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None]
        b_dvb = b_dvn.to(w.dtype.element_ty)
        b_dh1 += tl.dot(tl.load(p_q, mask=m_t[None, :], other=0.), b_do) * scale - tl.dot(tl.load(p_w, mask=m_t[None, :], other=0.), b_dvb)
        if K > 64:
            b_dh2 += tl.dot(tl.load(p_q + 64, mask=m_t[None, :], other=0.), b_do) * scale - tl.dot(tl.load(p_w + 64, mask=m_t[None, :], other=0.), b_dvb)
