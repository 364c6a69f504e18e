"""Grouped value heads under torch.compile: the host-side repeat of q and k traces into the graph with the
custom op, no graph break, and compiled equals eager (values and gradients)."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from fla_gen.sample import relative_error, sample_inputs
from tests.support import generated, recurrence


def test_grouped_gated_delta_rule_compiles_fullgraph():
    rec, pkg = recurrence("gated_delta_rule"), generated("gated_delta_rule")
    B, T, H, HV, K, V = 1, 20, 1, 2, 16, 8
    x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=21, HV=HV)
    h0 = torch.randn(B, HV, K, V)
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    do = torch.randn(B, T, HV, V)

    def f(q, k, v, g, beta, h):
        o, ht = pkg.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h, output_final_state=True)
        o2, ht2 = pkg.fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=ht, output_final_state=True)
        return ((o + o2) * do).sum() + ht2.square().sum()

    eager = f(*leaves)
    eager_grads = torch.autograd.grad(eager, leaves)
    torch._dynamo.reset()
    counters.clear()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    got_grads = torch.autograd.grad(got, leaves)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert relative_error(got, eager) < 1e-6
    for name, g, e in zip(["q", "k", "v", "g", "beta", "initial_state"], got_grads, eager_grads, strict=True):
        assert g.shape == e.shape and relative_error(g, e) < 1e-6, name
