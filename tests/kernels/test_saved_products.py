"""The delta family's forward keeps the products its backward reads (the chunks' inverses; with a per-channel
gate also the gate's cumsum, M, A_qk and the gated q): the backward from them must give exactly the gradients of
the backward that recomputes them from the inputs (``saved`` empty), in Triton's interpreter.

Exact equality, not a tolerance: both paths run the same kernels on the same inputs, so a saved product that
differed from the recomputed one (a stale buffer, a tensor freed and reused, the wrong one of the five) shows up
as a changed bit. Dense with grouped value heads and packed with a partial chunk, fp32.
"""

import inspect

import pytest
import torch

from fla_gen.sample import sample_inputs
from tests.support import generated, poisoned_allocations, recurrence

CASES = [
    # (op, B, T, H, HV, K, V, cu_seqlens)
    ("delta_rule", 2, 80, 2, 2, 32, 16, None),
    ("gated_delta_rule", 2, 80, 1, 2, 32, 16, None),
    ("gated_delta_rule", 1, 150, 2, 2, 16, 32, [0, 70, 150]),
    ("kda", 2, 80, 1, 2, 32, 16, None),
    ("kda", 1, 150, 2, 2, 16, 32, [0, 70, 150]),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'varlen' if c[-1] else 'dense'}")
def test_backward_from_saved_products_equals_recomputed(case):
    op, B, T, H, HV, K, V, offsets = case
    module = generated(op).chunk
    x = sample_inputs(recurrence(op), B, T, H, K, V, torch.float32, seed=3, HV=HV)
    N = B if offsets is None else len(offsets) - 1
    cu = None if offsets is None else torch.tensor(offsets, dtype=torch.int32)
    tensor_names = [name for name in inspect.signature(module._op_forward).parameters if name in x]
    call = {**{name: x[name] for name in tensor_names},
            "scale": K ** -0.5, "initial_state": torch.randn(N, HV, K, V), "output_final_state": True,
            "cu_seqlens": cu, "cu_seqlens_cpu": None if cu is None else cu.clone(), "gate_lower_bound": None}
    with poisoned_allocations():
        o, ht, *saved = module._op_forward(**call)
        assert saved, f"{op}: the forward kept nothing for its backward"
        do, dht = torch.randn_like(o), torch.randn_like(ht)
        from_saved = module._op_backward(**call, do=do, dht=dht, saved=saved)
        recomputed = module._op_backward(**call, do=do, dht=dht, saved=[])
    for name, a, b in zip([*tensor_names, "initial_state"], from_saved, recomputed, strict=True):
        assert torch.isfinite(a).all(), f"{op}: d{name} from the saved products is not finite"
        assert torch.equal(a, b), f"{op}: d{name} differs between the saved and the recomputed backward"


@pytest.mark.parametrize(("op", "products"), [("gated_delta_rule", 1), ("kda", 5), ("gla", 4)])
def test_forward_keeps_products_only_when_a_backward_may_follow(op, products, monkeypatch):
    """Called without autograd the public op runs its body directly (torch_op.call_op) under
    launch.no_backward: the forward keeps nothing, so the walk does not hold the backward's products. With a
    gradient to take, it keeps them (the delta rule's: one for the scalar gate, five for the per-channel one;
    GLA's A, qg, kd and each chunk's total gate)."""
    package = generated(op)
    module = package.chunk
    kept = []

    def spy(*args):
        out = chunk_fwd(*args)
        kept.append(len(out[2]))
        return out

    chunk_fwd = module.chunk_fwd
    monkeypatch.setattr(module, "chunk_fwd", spy)
    x = sample_inputs(recurrence(op), 1, 40, 1, 16, 16, torch.float32, seed=5)
    public = getattr(package, f"chunk_{op}")
    with torch.no_grad():
        public(**x)
    public(**{name: t.requires_grad_() for name, t in x.items()})[0].sum().backward()
    assert kept == [0, products]
