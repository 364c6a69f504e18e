"""Every generated op, in Triton's interpreter, against its derived reference in float64.

Forward output, final state and the gradients of every input and of initial_state, by
relative norm error, on fresh random inputs with realistic gates; T is not a multiple of
the chunk size, K != V, H > 1; allocations are poisoned with NaN so unwritten elements fail.
"""

import pytest
import torch
import torch.nn.functional as F

from fla_gen.sample import relative_error
from fla_gen.verify import TOLERANCE, verify_op
from tests.support import generated, poisoned_allocations, recurrence

OPS = ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "dplr", "rwkv7"]
MODES = ["chunk", "fused_recurrent"]


def check(op, mode, dtype, **sizes):
    result = verify_op(generated(op), recurrence(op), mode, dtype, guard=poisoned_allocations, **sizes)
    assert not result.failures(), f"{result.name} {dtype}: over tolerance {result.failures()} (all {result.errors})"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_matches_reference(op, mode, dtype):
    check(op, mode, dtype, B=2, T=100, H=2, K=32, V=48, with_h0=dtype == torch.float32)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", MODES)
def test_varlen_matches_reference(op, mode):
    check(op, mode, torch.float32, B=1, T=100, H=2, K=20, V=32, cu_seqlens=[0, 17, 17, 90, 100])


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_rwkv7_parameterisation(mode, dtype):
    """RWKV-7's own input ranges (Peng et al., 2025): w = -softplus(x) - 0.5 (decays below e^-0.5, down to
    ~0), a = -k̂ and b = η k̂; the chunk kernels' pairwise decays must stay finite and exact."""
    B, T, H, K, V = 1, 70, 2, 32, 24
    gen = torch.Generator().manual_seed(7)

    def rn(*shape):
        return torch.randn(*shape, generator=gen)

    kh = F.normalize(rn(B, T, H, K), dim=-1)
    x = {"r": rn(B, T, H, K).to(dtype), "w": -F.softplus(3 * rn(B, T, H, K)) - 0.5, "k": rn(B, T, H, K).to(dtype),
         "v": rn(B, T, H, V).to(dtype), "a": (-kh).to(dtype), "b": (kh * torch.sigmoid(rn(B, T, H, 1))).to(dtype)}
    h0 = rn(3, H, K, V)
    cu = torch.tensor([0, 20, 21, T], dtype=torch.int32)
    leaves = {**x, "initial_state": h0}
    for t in leaves.values():
        t.requires_grad_(True)
    fn = getattr(generated("rwkv7"), f"{mode}_rwkv7")
    with poisoned_allocations():
        o, ht = fn(*x.values(), initial_state=h0, output_final_state=True, cu_seqlens=cu)
        do, dht = torch.randn_like(o), torch.randn_like(ht)
        grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), list(leaves.values()))
    ref_leaves = {n: t.detach().double().requires_grad_(True) for n, t in leaves.items()}
    ref_o, ref_ht = generated("rwkv7").rwkv7_reference(*[ref_leaves[n] for n in x], initial_state=ref_leaves[
        "initial_state"], output_final_state=True, cu_seqlens=cu)
    ref_grads = torch.autograd.grad((ref_o * do.double()).sum() + (ref_ht * dht.double()).sum(),
                                    list(ref_leaves.values()))
    tol_fwd, tol_grad = TOLERANCE[dtype]
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    assert all(e <= tol_fwd for e in errors.values()), errors
    errors = {f"d{n}": relative_error(g, r) for n, g, r in zip(leaves, grads, ref_grads, strict=True)}
    assert all(e <= tol_grad for e in errors.values()), errors
