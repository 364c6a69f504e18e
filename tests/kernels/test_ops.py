"""Every generated op, in Triton's interpreter, against its derived reference in float64.

Forward output, final state and the gradients of every input and of initial_state, by
relative norm error, on fresh random inputs with realistic gates; T is not a multiple of
the chunk size, K != V, H > 1; allocations are poisoned with NaN so unwritten elements fail.
"""

import contextlib
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

from fla_gen.plan import ALGORITHMS
from fla_gen.runtime.dispatch import forced_arch, overridden_plans
from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference, verify_op
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
    cu = torch.tensor([0, 20, 21, T], dtype=torch.int32)
    pkg = generated("rwkv7")
    result = compare_with_reference(getattr(pkg, f"{mode}_rwkv7"), pkg.rwkv7_reference,
                                    {**x, "initial_state": rn(3, H, K, V)}, dtype, name=f"{mode}_rwkv7",
                                    guard=poisoned_allocations, cu_seqlens=cu)
    assert not result.failures(), result.errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_gate_lower_bound_uses_the_bounded_plan(dtype, monkeypatch):
    """With gate_lower_bound, chunk_rwkv7 runs the bounded plan (every chunk's pairwise decays are tensor-core
    products of exp factors around its middle row, with no run-time check); it must match the reference."""
    pkg = generated("rwkv7")
    chunk_module = importlib.import_module("generated.rwkv7.chunk")
    chosen = []
    original = chunk_module.select_bounded_plan
    monkeypatch.setattr(chunk_module, "select_bounded_plan", lambda *a: chosen.append(original(*a)) or chosen[-1])
    B, T, H, K, V = 2, 150, 2, 32, 24
    x = sample_inputs(recurrence("rwkv7"), B, T, H, K, V, dtype, seed=3)
    x["w"] = -0.6065 * torch.sigmoid(torch.randn(B, T, H, K))  # RWKV-7's decay: w in (-e^-0.5, 0)

    @contextlib.contextmanager
    def on_sm90():  # sm90's plans (the interpreter runs any arch's): its bounded table has fp32 rows at this head dim
        with poisoned_allocations(), forced_arch("sm90"):
            yield

    h0 = torch.randn(B, H, K, V)
    result = compare_with_reference(pkg.chunk_rwkv7, pkg.rwkv7_reference, {**x, "initial_state": h0}, dtype,
                                    name="chunk_rwkv7", guard=on_sm90, op_kwargs={"gate_lower_bound": -0.6065})
    # the forward and the backward op each select the plan
    assert [p.chunk_size for p in chosen] == [ALGORITHMS["chunk_dplr"].bounded_chunk_size] * 2 == [16, 16]
    assert all(p.gate_bound is not None for p in chosen)
    assert not result.failures(), result.errors


def test_gate_lower_bound_is_checked_and_too_loose_a_bound_keeps_the_safe_plan(monkeypatch):
    pkg = generated("rwkv7")
    chunk_module = importlib.import_module("generated.rwkv7.chunk")
    chosen = []
    original = chunk_module.select_bounded_plan
    monkeypatch.setattr(chunk_module, "select_bounded_plan", lambda *a: chosen.append(original(*a)) or chosen[-1])
    x = sample_inputs(recurrence("rwkv7"), 1, 40, 2, 16, 16, torch.float32, seed=4)
    x["w"] = -6.0 * torch.rand(1, 40, 2, 16)
    with pytest.raises(ValueError, match="finite negative"):
        pkg.chunk_rwkv7(*x.values(), gate_lower_bound=0.5)
    with pytest.raises(TypeError, match="gate_lower_bound"):
        pkg.chunk_rwkv7(*x.values(), gate_lower_bound="low")
    with pytest.raises(ValueError, match="below gate_lower_bound"):
        pkg.chunk_rwkv7(*x.values(), gate_lower_bound=-1.0)
    # -12 is looser than the bounded plan allows (about -9.55): the plan safe for any gate runs, and agrees
    o_loose, _ = pkg.chunk_rwkv7(*x.values(), gate_lower_bound=-12.0)
    assert chosen[-1].gate_bound is None
    o_default, _ = pkg.chunk_rwkv7(*x.values())
    assert torch.equal(o_loose, o_default)
    # -6 holds and is within it: the bounded plan
    pkg.chunk_rwkv7(*x.values(), gate_lower_bound=-6.0)
    assert chosen[-1].gate_bound is not None


