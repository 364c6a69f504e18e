"""The scalar-gate family's backward without a gate (linear_attn) as three walks of the fused forward kernel
(_bwd_transposed_walks): that it runs where the forward's fused walk would, and not otherwise; that its gradients
(q, k, v and the initial state's, with a final-state gradient) match the float64 reference, dense, packed and over
sequence segments, with K != V both ways; and that they agree with the chunk-state backward's."""

from __future__ import annotations

import contextlib

import pytest
import torch

from fla_gen.lower import lower
from fla_gen.plan import backward_walks_forward, select_algorithms
from fla_gen.runtime import launch, segments
from fla_gen.runtime.dispatch import forced_arch, overridden_plans
from fla_gen.sample import relative_error, sample_inputs
from tests.support import compare_chunk_op, generated, grads_of, recurrence

MODULE = generated("linear_attn").chunk
# pins a kernel of the chunk-state backward, so that the backward runs it (an experiment timing it)
CHUNK_STATE_BACKWARD = {"bwd_dqkvg": {"num_warps": 4}}


class _Spy:
    """Stands in for a module function: counts the calls and runs the real one."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.fn(*args, **kwargs)


@pytest.fixture
def transposed(monkeypatch):
    spy = _Spy(MODULE._bwd_transposed_walks)
    monkeypatch.setattr(MODULE, "_bwd_transposed_walks", spy)
    return spy


def _fused_walk_taken():
    """sm90's plans on 0 SMs: the fused walk runs (sm80's plans, the interpreter's default, never take it)."""
    stack = contextlib.ExitStack()
    stack.enter_context(forced_arch("sm90"))
    stack.enter_context(launch.forced_sm_count(0))
    return stack


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("dims", "cu_seqlens", "chunks"), [
    ((2, 200, 2, 32, 16), None, 0),  # a partial last chunk, K > V
    ((1, 300, 2, 16, 48), [0, 50, 50, 300], 0),  # packed, an empty sequence, K < V
    ((2, 260, 2, 32, 32), None, 2),  # segments of two chunks
    ((1, 300, 2, 32, 16), [0, 70, 300], 1),  # a packed batch over one-chunk segments
])
def test_transposed_backward_matches_reference(transposed, dims, cu_seqlens, chunks, dtype):
    """o, the final state and every gradient (the initial state's with a final-state gradient) against the
    float64 reference, outputs poisoned first; the backward ran as the three walks."""
    with _fused_walk_taken(), segments.forced_segment_chunks(chunks):
        result = compare_chunk_op("linear_attn", dims, dtype, seed=31, cu_seqlens=cu_seqlens)
    assert not result.failures(), result.errors
    assert transposed.calls == 1


@pytest.mark.parametrize("chunks", [0, 2])
def test_transposed_backward_agrees_with_chunk_state_backward(transposed, chunks):
    """The same call's gradients through the three walks and through fwd_h, bwd_dh and bwd_dqkvg (a plan override
    pinning bwd_dqkvg runs those): equal to fp32 rounding."""
    x = sample_inputs(recurrence("linear_attn"), 2, 260, 2, 32, 16, torch.float32, seed=41)
    x["initial_state"] = torch.randn(2, 2, 32, 16, generator=torch.Generator().manual_seed(42))

    def run():
        leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
        return grads_of(generated("linear_attn").chunk_linear_attn, leaves, ())

    with _fused_walk_taken(), segments.forced_segment_chunks(chunks):
        _, _, walked = run()
        assert transposed.calls == 1
        with overridden_plans(CHUNK_STATE_BACKWARD):
            _, _, chunk_state = run()
        assert transposed.calls == 1
    for name in x:
        assert relative_error(walked[name], chunk_state[name]) < 1e-5, name


def test_chunk_state_backward_where_the_fused_walk_is_not_taken(transposed):
    """sm80's plans never take the fused walk: neither forward nor backward; gradients still match the reference."""
    with launch.forced_sm_count(0):
        result = compare_chunk_op("linear_attn", (2, 200, 2, 32, 16), torch.float32, seed=32)
    assert not result.failures(), result.errors
    assert transposed.calls == 0


def test_zero_scale_with_a_final_state_gradient(transposed):
    """The dv walk takes dht / scale: with scale 0 and a final-state gradient the chunk-state backward runs, and
    the gradients are those of o = 0: dk = dht v, dv = dht^T k, dq = 0, dh0 = dht."""
    x = sample_inputs(recurrence("linear_attn"), 1, 130, 2, 16, 16, torch.float32, seed=43)
    x["initial_state"] = torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(44))
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    with _fused_walk_taken():
        o, ht, grads = grads_of(generated("linear_attn").chunk_linear_attn, leaves, (), scale=0.0)
    assert transposed.calls == 0
    assert torch.count_nonzero(o) == 0
    gen = torch.Generator().manual_seed(99)  # grads_of's draws: do, then dht
    _, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    assert torch.count_nonzero(grads["q"]) == 0
    assert relative_error(grads["initial_state"], dht) < 1e-6
    assert relative_error(grads["k"], torch.einsum("nhkv,bthv->bthk", dht, x["v"])) < 1e-5
    assert relative_error(grads["v"], torch.einsum("nhkv,bthk->bthv", dht, x["k"])) < 1e-5


def test_gated_ops_keep_the_chunk_state_backward():
    """A gate makes the reversed walks' decays run the other way: only the ungated kernels have them."""
    assert not hasattr(generated("simple_gla").chunk, "_bwd_transposed_walks")
    assert "REVERSE" not in generated("simple_gla").chunk.simple_gla_fwd_fused_kernel.arg_names


@pytest.mark.parametrize(("spec", "expected"), [
    ("linear_attn", True),
    ("simple_gla", False),  # a scalar gate
    ("gla", False),  # a per-channel gate
    ("delta_rule", False),  # a rank-1 part, no gate
    ("dplr", False),
])
def test_which_recurrences_walk_their_backward(spec, expected):
    """Only a recurrence without a decay or a rank-1 part, on an algorithm whose template renders it."""
    rec = recurrence(spec)
    assert backward_walks_forward(select_algorithms(rec)[0], lower(rec).features) is expected
