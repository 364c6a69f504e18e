"""Run a generated op forward and backward and compare it with its derived reference.

Used by the tests (in the interpreter), by ``fla-gen run`` and by the GPU checks, so that
all three measure the same thing: relative norm errors of the output, the final state and
the gradient of every input and of the initial state.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from types import ModuleType

import torch

from fla_gen.canonical import Recurrence
from fla_gen.sample import relative_error, sample_inputs

# Relative-error tolerances (forward, gradients) per input dtype; DESIGN.md §8.
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (5e-3, 1e-2), torch.bfloat16: (1e-2, 2e-2)}


@dataclass(frozen=True)
class CaseResult:
    """Errors of one (op, mode, dtype) call against the reference, and its wall time."""

    name: str
    dtype: torch.dtype
    errors: dict[str, float]
    seconds: float

    def failures(self) -> dict[str, float]:
        """The errors over this dtype's tolerance (NaN and inf always fail)."""
        tol_fwd, tol_grad = TOLERANCE[self.dtype]
        return {k: e for k, e in self.errors.items()
                if not e <= (tol_fwd if k in ("o", "final_state") else tol_grad)}


def verify_op(pkg: ModuleType, rec: Recurrence, mode: str, dtype: torch.dtype, *, B: int, T: int, H: int,
              K: int, V: int, device: str = "cpu", cu_seqlens: list[int] | None = None, with_h0: bool = True,
              ref_dtype: torch.dtype = torch.float64,
              guard=contextlib.nullcontext) -> CaseResult:
    """Call ``<mode>_<op>`` on fresh random inputs, then its reference in ``ref_dtype``.

    Args:
        pkg: the generated package (``generated.<op>``).
        mode: ``chunk`` or ``fused_recurrent``.
        guard: a context manager wrapped around the op's forward and backward (tests poison
            allocations with NaN through it).

    Returns:
        CaseResult with errors keyed ``o``, ``final_state`` and ``d<input>``.
    """
    op = rec.spec.op
    fn = getattr(pkg, f"{mode}_{op}")
    ref_fn = getattr(pkg, f"{op}_reference")
    x = sample_inputs(rec, B, T, H, K, V, dtype, device)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    leaves = dict(x)
    if with_h0:
        leaves["initial_state"] = torch.randn(N, H, K, V, device=device)
    for t in leaves.values():
        t.requires_grad_(True)
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device=device)
    names = [i.name for i in rec.spec.inputs]

    start = time.perf_counter()
    with guard():
        o, ht = fn(*[x[n] for n in names], initial_state=leaves.get("initial_state"), output_final_state=True,
                   cu_seqlens=cu)
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    with guard():
        grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), list(leaves.values()))
    if device != "cpu":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    ref_leaves = {k: v.detach().to(ref_dtype).requires_grad_(True) for k, v in leaves.items()}
    ref_o, ref_ht = ref_fn(*[ref_leaves[n] for n in names], initial_state=ref_leaves.get("initial_state"),
                           output_final_state=True, cu_seqlens=cu)
    ref_grads = torch.autograd.grad((ref_o * do.to(ref_dtype)).sum() + (ref_ht * dht.to(ref_dtype)).sum(),
                                    list(ref_leaves.values()))
    if o.dtype != dtype or ht.dtype != torch.float32:
        raise AssertionError(f"{mode}_{op}: o is {o.dtype} (expected {dtype}), final_state is {ht.dtype}")
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    errors.update({f"d{k}": relative_error(g, r) for k, g, r in zip(leaves, grads, ref_grads, strict=True)})
    return CaseResult(f"{mode}_{op}", dtype, errors, seconds)
