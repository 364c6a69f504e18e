"""transformers' own KDA layers on generated.kda, in Triton's interpreter: Kimi Linear's KimiLinearDeltaAttention,
and GLM-5-Next's Glm5NextTextLinearAttention, whose forget gate bounds the log decay below
(lower_bound * sigmoid(exp(A_log) * (f + dt_bias)), lower_bound = -5: down to exp(-5) per token and channel)
and hands chunk_kda the gate already computed.

As tests/integration/test_transformers_layers.py does for Qwen3-Next: the modeling module as imported runs
transformers' torch path (fla is not installed); a copy imported while ``sys.modules["fla"]`` is
``as_fla_module(generated.kda)`` runs ``chunk_kda`` / ``fused_recurrent_kda``. Outputs, the input's gradient
and every parameter's gradient must agree (fp32), and so must prefill followed by single-token decodes.
transformers' torch KDA functions are also checked against our derived reference.

Needs ``specs/kda.fla`` built (``generated.kda``) with fla's ``use_qk_l2norm_in_kernel`` declared as a flag:
the import below fails until then.
"""

import functools
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, KimiLinearConfig
from transformers.models.glm5_next import modeling_glm5_next
from transformers.models.glm5_next.configuration_glm5_next import Glm5NextTextConfig
from transformers.models.kimi_linear import modeling_kimi_linear as torch_path

import generated.kda as kda
from fla_gen.fla_compat import as_fla_module
from fla_gen.sample import relative_error
from tests.support import assert_gradients_match_reference, import_with_fla

H, HEAD_DIM, HIDDEN = 2, 16, 64
TOLERANCE = 1e-4  # relative norm error, fp32 against fp32


def tiny_config(config_class):
    """One KDA layer: hidden 64, 2 heads of dim 16."""
    return config_class(
        hidden_size=HIDDEN, num_hidden_layers=1, layer_types=["linear_attention"], mlp_layer_types=["dense"],
        linear_head_dim=HEAD_DIM, linear_num_heads=H, linear_conv_kernel_dim=4, num_attention_heads=2,
        num_key_value_heads=2, intermediate_size=64, moe_intermediate_size=32, vocab_size=32, pad_token_id=0,
    )


# model -> (its modeling module, its config class, its KDA layer class)
MODELS = {
    "kimi_linear": (torch_path, KimiLinearConfig, "KimiLinearDeltaAttention"),
    "glm5_next": (modeling_glm5_next, Glm5NextTextConfig, "Glm5NextTextLinearAttention"),
}


@pytest.fixture(scope="module", params=list(MODELS))
def swapped(request):
    """(model, module copy on our ops, call counts of our ops)."""
    assert importlib.util.find_spec("fla") is None, "fla is installed: the module as imported is not the torch path"
    fla = as_fla_module(kda)
    calls = {}
    for name in ("chunk_kda", "fused_recurrent_kda"):
        op = getattr(fla, name)

        @functools.wraps(op)  # keeps the signature: transformers filters keywords by it
        def counted(*args, _op=op, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _op(*args, **kwargs)

        setattr(fla, name, counted)
    return request.param, import_with_fla(MODELS[request.param][0].__name__, fla), calls


def layer_pair(swapped, seed: int):
    """transformers' layer on its torch path and the same layer (same weights) on our ops. The forget gate's
    A_log and dt_bias are allocated uninitialised by the layer: drawn here so that Kimi's decays lie in about
    (0.2, 1) (GLM-5-Next's lower bound keeps its own above exp(-5))."""
    model, module, _ = swapped
    torch_module, config_class, layer_class = MODELS[model]
    torch.manual_seed(seed)
    config = tiny_config(config_class)
    theirs = getattr(torch_module, layer_class)(config, layer_idx=0).float()
    with torch.no_grad():
        theirs.forget_gate.A_log.uniform_(-2.0, 0.0)
        theirs.forget_gate.dt_bias.uniform_(-2.0, 0.0)
        theirs.o_norm.weight.uniform_(0.5, 1.5)
    ours = getattr(module, layer_class)(config, layer_idx=0).float()
    ours.load_state_dict(theirs.state_dict())
    return config, theirs, ours


def test_forward_and_backward_match_torch_path(swapped):
    *_, calls = swapped
    before = calls.get("chunk_kda", 0)
    _, theirs, ours = layer_pair(swapped, seed=0)
    x, dy = torch.randn(2, 20, HIDDEN), torch.randn(2, 20, HIDDEN)
    results = []
    for layer in (theirs, ours):
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        params = dict(layer.named_parameters())
        grads = torch.autograd.grad((y * dy).sum(), [xi, *params.values()])
        results.append((y, dict(zip(["x", *params], grads, strict=True))))
    assert calls.get("chunk_kda", 0) == before + 1, "transformers did not call our chunk op"
    (y_t, g_t), (y_o, g_o) = results
    assert relative_error(y_o, y_t) < TOLERANCE
    errors = {name: relative_error(g_o[name], g_t[name]) for name in g_t}
    assert all(e < TOLERANCE for e in errors.values()), errors


def test_prefill_then_decode_match_torch_path(swapped):
    *_, calls = swapped
    before = calls.get("fused_recurrent_kda", 0)
    config, theirs, ours = layer_pair(swapped, seed=1)
    prompt, steps = torch.randn(2, 12, HIDDEN), [torch.randn(2, 1, HIDDEN) for _ in range(2)]
    caches = [DynamicCache(config=config), DynamicCache(config=config)]
    with torch.no_grad():
        outs = [[layer(prompt, cache_params=cache)] for layer, cache in zip((theirs, ours), caches, strict=True)]
        for x in steps:
            for out, layer, cache in zip(outs, (theirs, ours), caches, strict=True):
                out.append(layer(x, cache_params=cache))
    assert calls.get("fused_recurrent_kda", 0) == before + len(steps), "decode did not call our op"
    for i, (y_t, y_o) in enumerate(zip(*outs, strict=True)):
        assert relative_error(y_o, y_t) < TOLERANCE, f"step {i}"
    s_t, s_o = (c.get_recurrent_state(0) for c in caches)
    assert relative_error(s_o, s_t) < TOLERANCE


@pytest.mark.parametrize("theirs", ["chunk_kimi_delta_attention", "recurrent_kimi_delta_attention"])
def test_reference_matches_transformers_torch_functions(theirs):
    """Our reference (float64) against transformers' torch KDA functions (fp32): outputs, final state and the
    gradients of the raw q, k, v, g, beta and the state."""
    B, T = 2, 20
    gen = torch.Generator().manual_seed(2)
    x = {
        "q": torch.randn(B, T, H, HEAD_DIM, generator=gen), "k": torch.randn(B, T, H, HEAD_DIM, generator=gen),
        "v": torch.randn(B, T, H, HEAD_DIM, generator=gen),
        "g": F.logsigmoid(torch.randn(B, T, H, HEAD_DIM, generator=gen)),
        "beta": torch.sigmoid(torch.randn(B, T, H, generator=gen)),
        "initial_state": torch.randn(B, H, HEAD_DIM, HEAD_DIM, generator=gen),
    }
    # transformers' functions compute in fp32: held to 1e-5, tighter than the generated kernels' tolerance
    assert_gradients_match_reference(getattr(torch_path, theirs), kda.kda_reference, x,
                                     keywords=("g", "beta"), tolerance=(1e-5, 1e-5), use_qk_l2norm_in_kernel=True)
