"""Experiment variant b1: b0 with the rope VJP's partner read by a second load of dy (-rs dy[rp])."""

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
def gated_delta_rule_rope_transform_bwd_kernel(
    x_q, x_k, x_g, x_beta, p_A_log, p_dt_bias, dy_q, dy_k, dy_g, dy_beta, dx_q, dx_k, dx_g, dx_beta, dp_A_log, dp_dt_bias,
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
    t4 = tl.where(m_K, t0, 0.0)
    t5 = 1.0 / tl.sqrt(tl.sum(t4 * t4, axis=1, keep_dims=True) + 1e-06)
    t6 = t4 * t5
    t7 = tl.where(m_K, t1, 0.0)
    t8 = 1.0 / tl.sqrt(tl.sum(t7 * t7, axis=1, keep_dims=True) + 1e-06)
    t9 = t7 * t8
    rc0, rs0, rp0 = _rope_coefs(o_K, b_pos, rope0_dim, 13.287712379549449, False)
    rp0 = tl.broadcast_to(rp0, [BR, BK])
    t10 = t6 * rc0 + rs0 * tl.gather(t6, rp0, axis=1)
    t11 = t9 * rc0 + rs0 * tl.gather(t9, rp0, axis=1)
    t12 = tl.sigmoid(t3)
    t13 = tl.load(p_A_log + i_h).to(tl.float32)
    t14 = tl.exp(t13)
    t15 = -t14
    t16 = tl.load(p_dt_bias + i_h).to(tl.float32)
    t17 = t2 + t16
    t18 = tl.where(t17 > 20.0, t17, tl.log(1.0 + tl.exp(tl.minimum(t17, 20.0))))
    t19 = t15 * t18

    dy0 = tl.load(dy_q + row * K + o_K, mask=m_K, other=0.0).to(tl.float32)
    dy1 = tl.load(dy_k + row * K + o_K, mask=m_K, other=0.0).to(tl.float32)
    dy2 = tl.load(dy_g + row).to(tl.float32)
    dy3 = tl.load(dy_beta + row).to(tl.float32)
    d0 = dy2 * t18
    d1 = dy2 * t15
    d2 = d1 * tl.sigmoid(t17)
    d3 = d2
    d4 = d2
    d5 = -d0
    d6 = d5 * t14
    d7 = dy3 * t12 * (1.0 - t12)
    d8 = dy1 * rc0 - rs0 * tl.load(dy_k + row * K + rp0, mask=m_K, other=0.0).to(tl.float32)
    d9 = dy0 * rc0 - rs0 * tl.load(dy_q + row * K + rp0, mask=m_K, other=0.0).to(tl.float32)
    d10 = tl.where(m_K, t8 * (d8 - t9 * tl.sum(d8 * t9, axis=1, keep_dims=True)), 0.0)
    d11 = tl.where(m_K, t5 * (d9 - t6 * tl.sum(d9 * t6, axis=1, keep_dims=True)), 0.0)
    tl.store(dx_q + row * K + o_K, (d11).to(dx_q.dtype.element_ty), mask=m_r & m_K)
    tl.store(dx_k + row * K + o_K, (d10).to(dx_k.dtype.element_ty), mask=m_r & m_K)
    tl.store(dx_g + row, (d3).to(dx_g.dtype.element_ty), mask=m_r)
    tl.store(dx_beta + row, (d7).to(dx_beta.dtype.element_ty), mask=m_r)
    tl.store(dp_A_log + row, d6, mask=m_r)
    tl.store(dp_dt_bias + row, d4, mask=m_r)
