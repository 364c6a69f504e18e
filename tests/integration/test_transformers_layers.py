"""transformers' own Qwen3-Next Gated DeltaNet layer on generated.gated_delta_rule, in Triton's interpreter.

transformers (5.x) picks flash-linear-attention's functions when a model module is imported
(``use_kernel_func_from_hub_with_fallback``: ``fla.chunk_gated_delta_rule`` and
``fla.fused_recurrent_gated_delta_rule``, else its torch implementations) and passes on only the keywords
the chosen function declares. Here fla is not installed, so the module as imported runs transformers'
torch path; a second copy of the same module file is imported while ``sys.modules["fla"]`` is
``fla_gen.fla_compat.as_fla_module(generated.gated_delta_rule)``, exactly as a user would swap it in,
and runs our ops. The two layers share weights; outputs, the input's gradient and every parameter's
gradient must agree (fp32), and so must prefill followed by single-token decodes through the cache.
transformers' torch functions were written by others: they are also checked against our derived
reference.
"""

import functools
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from transformers import DynamicCache, Qwen3NextConfig
from transformers.models.qwen3_next import modeling_qwen3_next as torch_path

import generated.gated_delta_rule as gdn
from fla_gen.fla_compat import as_fla_module
from fla_gen.sample import relative_error
from tests.support import REPO_ROOT, assert_gradients_match_reference, import_with_fla

# (H, HV): q/k heads and value heads; Qwen3-Next runs HV = 2 H (grouped value heads, specs/gated_delta_rule.fla).
HEADS = [(2, 2), (2, 4)]
HIDDEN, HEAD_DIM = 64, 16
TOLERANCE = 1e-4  # relative norm error, fp32 against fp32


