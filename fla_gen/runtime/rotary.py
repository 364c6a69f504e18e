"""Rotary position embeddings (RoPE, Su et al., 2021): a standalone op and the helpers that the
generated ops' fused ``rope`` transform and their references share.

Channel i < R (the rotary dim) of a head pairs with a partner channel p(i) and rotates by the
angle pos · base^(-2 f(i) / R):

    neox (GPT-NeoX, rotate halves):   p(i) = i ± R/2,  f(i) = i mod R/2
    interleaved (GPT-J, rotate pairs): p(i) = i xor 1, f(i) = i // 2
    y_i = x_i cos θ + s_i x_p(i) sin θ,   s_i = -1 for the first of a pair, +1 for the second

Channels i >= R pass through. The backward is the same rotation by -θ (a rotation's
transpose). Positions restart at 0 for every sequence (under cu_seqlens, for each packed
sequence) and are shifted by ``seqlen_offsets``: one int, or one per sequence.

``rotary_embedding`` follows fla's ``fla.modules.rotary.rotary_embedding`` signature: cos and
sin tables [TR, R/2] (row = position), x [B, T, H, D]. Unlike fla it checks its arguments with
ValueErrors before launching: tables built from the model dim instead of the head dim
(R > D), and positions past the table (offset + sequence length > TR) are refused.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from fla_gen.runtime.cached_launch import cached_launch
from fla_gen.runtime.launch import cdiv, next_power_of_2

# Positions are computed in fp32 in the fused transform; integers above 2**24 are not exact there.
MAX_POSITION = 2**24


def rope_positions(B: int, T: int, seqlen_offsets, cu_seqlens: torch.Tensor | None,
                   device: torch.device) -> torch.Tensor:
    """The position of every token, [B, T] int32: its index in its own sequence plus the offset.

    Args:
        seqlen_offsets: an int, or a [N] int tensor (N = B, or the number of packed sequences).
        cu_seqlens: [N + 1] offsets of packed sequences (B == 1), or None.
    """
    t = torch.arange(T, device=device, dtype=torch.int64)
    offsets = seqlen_offsets
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.to(device=device, dtype=torch.int64)
    if cu_seqlens is None:
        pos = t[None, :].expand(B, T)
        if isinstance(offsets, torch.Tensor):
            pos = pos + offsets[:, None]
        else:
            pos = pos + int(offsets)
        return pos.to(torch.int32).contiguous()
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    seq = torch.searchsorted(cu[1:], t, right=True)  # the sequence each packed token belongs to
    pos = t - cu[seq]
    pos = pos + (offsets[seq] if isinstance(offsets, torch.Tensor) else int(offsets))
    return pos.to(torch.int32)[None, :].contiguous()


def validate_rope(op: str, name: str, head_dim: int, rotary_dim, seqlen_offsets, N: int,
                  longest: int, table_len: int | None = None) -> int:
    """Check a rope call on the host; returns the rotary dim as an int.

    Args:
        name: the argument whose head dim the rotation runs over (for messages).
        longest: the longest sequence (T, or the longest packed sequence).
        table_len: the rows of a cos/sin table, or None when angles are computed (then the limit
            is ``MAX_POSITION``).

    Raises:
        ValueError, TypeError: naming the argument.
    """
    r = rotary_dim
    if isinstance(r, float) and r.is_integer():
        r = int(r)
    if isinstance(r, bool) or not isinstance(r, int):
        raise TypeError(f"{op}: rotary_dim must be an int, got {type(rotary_dim).__name__}")
    if r > head_dim:
        raise ValueError(f"{op}: rotary_dim = {r} is larger than the head dim of {name} ({head_dim}); build the "
                         f"rotary table from the head dim, not the model dim")
    if r < 2 or r % 2:
        raise ValueError(f"{op}: rotary_dim = {r} must be even and >= 2 (channels rotate in pairs)")
    limit, what = (table_len, "the cos/sin table") if table_len is not None else (MAX_POSITION, "2**24 positions")
    if isinstance(seqlen_offsets, torch.Tensor):
        if seqlen_offsets.dim() != 1 or seqlen_offsets.shape[0] != N:
            raise ValueError(f"{op}: seqlen_offsets must be an int or a [N] tensor with N = {N} (one per sequence), "
                             f"got shape {list(seqlen_offsets.shape)}")
        if seqlen_offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{op}: seqlen_offsets must be int32 or int64, got {seqlen_offsets.dtype}")
        lo, hi = (int(x) for x in torch.aminmax(seqlen_offsets.detach().cpu())) if N else (0, 0)
    elif isinstance(seqlen_offsets, int) and not isinstance(seqlen_offsets, bool):
        lo = hi = seqlen_offsets
    else:
        raise TypeError(f"{op}: seqlen_offsets must be an int or an int tensor, got {type(seqlen_offsets).__name__}")
    if lo < 0:
        raise ValueError(f"{op}: seqlen_offsets must be >= 0, got {lo}")
    if hi + longest > limit:
        raise ValueError(f"{op}: positions run to {hi + longest - 1} (offset {hi} + sequence length {longest}), "
                         f"past {what} ({limit} positions)")
    return r


def rope_reference(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, base: float,
                   interleaved: bool) -> torch.Tensor:
    """RoPE in torch, in x's dtype (float64 for an oracle): x [B, T, H, D], positions [B, T]."""
    half = rotary_dim // 2
    inv_freq = base ** (-torch.arange(half, dtype=x.dtype, device=x.device) * 2 / rotary_dim)
    angle = positions.to(x.dtype)[..., None, None] * inv_freq  # [B, T, 1, R/2]
    cos, sin = torch.cos(angle), torch.sin(angle)
    rot, tail = x[..., :rotary_dim], x[..., rotary_dim:]
    if interleaved:
        a, b = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((a * cos - b * sin, b * cos + a * sin), -1).flatten(-2)
    else:
        a, b = rot[..., :half], rot[..., half:]
        out = torch.cat((a * cos - b * sin, b * cos + a * sin), -1)
    return torch.cat((out, tail), -1)


