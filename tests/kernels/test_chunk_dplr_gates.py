"""The DPLR chunk kernels with one log gate per token (g [B, T, H]) and/or per head (g_gamma [H]).

Specs written here, built with the compiler into a temporary directory and imported; each chunk op runs in
Triton's interpreter against its derived float64 reference on fresh inputs (RWKV-7's a = -k̂, b = η k̂,
fla_gen.sample), with every allocation NaN-poisoned: the output, the final state and the gradient of every
input, g and g_gamma included, and of the initial state. T = 37 is not a multiple of the chunk, K != V.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from fla_gen.cli import compile_spec
from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference
from fla_gen.write import write_files
from tests.support import poisoned_allocations

_HEADER = """op {op}

input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input a: [B, T, H, K]
input b: [B, T, H, K]
{gates}
state S: [K, V]
param scale = K ** -0.5

update S = {decay} * S + outer(b, S^T @ a) + outer(k, v)
output o = scale * S^T @ q
"""

SPECS = {
    "scalar": ("dplr_token_gate_case", "input g: [B, T, H]\n", "exp(g)"),
    "head": ("dplr_head_gate_case", "input g_gamma: [H]\n", "exp(g_gamma)"),
    "both": ("dplr_token_head_gate_case", "input g: [B, T, H] = 0\ninput g_gamma: [H] = 0\n", "exp(g + g_gamma)"),
}
DIMS = (2, 37, 2, 32, 16)  # B, T, H, K, V


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """{case: (recurrence, package)} for the specs above, built into a temporary directory."""
    root = tmp_path_factory.mktemp("dplr_gates")
    out = {}
    for case, (op, gates, decay) in SPECS.items():
        path = root / f"{op}.fla"
        path.write_text(f"# DPLR, {case} gate\n" + _HEADER.format(op=op, gates=gates, decay=decay))
        rec, files = compile_spec(Path(path))
        write_files(files, root / "build")
        out[case] = rec
    sys.path.insert(0, str(root / "build"))
    try:
        return {case: (rec, importlib.import_module(rec.spec.package)) for case, rec in out.items()}
    finally:
        sys.path.remove(str(root / "build"))


def _inputs(rec, dims, dtype, seed, *, strong=False, floor=None):
    B, T, H, K, V = dims
    x = sample_inputs(rec, B, T, H, K, V, dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    if strong and "g" in x:
        # down to about -6 per token: a chunk's decays span e^-90
        x["g"] = -6 * torch.rand(x["g"].shape, generator=gen)
    if floor is not None and "g" in x:
        x["g"] = x["g"].clamp(min=floor)
    return x


def _check(built, case, dtype=torch.float32, dims=DIMS, *, seed=0, cu_seqlens=None, strong=False, floor=None,
           op_kwargs=None, mode="chunk"):
    rec, pkg = built[case]
    x = _inputs(rec, dims, dtype, seed, strong=strong, floor=floor)
    N = dims[0] if cu_seqlens is None else len(cu_seqlens) - 1
    x["initial_state"] = torch.randn(N, dims[2], dims[3], dims[4], generator=torch.Generator().manual_seed(seed + 2))
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    op = rec.spec.op
    result = compare_with_reference(getattr(pkg, f"{mode}_{op}"), getattr(pkg, f"{op}_reference"), x, dtype,
                                    name=f"{mode}_{op}", guard=poisoned_allocations, cu_seqlens=cu,
                                    op_kwargs=op_kwargs)
    expected = {"o", "final_state", "dinitial_state"} | {f"d{i.name}" for i in rec.spec.inputs}
    assert set(result.errors) == expected
    assert not result.failures(), result.errors
    return result


@pytest.mark.parametrize("case", ["scalar", "head", "both"])
def test_fp32(built, case):
    _check(built, case)


def test_strong_scalar_gate(built):
    _check(built, "both", strong=True, seed=3)


def test_fp16(built):
    _check(built, "both", torch.float16, seed=4)


def test_varlen_with_an_empty_sequence(built):
    _check(built, "both", dims=(1, 37, 2, 32, 16), cu_seqlens=[0, 15, 15, 37], seed=5)


def test_bounded_plan(built, monkeypatch):
    """gate_lower_bound selects the bounded plan for a scalar gate (its gate bound seen by the launcher)."""
    rec, pkg = built["scalar"]
    module = sys.modules[f"{rec.spec.package}.chunk"]
    sizes = []

    def spy(launcher):
        def run(*args):
            sizes.append((args[-1].chunk_size, args[-1].gate_bound is not None))  # the plan: the last argument
            return launcher(*args)
        return run

    monkeypatch.setattr(module, "chunk_fwd", spy(module.chunk_fwd))
    monkeypatch.setattr(module, "chunk_bwd", spy(module.chunk_bwd))
    _check(built, "scalar", floor=-2.0, seed=6, op_kwargs={"gate_lower_bound": -2.0})
    assert sizes == [(16, True), (16, True)]


def test_bound_covers_both_gates(built):
    """The bound holds for g + g_gamma: a g that respects it alone with g_gamma below it is refused."""
    rec, pkg = built["both"]
    x = _inputs(rec, (1, 20, 2, 16, 16), torch.float32, 7)
    x["g"] = torch.full_like(x["g"], -0.5)
    x["g_gamma"] = torch.full_like(x["g_gamma"], -1.0)
    op = getattr(pkg, f"chunk_{rec.spec.op}")
    with pytest.raises(ValueError, match=r"g \+ g_gamma has an entry -1\.5 below gate_lower_bound=-1\.2"):
        op(**x, gate_lower_bound=-1.2)


def test_fused_recurrent_both_gates(built):
    _check(built, "both", dims=(1, 20, 2, 16, 16), seed=8, mode="fused_recurrent")


def test_gate_layouts_are_checked(built):
    """A per-channel g, or a g_gamma of the wrong head count, is refused before any kernel, naming it."""
    rec, pkg = built["both"]
    op = getattr(pkg, f"chunk_{rec.spec.op}")
    x = _inputs(rec, (1, 20, 2, 16, 16), torch.float32, 9)
    with pytest.raises(ValueError, match=r"g must be \[B, T, H\] \(3 dims\)"):
        op(**{**x, "g": torch.zeros(1, 20, 2, 16)})
    with pytest.raises(ValueError, match=r"g_gamma has H = 3"):
        op(**{**x, "g_gamma": torch.zeros(3)})
