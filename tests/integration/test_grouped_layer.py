"""A layer around a grouped package: q, k on num_heads heads, v, gates, beta, the state and the output on
num_value_heads; prefill then single-token decode equals one prefill."""

from __future__ import annotations

import pytest
import torch

from fla_gen.layers import DeltaLayer, GatedLayer, layer_for
from fla_gen.sample import relative_error
from tests.support import generated


# (op, the gate's features per value head): Gated DeltaNet's gate per head, KDA's per key channel
@pytest.mark.parametrize(("op", "gate_width"), [("gated_delta_rule", 1), ("kda", 16)])
def test_grouped_layer_prefill_then_decode_equals_one_prefill(op, gate_width):
    torch.manual_seed(0)
    layer = layer_for(generated(op), 32, 1, 16, head_v_dim=8, num_value_heads=2, decode_max_tokens=1)
    assert isinstance(layer, DeltaLayer)
    assert layer.proj["q"].out_features == 16 and layer.proj["v"].out_features == 16
    assert layer.proj["g"].out_features == 2 * gate_width and layer.proj["beta"].out_features == 2
    B, T, n = 2, 11, 2
    x = torch.randn(B, T + n, 32)
    y_full, s_full = layer(x, use_cache=True)
    assert y_full.shape == (B, T + n, 32) and s_full.recurrent.shape == (B, 2, 16, 8)
    y, state = layer(x[:, :T], use_cache=True)
    ys = [y]
    for i in range(T, T + n):
        y, state = layer(x[:, i:i + 1], past_state=state, use_cache=True)
        ys.append(y)
    assert relative_error(torch.cat(ys, 1), y_full) < 1e-5
    assert relative_error(state.recurrent, s_full.recurrent) < 1e-5


def test_value_heads_must_fit_the_op():
    with pytest.raises(ValueError, match="num_value_heads=3 is not a positive multiple of num_heads=2"):
        DeltaLayer(generated("gated_delta_rule"), 32, 2, 16, num_value_heads=3)
    with pytest.raises(ValueError, match="declares no input on value heads HV"):
        GatedLayer(generated("gla"), 32, 2, 16, num_value_heads=4)
