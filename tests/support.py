"""Shared test helpers: compile a shipped spec, import its generated package, poison allocations."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
from functools import cache
from pathlib import Path

import torch

from fla_gen.canonical import Recurrence, canonicalize
from fla_gen.check import check_spec
from fla_gen.parse import read_spec
from fla_gen.sample import relative_error, sample_inputs
from fla_gen.verify import TOLERANCE, CaseResult, compare_with_reference, poisoned_allocations

REPO_ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((REPO_ROOT / "specs").glob("*.fla"))
# The variant corpus: small recurrences of the normal form, not shipped (tests/kernels/test_variants.py).
VARIANTS_DIR = REPO_ROOT / "tests" / "variants"
VARIANTS = tuple(sorted(p.stem for p in VARIANTS_DIR.glob("*.fla")))
# Variants the compiler refuses until the lowering stage lands (canonicalize or plan rejects them). Tests leave
# them out of their parametrization rather than skip them, so only variants that build are counted.
AWAITING_LOWERING: frozenset[str] = frozenset()


# The imports of a generated module's kernels (templates/package/op_module.py.jinja), for tests that render a kernel
# template alone into a module of their own.
KERNEL_MODULE_HEADER = ("import torch\nimport triton\nimport triton.language as tl\n\n"
                        "from fla_gen.runtime import launch\nfrom fla_gen.runtime.cached_launch import cached_launch\n"
                        "from fla_gen.runtime.triton_math import exp_ftz\n\n\n")


@cache
def recurrence(op: str) -> Recurrence:
    return canonicalize(check_spec(read_spec(REPO_ROOT / "specs" / f"{op}.fla")))


def generated(op: str):
    return importlib.import_module(f"generated.{op}")


def chunk_ranges(B: int, T: int, cu_seqlens: list[int] | None, BT: int) -> list[tuple[int, int, int, int]]:
    """(batch row, chunk index, first token, end) of every chunk of BT tokens, in the order of the chunk-parallel
    kernels' grid: the index within the row for dense inputs, across the packed sequences with cu_seqlens."""
    if cu_seqlens is None:
        return [(b, c, t, min(t + BT, T)) for b in range(B) for c, t in enumerate(range(0, T, BT))]
    starts = [(t, eos) for bos, eos in zip(cu_seqlens[:-1], cu_seqlens[1:], strict=True) for t in range(bos, eos, BT)]
    return [(0, c, t, min(t + BT, eos)) for c, (t, eos) in enumerate(starts)]


def compare_chunk_op(package: str, dims: tuple[int, int, int, int, int], dtype: torch.dtype, *, seed: int,
                     cu_seqlens: list[int] | None = None, op: str | None = None) -> CaseResult:
    """chunk_<op> of generated/<package> (op defaults to the package) against its float64 reference on fresh
    inputs of ``dims`` (B, T, H, K, V) and a random initial state: outputs, the final state and every
    gradient, allocations poisoned. ``cu_seqlens``: packed-sequence offsets (B = 1), or None. The caller's
    context (forced arch, SM count, plan override) applies to every launch."""
    op = op or package
    B, T, H, K, V = dims
    pkg = generated(package)
    x = sample_inputs(recurrence(package), B, T, H, K, V, dtype, seed=seed)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    return compare_with_reference(getattr(pkg, f"chunk_{op}"), getattr(pkg, f"{op}_reference"),
                                  {**x, "initial_state": torch.randn(N, H, K, V)}, dtype,
                                  name=f"chunk_{op}", guard=poisoned_allocations, cu_seqlens=cu)


def grads_of(fn, leaves: dict, keywords: tuple, **kwargs):
    """o, final state and the gradient of every leaf of ``fn(positional leaves, keyword leaves, **kwargs)``,
    under fixed random output weights."""
    positional = [t for n, t in leaves.items() if n not in keywords and n != "initial_state"]
    o, ht = fn(*positional, initial_state=leaves.get("initial_state"), output_final_state=True,
               **{n: leaves[n] for n in keywords}, **kwargs)
    gen = torch.Generator().manual_seed(99)
    do, dht = torch.randn(o.shape, generator=gen), torch.randn(ht.shape, generator=gen)
    grads = torch.autograd.grad((o * do.to(o.dtype)).sum() + (ht * dht.to(ht.dtype)).sum(), list(leaves.values()),
                                allow_unused=True)  # an input only a switched-off line reads: zero gradient
    return o, ht, {n: torch.zeros_like(x) if d is None else d for (n, x), d in zip(leaves.items(), grads, strict=True)}


