"""Experiment variant t1: t0 with the rope partner read by a second load of the raw row (adopted)."""

import triton
import triton.language as tl


@triton.jit
def _rope_coefs(o, pos, R, log2_base, INTERLEAVED: tl.constexpr):
    """Per channel o: cos, the signed sin and the partner channel of RoPE at position pos, all of the
    shape of o * pos; channels o >= R pass through (cos 1, sin 0, partner itself)."""
    if INTERLEAVED:
        first = (o % 2) == 0
        partner = o ^ 1
        freq = o // 2
    else:
        first = o < R // 2
        partner = tl.where(first, o + R // 2, o - R // 2)
        freq = o % (R // 2)
    rot = o < R
    angle = pos * tl.exp2(-2.0 * freq.to(tl.float32) / R * log2_base)
    c = tl.where(rot, tl.cos(angle), 1.0)
    s = tl.where(rot, tl.where(first, -tl.sin(angle), tl.sin(angle)), 0.0)
    # tl.gather takes an index of the gathered tensor's shape
    return c, s, tl.broadcast_to(tl.where(rot, partner, o), c.shape)


@triton.jit
def gated_delta_rule_rope_transform_fwd_kernel(
    x_q, x_k, x_g, x_beta, p_A_log, p_dt_bias, y_q, y_k, y_g, y_beta,
    pos, rope0_dim, n_rows, H, K, V,
    BR: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, SAME_TOKEN: tl.constexpr,
):
    # BR consecutive rows of the flat [B * T * H] index; past the end, the last row again (stores masked)
    o_r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    m_r = (o_r < n_rows)[:, None]
    row = tl.minimum(o_r, n_rows - 1)[:, None]
    i_h = row % H
    o_K = tl.arange(0, BK)[None, :]
    m_K = o_K < K
    if SAME_TOKEN:
        # the tile's rows are heads of one token: one position, so the rotary angles (cos, sin: the
        # kernels' costliest arithmetic) are computed once per channel and shared by the BR rows
        b_pos = tl.load(pos + (tl.program_id(0).to(tl.int64) * BR) // H).to(tl.float32)
    else:
        b_pos = tl.load(pos + row // H).to(tl.float32)
    t0 = tl.load(x_q + row * K + o_K, mask=m_K, other=0.0).to(tl.float32)
    t1 = tl.load(x_k + row * K + o_K, mask=m_K, other=0.0).to(tl.float32)
    t2 = tl.load(x_g + row).to(tl.float32)
    t3 = tl.load(x_beta + row).to(tl.float32)
    rc0, rs0, rp0 = _rope_coefs(o_K, b_pos, rope0_dim, 13.287712379549449, False)
    rp0 = tl.broadcast_to(rp0, [BR, BK])
    t4 = t0 * rc0 + rs0 * tl.load(x_q + row * K + rp0, mask=m_K, other=0.0).to(tl.float32)
    t5 = t1 * rc0 + rs0 * tl.load(x_k + row * K + rp0, mask=m_K, other=0.0).to(tl.float32)
    t6 = tl.where(m_K, t4, 0.0)
    t7 = 1.0 / tl.sqrt(tl.sum(t6 * t6, axis=1, keep_dims=True) + 1e-06)
    t8 = t6 * t7
    t9 = tl.where(m_K, t5, 0.0)
    t10 = 1.0 / tl.sqrt(tl.sum(t9 * t9, axis=1, keep_dims=True) + 1e-06)
    t11 = t9 * t10
    t12 = tl.sigmoid(t3)
    t13 = tl.load(p_A_log + i_h).to(tl.float32)
    t14 = tl.exp(t13)
    t15 = -t14
    t16 = tl.load(p_dt_bias + i_h).to(tl.float32)
    t17 = t2 + t16
    t18 = tl.where(t17 > 20.0, t17, tl.log(1.0 + tl.exp(tl.minimum(t17, 20.0))))
    t19 = t15 * t18

    tl.store(y_q + row * K + o_K, t8.to(y_q.dtype.element_ty), mask=m_r & m_K)
    tl.store(y_k + row * K + o_K, t11.to(y_k.dtype.element_ty), mask=m_r & m_K)
    tl.store(y_g + row, t19.to(y_g.dtype.element_ty), mask=m_r)
    tl.store(y_beta + row, t12.to(y_beta.dtype.element_ty), mask=m_r)


