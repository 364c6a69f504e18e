"""Experiment variant v4: fwd_h on [64, BV] row blocks, W h and the update as one dot per block (as fla-core's kernel)."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["T"])
def delta_rule_fwd_h_kernel(
    k, w, u, h, v_new, h0, ht, cu_seqlens, chunk_offsets, T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
):
    # experiment: the state as four [64, BV] row blocks (K = 256), W h as four dots, U - W h after
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
    b_h1 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 64:
        b_h2 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 128:
        b_h3 = tl.zeros([64, BV], dtype=tl.float32)
    if K > 192:
        b_h4 = tl.zeros([64, BV], dtype=tl.float32)
    for i_t in range(0, NT):
        t0 = bos + i_t * BT
        m_t = i_t * BT + o_i < T_seq
        o_tv = t0 * H * V + i_h * V + o_i[:, None] * (H * V) + o_v[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_h = h + ((boh + i_t) * H + i_h) * K * V + o_kv
        tl.store(p_h, b_h1.to(h.dtype.element_ty), mask=m_v[None, :])
        if K > 64:
            tl.store(p_h + 64 * V, b_h2.to(h.dtype.element_ty), mask=m_v[None, :])
        if K > 128:
            tl.store(p_h + 128 * V, b_h3.to(h.dtype.element_ty), mask=m_v[None, :])
        if K > 192:
            tl.store(p_h + 192 * V, b_h4.to(h.dtype.element_ty), mask=m_v[None, :])
        p_w = w + t0 * H * K + i_h * K + o_i[:, None] * (H * K) + o_k[None, :]
        b_w = tl.load(p_w, mask=m_t[:, None], other=0.)
        b_v = tl.dot(b_w, b_h1.to(b_w.dtype))
        if K > 64:
            b_w = tl.load(p_w + 64, mask=m_t[:, None], other=0.)
            b_v = tl.dot(b_w, b_h2.to(b_w.dtype), b_v)
        if K > 128:
            b_w = tl.load(p_w + 128, mask=m_t[:, None], other=0.)
            b_v = tl.dot(b_w, b_h3.to(b_w.dtype), b_v)
        if K > 192:
            b_w = tl.load(p_w + 192, mask=m_t[:, None], other=0.)
            b_v = tl.dot(b_w, b_h4.to(b_w.dtype), b_v)
        b_vn = tl.load(u + o_tv, mask=m_tv, other=0.).to(tl.float32) - b_v
        tl.store(v_new + o_tv, b_vn.to(v_new.dtype.element_ty), mask=m_tv)
        b_vb = b_vn.to(k.dtype.element_ty)
        p_k = k + t0 * H * K + i_h * K + o_i[None, :] * (H * K) + o_k[:, None]
        b_h1 = tl.dot(tl.load(p_k, mask=m_t[None, :], other=0.), b_vb, b_h1)
        if K > 64:
            b_h2 = tl.dot(tl.load(p_k + 64, mask=m_t[None, :], other=0.), b_vb, b_h2)
        if K > 128:
            b_h3 = tl.dot(tl.load(p_k + 128, mask=m_t[None, :], other=0.), b_vb, b_h3)
        if K > 192:
            b_h4 = tl.dot(tl.load(p_k + 192, mask=m_t[None, :], other=0.), b_vb, b_h4)