def assert_gradients_match_reference(fn, ref_fn, x: dict, keywords: tuple = (), tolerance: tuple | None = None,
                                     **kwargs) -> tuple[dict, dict]:
    """``fn`` (fp32, outputs poisoned first) against its float64 reference ``ref_fn`` on inputs ``x`` (the
    positional ones in order, the names in ``keywords`` passed by keyword, ``initial_state`` [N, HV, K, V]):
    o, the final state and the gradient of every input, by relative norm error, within ``tolerance`` (forward,
    gradients; default the fp32 ``TOLERANCE``). ``kwargs`` go to both (flags, cu_seqlens). A gradient that is
    zero in the reference must be zero in ``fn`` too (its relative error divides by 1e-30).

    Returns: the gradients {name: tensor} of ``fn`` and of ``ref_fn``, for checks of their own."""
    with poisoned_allocations():
        o, ht, grads = grads_of(fn, {n: t.clone().requires_grad_(True) for n, t in x.items()}, keywords, **kwargs)
    o_r, ht_r, grads_r = grads_of(ref_fn, {n: t.double().requires_grad_(True) for n, t in x.items()}, keywords,
                                  **kwargs)
    tol_fwd, tol_grad = tolerance or TOLERANCE[torch.float32]
    errors = {"o": relative_error(o, o_r), "final_state": relative_error(ht, ht_r)}
    assert all(e <= tol_fwd for e in errors.values()), errors
    errors = {f"d{n}": relative_error(grads[n], grads_r[n]) for n in x}
    assert all(e <= tol_grad for e in errors.values()), errors
    return grads, grads_r


@contextlib.contextmanager
def built_package(spec_text: str, directory: Path, name: str):
    """Build the spec ``spec_text`` (its op named ``name``) into ``directory`` and import its package for the
    duration of the context; yields (recurrence, package). The package's modules leave sys.modules after."""
    from fla_gen.cli import compile_spec
    from fla_gen.write import write_files

    path = directory / f"{name}.fla"
    path.write_text(spec_text)
    rec, files = compile_spec(path)
    write_files(files, directory / "build")
    sys.path.insert(0, str(directory / "build"))
    try:
        yield rec, importlib.import_module(rec.spec.package)
    finally:
        sys.path.remove(str(directory / "build"))
        for module in [m for m in sys.modules if m == rec.spec.package or m.startswith(rec.spec.package + ".")]:
            del sys.modules[module]


def import_with_fla(module_name: str, fla):
    """A fresh copy of ``module_name`` imported while ``fla`` stands in for flash-linear-attention."""
    spec = importlib.util.find_spec(module_name)
    copy = importlib.util.spec_from_file_location(f"{module_name}_on_fla_gen", spec.origin)
    module = importlib.util.module_from_spec(copy)
    sys.modules[copy.name] = module  # transformers reads its classes' source through sys.modules
    saved = sys.modules.get("fla")
    sys.modules["fla"] = fla
    try:
        copy.loader.exec_module(module)
    finally:
        if saved is None:
            del sys.modules["fla"]
        else:
            sys.modules["fla"] = saved
    return module


def spy_on_launch(monkeypatch, name: str) -> list:
    """What every call of fla_gen.runtime.launch.<name> returns while the test runs, in order."""
    from fla_gen.runtime import launch

    picked = []
    real = getattr(launch, name)

    def spy(*args):
        picked.append(real(*args))
        return picked[-1]

    monkeypatch.setattr(launch, name, spy)
    return picked


def assert_usage_error_before_cuda(script: Path, args: list[str], named: str) -> None:
    """``python script *args`` exits 2 with argparse's ``error: <named>`` and makes no CUDA call first (the
    benchmarks check their arguments before touching the GPU, so a typo costs no device time)."""
    import subprocess

    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {named}" in proc.stderr
    assert "CUDA" not in proc.stderr