def tiny_config(H: int, HV: int) -> Qwen3NextConfig:
    """One linear-attention layer: hidden 64, H q/k heads and HV value heads of dim 16."""
    return Qwen3NextConfig(
        hidden_size=HIDDEN, linear_num_key_heads=H, linear_num_value_heads=HV, linear_key_head_dim=HEAD_DIM,
        linear_value_head_dim=HEAD_DIM, num_hidden_layers=1, layer_types=["linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=HEAD_DIM, intermediate_size=64, vocab_size=32,
    )


@pytest.fixture(scope="module")
def swapped():
    """(module copy on our ops, call counts of our ops): each op the copy picked up counts its calls."""
    assert importlib.util.find_spec("fla") is None, "fla is installed: the module as imported is not the torch path"
    fla = as_fla_module(gdn)  # what a user installs as sys.modules["fla"]
    calls = {}
    for name in ("chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule"):
        op = getattr(fla, name)

        @functools.wraps(op)  # keeps the signature: transformers filters keywords by it
        def counted(*args, _op=op, _name=name, **kwargs):
            calls[_name] = calls.get(_name, 0) + 1
            return _op(*args, **kwargs)

        setattr(fla, name, counted)
    return import_with_fla(torch_path.__name__, fla), calls


def layer_pair(swapped, H: int, HV: int, seed: int):
    """transformers' layer on its torch path and the same layer (same weights) on our ops."""
    module, _ = swapped
    torch.manual_seed(seed)
    config = tiny_config(H, HV)
    theirs = torch_path.Qwen3NextGatedDeltaNet(config, layer_idx=0).float()
    ours = module.Qwen3NextGatedDeltaNet(config, layer_idx=0).float()
    ours.load_state_dict(theirs.state_dict())
    with torch.no_grad():  # gates of realistic range: decays exp(g) between ~0.4 and ~1
        theirs.A_log.uniform_(-3.0, 0.0)
        ours.A_log.copy_(theirs.A_log)
    return config, theirs, ours


@pytest.mark.parametrize("H,HV", HEADS)
def test_forward_and_backward_match_torch_path(swapped, H, HV):
    _, calls = swapped
    before = calls.get("chunk_gated_delta_rule", 0)
    _, theirs, ours = layer_pair(swapped, H, HV, seed=0)
    x = torch.randn(2, 20, HIDDEN)
    dy = torch.randn(2, 20, HIDDEN)
    results = []
    for layer in (theirs, ours):
        xi = x.clone().requires_grad_(True)
        y = layer(xi)
        params = dict(layer.named_parameters())
        grads = torch.autograd.grad((y * dy).sum(), [xi, *params.values()])
        results.append((y, dict(zip(["x", *params], grads, strict=True))))
    assert calls.get("chunk_gated_delta_rule", 0) == before + 1, "transformers did not call our chunk op"
    (y_t, g_t), (y_o, g_o) = results
    assert relative_error(y_o, y_t) < TOLERANCE
    assert g_o.keys() == g_t.keys()
    errors = {name: relative_error(g_o[name], g_t[name]) for name in g_t}
    assert all(e < TOLERANCE for e in errors.values()), errors


@pytest.mark.parametrize("H,HV", HEADS)
def test_prefill_then_decode_match_torch_path(swapped, H, HV):
    _, calls = swapped
    before = calls.get("fused_recurrent_gated_delta_rule", 0)
    config, theirs, ours = layer_pair(swapped, H, HV, seed=1)
    prompt, steps = torch.randn(2, 12, HIDDEN), [torch.randn(2, 1, HIDDEN) for _ in range(2)]
    caches = [DynamicCache(config=config), DynamicCache(config=config)]
    with torch.no_grad():
        outs = [[layer(prompt, cache_params=cache)] for layer, cache in zip((theirs, ours), caches, strict=True)]
        for x in steps:
            for out, layer, cache in zip(outs, (theirs, ours), caches, strict=True):
                out.append(layer(x, cache_params=cache))
    assert calls.get("fused_recurrent_gated_delta_rule", 0) == before + len(steps), "decode did not call our op"
    for i, (y_t, y_o) in enumerate(zip(*outs, strict=True)):
        assert relative_error(y_o, y_t) < TOLERANCE, f"step {i}"
    s_t, s_o = (c.get_recurrent_state(0) for c in caches)
    assert s_o.dtype == torch.float32 and relative_error(s_o, s_t) < TOLERANCE


@pytest.mark.parametrize("H,HV", HEADS)
@pytest.mark.parametrize("theirs", ["torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule"])
def test_reference_matches_transformers_torch_functions(H, HV, theirs):
    """Our reference (derived from the spec, float64) against transformers' torch functions, which
    compute in fp32: outputs, final state and the gradients of the raw q, k, v, g, beta and the state."""
    B, T = 2, 20
    gen = torch.Generator().manual_seed(2)
    x = {
        "q": torch.randn(B, T, H, HEAD_DIM, generator=gen), "k": torch.randn(B, T, H, HEAD_DIM, generator=gen),
        "v": torch.randn(B, T, HV, HEAD_DIM, generator=gen), "g": F.logsigmoid(torch.randn(B, T, HV, generator=gen)),
        "beta": torch.sigmoid(torch.randn(B, T, HV, generator=gen)),
        "initial_state": torch.randn(B, HV, HEAD_DIM, HEAD_DIM, generator=gen),
    }
    # transformers' functions compute in fp32: held to 1e-5, tighter than the generated kernels' tolerance
    assert_gradients_match_reference(getattr(torch_path, theirs), gdn.gated_delta_rule_reference, x,
                                     keywords=("g", "beta"), tolerance=(1e-5, 1e-5), use_qk_l2norm_in_kernel=True)


def test_readme_swap_runs():
    """The README's "Use in Hugging Face transformers" code, run as written in a fresh interpreter, calls our op."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## Use in Hugging Face transformers", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    spy = textwrap.dedent("""
        import functools
        import generated.gated_delta_rule as _pkg
        _calls = []
        _op = _pkg.chunk_gated_delta_rule

        @functools.wraps(_op)
        def _counted(*args, **kwargs):
            _calls.append(kwargs.get("use_qk_l2norm_in_kernel"))
            return _op(*args, **kwargs)

        _pkg.chunk_gated_delta_rule = _counted
    """)
    check = "\nassert _calls == [True], _calls\nassert all(p.grad is not None for p in layer.parameters())\n"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    run = subprocess.run([sys.executable, "-c", spy + code + check], cwd=REPO_ROOT, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
