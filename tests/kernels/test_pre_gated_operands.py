"""GLA's fwd_A_chunk writes the operands that its walks, fwd_o and the backward's bwd_dh and bwd_dv read in place of
G, the gate's chunk-local cumsum (templates/kernels/chunk_channel_gate.jinja): qg = scale q exp(G) and
kd = k exp(G_L - G) in q's dtype, and gl, each chunk's G_L, fp32 [B * NT, H, K] in the walks' chunk order (b * NT + c
for dense inputs, the global chunk id of a packed batch).

They are checked here, in Triton's interpreter, against the same products of the float64 cumsum of g, with
allocations poisoned: a layout error (one chunk's G_L in another's row, a partial chunk's padding written, a row left
out) shows up in the operand itself, where the op's reference tests see only its effect on o.
"""

import pytest
import torch

from fla_gen.sample import relative_error, sample_inputs
from tests.support import chunk_ranges, generated, poisoned_allocations, recurrence

BT = 64

CASES = [
    # (B, T, H, K, V, cu_seqlens, dtype, tolerance): a partial last chunk; a packed batch with an empty sequence
    (2, 150, 2, 32, 16, None, torch.float32, 1e-5),
    (1, 200, 2, 40, 16, [0, 70, 70, 200], torch.float32, 1e-5),
    (2, 96, 1, 32, 16, None, torch.float16, 2e-3),
]


@pytest.mark.parametrize("case", CASES, ids=["dense-fp32", "varlen-fp32", "dense-fp16"])
def test_pre_gated_operands_match_the_cumsum(case):
    B, T, H, K, V, offsets, dtype, tolerance = case
    module = generated("gla").chunk
    x = sample_inputs(recurrence("gla"), B, T, H, K, V, dtype, seed=11)
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32)
    scale = K ** -0.5
    with poisoned_allocations():
        _, _, _, qg, kd, gl, *_ = module._op_forward(
            q=x["q"], k=x["k"], v=x["v"], g=x["g"], scale=scale, initial_state=None, output_final_state=False,
            cu_seqlens=cu, cu_seqlens_cpu=None if cu is None else cu.clone(), gate_lower_bound=None)
    # gl's rows follow the grid's order, b * NT + c for dense inputs: the position in this list
    spans = chunk_ranges(B, T, offsets, BT)
    assert gl.shape == (len(spans), H, K), gl.shape
    q, k, g = (x[name].double() for name in ("q", "k", "g"))
    qg_ref, kd_ref = torch.zeros_like(q), torch.zeros_like(k)
    gl_ref = torch.empty(len(spans), H, K, dtype=torch.float64)
    for c, (b, _, t0, t1) in enumerate(spans):
        G = g[b, t0:t1].cumsum(0)  # [n, H, K]
        qg_ref[b, t0:t1] = scale * q[b, t0:t1] * G.exp()
        kd_ref[b, t0:t1] = k[b, t0:t1] * (G[-1] - G).exp()
        gl_ref[c] = G[-1]
    for name, ours, ref in (("qg", qg, qg_ref), ("kd", kd, kd_ref), ("gl", gl, gl_ref)):
        assert torch.isfinite(ours).all(), f"{name} has entries fwd_A_chunk did not write"
        error = relative_error(ours.double(), ref)
        assert error < tolerance, f"{name}: relative error {error:.2e} against the float64 cumsum's"