@pytest.mark.parametrize(("dtype", "B", "T", "K", "cu_seqlens"), [
    (torch.float32, 1, 150, 100, [0, 0, 70, 70, 150]),  # two K tiles of 64 (K padded to 128), empty sequences
    (torch.float16, 2, 90, 32, None),
], ids=["fp32-varlen-K100", "fp16-dense"])
def test_gla_strong_gates(dtype, B, T, K, cu_seqlens):
    """chunk_gla with per-channel log gates from logsigmoid(N(0, 1)) / 4 down to x 40 (a 64-token chunk then
    sums to ~ -2000, a 16-token sub-chunk to ~ -500): any exp factor taken against a reference token outside
    [j, i] overflows to inf or NaN, and a wrongly masked exponent shows up against the float64 reference."""
    H, V = 2, 40
    pkg, rec = generated("gla"), recurrence("gla")
    x = sample_inputs(rec, B, T, H, K, V, dtype, seed=11)
    strength = torch.logspace(math.log10(0.25), math.log10(40.0), K)
    x["g"] = F.logsigmoid(torch.randn(B, T, H, K, generator=torch.Generator().manual_seed(12))) * strength
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    result = compare_with_reference(pkg.chunk_gla, pkg.gla_reference, {**x, "initial_state": torch.randn(N, H, K, V)},
                                    dtype, name="chunk_gla", guard=poisoned_allocations, cu_seqlens=cu)
    assert not result.failures(), result.errors


@pytest.mark.parametrize(("dtype", "B", "T", "cu_seqlens", "block_k"), [
    (torch.float32, 1, 120, [0, 37, 37, 120], 16),
    (torch.float16, 2, 70, None, 16),
    # 32-wide K blocks, as sm90's measured configs (fwd_intra BK 32 / BV 16, bwd_dqk BK 32 / BV 32): the
    # entry-wise path then holds [16, 16, 32] tiles
    (torch.float32, 1, 120, [0, 37, 37, 120], 32),
], ids=["fp32-varlen", "fp16-dense", "fp32-varlen-BK32"])
def test_dplr_gates_weak_and_strong_per_k_block(dtype, B, T, cu_seqlens, block_k):
    """chunk_dplr's default plan takes each K block of a chunk through tensor-core dots of exp factors when
    its gates move at most launch.factor_span (30) inside the chunk, else entry by entry. Per-channel gate
    strengths from x 0.05 to x 40 of logsigmoid(N(0, 1)) over K = 64 (four 16-wide blocks): the first
    block's chunks span ~2 and take the dots, the last block's ~200-500 and take the entry-wise path (a
    factor about the middle row would overflow there), the middle ones vary by chunk. A factor taken where
    it overflows gives inf or NaN, and a block that lost its channels or added them twice shows up against
    the float64 reference."""
    H, K, V = 2, 64, 24
    pkg, rec = generated("dplr"), recurrence("dplr")
    x = sample_inputs(rec, B, T, H, K, V, dtype, seed=21)
    strength = torch.logspace(math.log10(0.05), math.log10(40.0), K)
    x["gk"] = F.logsigmoid(torch.randn(B, T, H, K, generator=torch.Generator().manual_seed(22))) * strength
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    with overridden_plans({"fwd_intra": {"block_k": block_k, "block_v": 16},
                           "bwd_dqk": {"block_k": block_k, "block_v": block_k}}):
        result = compare_with_reference(pkg.chunk_dplr_delta_rule, pkg.dplr_delta_rule_reference,
                                        {**x, "initial_state": torch.randn(N, H, K, V)}, dtype,
                                        name="chunk_dplr_delta_rule", guard=poisoned_allocations, cu_seqlens=cu)
    assert not result.failures(), result.errors