def rotary_tables(rotary_dim: int, max_positions: int, base: float = 10000.0, *, head_dim: int | None = None,
                  device=None, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [max_positions, rotary_dim / 2] for ``rotary_embedding``.

    Pass ``head_dim`` to have a rotary dim larger than the head dim refused here, at build time.
    """
    if head_dim is not None and rotary_dim > head_dim:
        raise ValueError(f"rotary_tables: rotary_dim = {rotary_dim} is larger than head_dim = {head_dim}; build the "
                         f"table from the head dim, not the model dim")
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_tables: rotary_dim = {rotary_dim} must be even and >= 2")
    if max_positions < 1:
        raise ValueError(f"rotary_tables: max_positions = {max_positions} must be >= 1")
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=device) / rotary_dim)
    angle = torch.arange(max_positions, dtype=torch.float64, device=device)[:, None] * inv_freq
    return torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


# ----------------------------------------------------------------------------- the standalone op

@cached_launch
@triton.jit
def rotary_table_kernel(x, cos, sin, y, pos, NTOK, H: tl.constexpr, D: tl.constexpr, R: tl.constexpr,
                        BT: tl.constexpr, BD: tl.constexpr, INTERLEAVED: tl.constexpr, CONJUGATE: tl.constexpr):
    """One block of BT tokens of one head: y = rotate(x) with the table rows at each token's position."""
    i_t, i_h = tl.program_id(0), tl.program_id(1)
    o_t = i_t * BT + tl.arange(0, BT)
    o_d = tl.arange(0, BD)
    m_t = o_t < NTOK
    m = m_t[:, None] & (o_d < D)[None, :]
    if INTERLEAVED:
        partner = o_d ^ 1
        first = (o_d % 2) == 0
        freq = o_d // 2
    else:
        first = o_d < R // 2
        partner = tl.where(first, o_d + R // 2, o_d - R // 2)
        freq = o_d % (R // 2)
    rot = o_d < R
    partner = tl.where(rot, partner, o_d)
    b_pos = tl.load(pos + o_t, mask=m_t, other=0)
    m_r = m_t[:, None] & rot[None, :]
    b_cos = tl.load(cos + b_pos[:, None] * (R // 2) + freq[None, :], mask=m_r, other=1.0).to(tl.float32)
    b_sin = tl.load(sin + b_pos[:, None] * (R // 2) + freq[None, :], mask=m_r, other=0.0).to(tl.float32)
    if CONJUGATE:
        b_sin = -b_sin
    b_sin = tl.where(first[None, :], -b_sin, b_sin)
    row = (o_t[:, None] * H + i_h) * D
    b_x = tl.load(x + row + o_d[None, :], mask=m, other=0.0).to(tl.float32)
    b_p = tl.load(x + row + partner[None, :], mask=m, other=0.0).to(tl.float32)
    tl.store(y + row + o_d[None, :], (b_x * b_cos + b_p * b_sin).to(y.dtype.element_ty), mask=m)


def _rotate_with_tables(x, cos, sin, positions, interleaved: bool, conjugate: bool) -> torch.Tensor:
    B, T, H, D = x.shape
    y = torch.empty_like(x)
    n_tok = B * T
    BT = 16
    rotary_table_kernel[(cdiv(n_tok, BT), H)](
        x, cos, sin, y, positions, n_tok, H=H, D=D, R=2 * cos.shape[1], BT=BT,
        BD=next_power_of_2(D), INTERLEAVED=interleaved, CONJUGATE=conjugate,
    )
    return y


class RotaryEmbeddingFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, positions, interleaved):
        ctx.save_for_backward(cos, sin, positions)
        ctx.interleaved = interleaved
        return _rotate_with_tables(x, cos, sin, positions, interleaved, conjugate=False)

    @staticmethod
    def backward(ctx, dy):
        cos, sin, positions = ctx.saved_tensors
        return _rotate_with_tables(dy.contiguous(), cos, sin, positions, ctx.interleaved, conjugate=True), \
            None, None, None, None


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False,
                     seqlen_offsets: int | torch.Tensor = 0, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
    """Rotate the first R = 2 * cos.shape[-1] channels of every head of x; the rest pass through.

    Args:
        x: [B, T, H, D] float16/bfloat16/float32.
        cos, sin: [TR, R / 2] tables (``rotary_tables``), row p for position p.
        interleaved: rotate adjacent pairs (GPT-J) instead of the two halves (GPT-NeoX).
        seqlen_offsets: the position of each sequence's first token: an int or a [N] int tensor.
        cu_seqlens: [N + 1] offsets of packed sequences (B == 1); positions restart per sequence.

    Returns:
        [B, T, H, D] in x's dtype; differentiable in x.

    Raises:
        TypeError, ValueError: naming the argument, before any kernel is launched.
    """
    op = "rotary_embedding"
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"{op}: x must be a [B, T, H, D] tensor")
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"{op}: x must be float16, bfloat16 or float32, got {x.dtype}")
    if not isinstance(cos, torch.Tensor) or not isinstance(sin, torch.Tensor) or cos.dim() != 2 \
            or cos.shape != sin.shape:
        raise ValueError(f"{op}: cos and sin must be [TR, R / 2] tables of one shape")
    if cos.device != x.device or sin.device != x.device:
        raise ValueError(f"{op}: cos and sin must be on x's device {x.device}")
    B, T, H, D = x.shape
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"{op}: with cu_seqlens, x must have B = 1 (packed sequences), got B = {B}")
        cu = cu_seqlens.detach().cpu().to(torch.int64)
        if cu.dim() != 1 or cu.numel() < 2 or cu[0] != 0 or cu[-1] != T or bool((cu[1:] < cu[:-1]).any()):
            raise ValueError(f"{op}: cu_seqlens must be non-decreasing [N + 1] offsets from 0 to T = {T}")
        N, longest = cu.numel() - 1, int((cu[1:] - cu[:-1]).max())
    else:
        N, longest = B, T
    validate_rope(op, "x", D, 2 * cos.shape[1], seqlen_offsets, N, longest, table_len=cos.shape[0])
    positions = rope_positions(B, T, seqlen_offsets, cu_seqlens, x.device)
    return RotaryEmbeddingFunction.apply(x.contiguous(), cos.contiguous(), sin.contiguous(), positions,
                                         bool(interleaved))


def inv_freq_log2(base: float) -> float:
    """log2(base): the fused kernels compute base^(-2f/R) as exp2(-2f/R · log2(base))."""
    return math.log2(base)
