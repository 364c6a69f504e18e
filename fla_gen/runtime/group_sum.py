"""The kernel behind ``launch.sum_groups``: the gradient of a key-side input under grouped heads, the sum of its
per-value-head partials.

Kernels that group heads (each value head reads query/key head hv // (H / HK) itself) write the gradients of q
and k per value head, in fp32 (``launch.group_partials``); key head i's gradient is the sum over the value heads
i * G ... (i + 1) * G - 1 of its group, G = H / HK. One kernel reads the partials once and writes that sum in the
gradient's dtype: ``partials.view(B, T, HK, G, K).sum(3)`` and the cast after it took 0.297 + 0.093 ms of the
gated delta rule's 3.70 ms forward+backward at Qwen3-Next's 4x4096 (H = 16, HV = 32, K = 128; H200, bf16,
torch 2.11): a reduction over a middle dim of two, then a second pass for the dtype. This kernel takes 0.159 ms
there, the copy bandwidth for its bytes (fp32 partials in, the gradient out).
"""

from __future__ import annotations

import triton
import triton.language as tl

from fla_gen.runtime.cached_launch import cached_launch


@cached_launch
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
