"""Property: a packed varlen call equals the reference run on each sequence on its own.

Random partitions of T into sequences (lengths 0 and 1 included, lengths that are not
multiples of the chunk size), random initial states; outputs, final states and gradients.
"""

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fla_gen.sample import relative_error, sample_inputs
from tests.support import generated, poisoned_allocations, recurrence

H, K, V = 2, 16, 24


@st.composite
def partitions(draw):
    lengths = draw(st.lists(st.one_of(st.integers(0, 3), st.integers(1, 90)), min_size=1, max_size=4))
    if sum(lengths) == 0:
        lengths[-1] = 1
    return lengths


@pytest.mark.parametrize("op", ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"])
@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=partitions(), seed=st.integers(0, 2**31 - 1))
def test_varlen_equals_per_sequence_reference(lengths, op, mode, seed):
    torch.manual_seed(seed)
    rec, pkg = recurrence(op), generated(op)
    T, N = sum(lengths), len(lengths)
    x = sample_inputs(rec, 1, T, H, K, V, torch.float32, seed=seed)
    h0 = torch.randn(N, H, K, V)
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    cu = torch.tensor(bounds, dtype=torch.int64)
    names = [i.name for i in rec.spec.inputs]
    with poisoned_allocations():  # an element no kernel writes shows up as NaN
        o, ht = getattr(pkg, f"{mode}_{op}")(*[x[n] for n in names], initial_state=h0, output_final_state=True,
                                             cu_seqlens=cu, cu_seqlens_cpu=cu)
        do, dht = torch.randn_like(o), torch.randn_like(ht)
        grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), leaves)

    # The oracle: each sequence alone through the reference, in float64, without cu_seqlens.
    ref_leaves = [t.detach().double().requires_grad_(True) for t in leaves]
    ref_x = dict(zip(x, ref_leaves, strict=False))
    ref_o, ref_ht = [], []
    for n in range(N):
        bos, eos = bounds[n], bounds[n + 1]
        seq = [ref_x[i.name][:, bos:eos] if i.per_token else ref_x[i.name] for i in rec.spec.inputs]
        if eos == bos:  # an empty sequence passes its state through
            ref_ht.append(ref_leaves[-1][n:n + 1])
            continue
        o_n, ht_n = getattr(pkg, f"{op}_reference")(*seq, initial_state=ref_leaves[-1][n:n + 1],
                                                    output_final_state=True)
        ref_o.append(o_n)
        ref_ht.append(ht_n)
    ref_o, ref_ht = torch.cat(ref_o, 1), torch.cat(ref_ht, 0)
    ref_grads = torch.autograd.grad((ref_o * do.double()).sum() + (ref_ht * dht.double()).sum(), ref_leaves,
                                    allow_unused=True)
    assert relative_error(o, ref_o) < 1e-4
    assert relative_error(ht, ref_ht) < 1e-4
    for name, g, r in zip([*x, "initial_state"], grads, ref_grads, strict=True):
        r = torch.zeros_like(g, dtype=torch.float64) if r is None else r
        assert relative_error(g, r) < 1e-4, (name, relative_error(g, r))


def test_chunk_offsets_carry_the_walk_order_longest_first():
    """prepare_chunk_indices' chunk_offsets: each sequence's first chunk, then the sequences by their chunks, most
    first and ties in order (the walks' launch order, launch.walk_order); an empty sequence walks last."""
    from fla_gen.runtime import launch
    from fla_gen.runtime.varlen import prepare_chunk_indices

    # 64-token chunks: 1, 3, 0, 3 and 2 chunks
    _, chunk_offsets = prepare_chunk_indices(torch.tensor([0, 10, 200, 200, 392, 500]), 64, torch.device("cpu"))
    assert chunk_offsets.tolist() == [0, 1, 4, 4, 7, 9, 1, 3, 4, 0, 2]
    assert launch.walk_order(chunk_offsets, 5).tolist() == [1, 3, 4, 0, 2]
    assert launch.walk_order(None, 5) is None
