"""The variant corpus (tests/variants/*.fla), each built from its spec alone and run in Triton's interpreter.

Every variant is a small recurrence of the normal form S_t = D_t S_{t-1} + b_t (a_tᵀ S_{t-1}) + k_t v_tᵀ,
o_t = scale S_tᵀ q_t written the way a model author would write it (scalar or derived factors, decays not
written as exp, decays from params or several inputs). Each is compiled into a fresh directory and imported
under a name of its own, then chunk_<op> and fused_recurrent_<op> are compared with <op>_reference in float64:
the output, the final state and the gradient of every input and of the initial state, by relative norm error,
outputs poisoned with NaN first. Shapes: H = 2, K = 16 != V = 32; T not a multiple of the chunk size (64 tokens,
16 for the DPLR family): 70 or 38 tokens for chunk (the last chunk partial), 20 for fused_recurrent; one
packed batch with an empty sequence per op.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from fla_gen.cli import compile_spec
from fla_gen.sample import sample_inputs
from fla_gen.verify import TOLERANCE, compare_with_reference
from fla_gen.write import write_files
from tests.support import AWAITING_LOWERING, VARIANTS, VARIANTS_DIR, poisoned_allocations

BUILT = tuple(v for v in VARIANTS if v not in AWAITING_LOWERING)

H, K, V = 2, 16, 32
B = 2
# fused_recurrent runs token by token, so 20 tokens exercise it as well as more, at a fraction of the
# interpreter's time (which grows with T); varlen: a sequence, an empty one, and one more.
RECURRENT_T = 20
RECURRENT_CU_SEQLENS = [0, 7, 7, 24]
MODES = ("chunk", "fused_recurrent")


def chunk_tokens(chunk_size: int) -> int:
    """T for the chunk ops: at least 32 tokens of whole chunks and 6 more in a partial chunk (70 for 64-token
    chunks, 38 for 16), so states pass between chunks and the last chunk is ragged."""
    return chunk_size * -(-32 // chunk_size) + 6


def chunk_cu_seqlens(chunk_size: int) -> list[int]:
    """Packed sequences for the chunk ops: an empty one, one shorter than a chunk, one a chunk and 3 tokens long."""
    return [0, 0, 5, 5 + chunk_size + 3]


def plan_chunk_size(pkg: ModuleType) -> int:
    """The chunk size of the built package's chunk plans (one per spec, whatever the target)."""
    plans = importlib.import_module(f"{pkg.__name__}.plans").CHUNK_PLANS
    sizes = {p.chunk_size for p in plans.values()}
    assert len(sizes) == 1, f"{pkg.__name__}: chunk plans disagree on the chunk size: {sizes}"
    return sizes.pop()


def _import_built(directory: Path, package: str, name: str) -> ModuleType:
    """Import ``directory/package`` as the top-level module ``name`` (its relative imports resolve inside it)."""
    spec = importlib.util.spec_from_file_location(name, directory / package / "__init__.py",
                                                  submodule_search_locations=[str(directory / package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """variant name -> (Recurrence, package), built on first use into its own directory."""
    cache: dict[str, tuple] = {}

    def build(variant: str):
        if variant not in cache:
            rec, files = compile_spec(VARIANTS_DIR / f"{variant}.fla")
            out = tmp_path_factory.mktemp(f"variant_{variant}")
            write_files(files, out)
            cache[variant] = rec, _import_built(out, rec.spec.package, f"_fla_gen_variant_{variant}")
        return cache[variant]

    yield build
    for variant in cache:
        for name in [n for n in sys.modules if n == f"_fla_gen_variant_{variant}"
                     or n.startswith(f"_fla_gen_variant_{variant}.")]:
            del sys.modules[name]


def _inputs(rec, B: int, T: int, N: int, seed: int) -> dict[str, torch.Tensor]:
    """The op's inputs from sample_inputs (ranges by role) and an initial state [N, H, K, V]."""
    x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=seed)
    inputs = {i.name: x[i.name] for i in rec.spec.inputs}
    inputs["initial_state"] = torch.randn(N, H, K, V, generator=torch.Generator().manual_seed(seed + 1))
    return inputs


def _check(rec, pkg, mode: str, B: int, T: int, cu_seqlens: list[int] | None, seed: int) -> None:
    op = rec.spec.op
    inputs = _inputs(rec, B, T, B if cu_seqlens is None else len(cu_seqlens) - 1, seed)
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    result = compare_with_reference(getattr(pkg, f"{mode}_{op}"), getattr(pkg, f"{op}_reference"), inputs,
                                    torch.float32, name=f"{mode}_{op}", guard=poisoned_allocations, cu_seqlens=cu)
    expected = {"o", "final_state", "dinitial_state", *(f"d{i.name}" for i in rec.spec.inputs)}
    assert set(result.errors) == expected, f"{result.name}: compared {sorted(result.errors)}, expected {expected}"
    failures = result.failures()
    where = f"varlen {cu_seqlens}" if cu_seqlens else f"B={B} T={T}"
    assert not failures, (f"{result.name} ({where}, H={H} K={K} V={V}, fp32, tolerances {TOLERANCE[torch.float32]}): "
                          f"over tolerance {failures}; all errors {result.errors}")


@pytest.mark.parametrize("variant", BUILT)
def test_variant_inputs_are_sane(built, variant):
    """sample_inputs draws each input by its role; on those draws the reference's outputs and state stay bounded
    (a decay or a contraction keeps |S| near its initial size), so a relative error means something."""
    rec, pkg = built(variant)
    T = chunk_tokens(plan_chunk_size(pkg))
    inputs = _inputs(rec, B, T, B, seed=5)
    with torch.no_grad():
        o, state = getattr(pkg, f"{rec.spec.op}_reference")(
            *[t.double() for n, t in inputs.items() if n != "initial_state"],
            initial_state=inputs["initial_state"].double(), output_final_state=True)
    for name, t in (("o", o), ("final_state", state)):
        assert torch.isfinite(t).all() and 1e-3 < t.abs().max() < 1e3, (
            f"{rec.spec.op}: on sample_inputs' draws the reference's {name} has max |x| {t.abs().max():.3g}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", BUILT)
def test_variant_matches_reference(built, variant, mode):
    rec, pkg = built(variant)
    T = chunk_tokens(plan_chunk_size(pkg)) if mode == "chunk" else RECURRENT_T
    _check(rec, pkg, mode, B, T, None, seed=11)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("variant", BUILT)
def test_variant_varlen_matches_reference(built, variant, mode):
    rec, pkg = built(variant)
    cu = chunk_cu_seqlens(plan_chunk_size(pkg)) if mode == "chunk" else RECURRENT_CU_SEQLENS
    _check(rec, pkg, mode, 1, cu[-1], cu, seed=23)


def test_corpus_is_complete():
    """At least 24 variants, each with a header comment; the awaiting set names only existing variants."""
    assert len(VARIANTS) >= 24, VARIANTS
    assert AWAITING_LOWERING <= set(VARIANTS), AWAITING_LOWERING - set(VARIANTS)
    for variant in VARIANTS:
        text = (VARIANTS_DIR / f"{variant}.fla").read_text()
        assert text.startswith("# ") and "Exercises:" in text, f"{variant}.fla: no header saying what it exercises"
