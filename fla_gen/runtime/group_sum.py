"""The gradient of a key-side input under grouped heads: the sum of its per-value-head partials.

Kernels that group heads (each value head reads query/key head hv // (H / HK) itself) write the gradients of q
and k per value head, in fp32 (``launch.group_partials``); key head i's gradient is the sum over the value heads
i * G ... (i + 1) * G - 1 of its group, G = H / HK. One kernel reads the partials once and writes that sum in the
gradient's dtype: ``partials.view(B, T, HK, G, K).sum(3)`` and the cast after it took 0.297 + 0.093 ms of the
gated delta rule's 3.70 ms forward+backward at Qwen3-Next's 4x4096 (H = 16, HV = 32, K = 128; H200, bf16,
torch 2.11): a reduction over a middle dim of two, then a second pass for the dtype. This kernel takes 0.159 ms
there, the copy bandwidth for its bytes (fp32 partials in, the gradient out).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla_gen.runtime.tracing import shapes_only

# [rows, K] elements per program: 16 KB of fp32 per partial read, a few thousand programs at real sizes
_TILE_ELEMENTS = 4096


@triton.jit
def sum_groups_kernel(partials, out, rows, G: tl.constexpr, K: tl.constexpr, BR: tl.constexpr,
                      BK: tl.constexpr):
    # partials [rows, G, K] fp32 (rows = B * T * HK), out [rows, K]; the G partials are added in order, so
    # the result does not depend on the launch
    o_r = tl.program_id(0) * BR + tl.arange(0, BR)
    o_k = tl.arange(0, BK)
    m = (o_r < rows)[:, None] & (o_k < K)[None, :]
    o_p = o_r.to(tl.int64)[:, None] * (G * K) + o_k[None, :]
    b_s = tl.zeros([BR, BK], dtype=tl.float32)
    for j in tl.static_range(G):
        b_s += tl.load(partials + o_p + j * K, mask=m, other=0.)
    tl.store(out + o_r.to(tl.int64)[:, None] * K + o_k[None, :], b_s.to(out.dtype.element_ty), mask=m)


def sum_groups(partials: torch.Tensor, key_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The gradient [B, T, HK, K] of a key-side input, in ``dtype``, from its per-value-head partials
    [B, T, H, K] (``launch.group_partials``; contiguous, fp32 when H > HK): key head i serves the value heads
    i * H // HK ... (i + 1) * H // HK - 1, so its gradient is their sum. The partials themselves when
    H == HK (they were allocated in the input's dtype then)."""
    B, T, H, K = partials.shape
    if H == key_heads:
        return partials
    if H % key_heads:
        raise ValueError(f"sum_groups: {H} value heads do not split into groups of the {key_heads} key heads")
    if not partials.is_contiguous():
        raise ValueError("sum_groups: the partials must be contiguous [B, T, H, K] (launch.group_partials)")
    out = partials.new_empty(B, T, key_heads, K, dtype=dtype)
    if shapes_only():  # a fake implementation (torch.compile): the shape is the answer, no kernel runs
        return out
    rows = B * T * key_heads
    BK = max(16, 1 << (K - 1).bit_length())
    BR = max(1, _TILE_ELEMENTS // BK)
    sum_groups_kernel[(-(-rows // BR),)](partials, out, rows, G=H // key_heads, K=K, BR=BR, BK=BK, num_warps=4)
    return out
