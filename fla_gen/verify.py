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

# Relative-error tolerances (forward, gradients) per input dtype; DESIGN.md §8 ("fp32 far under 1e-3").
# fp32 gradients get 5e-4: the gate's and the per-head parameters' gradients are sums over tokens that
# cancel (dA_log of gated_delta_rule_rope measured 8e-6 to 1.6e-4 over fresh draws, its dq ~1e-7).
TOLERANCE = {torch.float32: (1e-4, 5e-4), torch.float16: (5e-3, 1e-2), torch.bfloat16: (1e-2, 2e-2)}


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


def compare_with_reference(fn, ref_fn, inputs: dict[str, torch.Tensor], dtype: torch.dtype, *, name: str,
                           guard=contextlib.nullcontext, ref_dtype: torch.dtype = torch.float64,
                           op_kwargs: dict | None = None, **kwargs) -> CaseResult:
    """Run ``fn`` forward and backward on ``inputs`` and ``ref_fn`` on the same values in ``ref_dtype``.

    Args:
        inputs: the op's positional inputs in order ([B, T, H, K] per token, [H] per head; HV for inputs
            on the value heads), and ``initial_state`` [N, HV, K, V] if given; every one is a leaf whose
            gradient is compared.
        dtype: the dtype the op's output must have (the final state must be float32).
        guard: a context manager wrapped around the op's forward and backward (tests poison
            allocations with NaN through it).
        op_kwargs: arguments for ``fn`` only (e.g. ``gate_lower_bound``); ``kwargs`` go to both
            (``cu_seqlens``, ``seqlen_offsets``).

    Returns:
        CaseResult with errors keyed ``o``, ``final_state`` and ``d<input>``.
    """
    leaves = {n: t.detach().requires_grad_(True) for n, t in inputs.items()}
    state = {"initial_state": leaves["initial_state"]} if "initial_state" in leaves else {}
    positional = [t for n, t in leaves.items() if n != "initial_state"]
    start = time.perf_counter()
    with guard():
        o, ht = fn(*positional, **state, output_final_state=True, **kwargs, **(op_kwargs or {}))
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    with guard():
        grads = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), list(leaves.values()))
    if o.is_cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start

    ref_leaves = {n: t.detach().to(ref_dtype).requires_grad_(True) for n, t in leaves.items()}
    ref_state = {"initial_state": ref_leaves["initial_state"]} if state else {}
    ref_o, ref_ht = ref_fn(*[t for n, t in ref_leaves.items() if n != "initial_state"], **ref_state,
                           output_final_state=True, **kwargs)
    ref_grads = torch.autograd.grad((ref_o * do.to(ref_dtype)).sum() + (ref_ht * dht.to(ref_dtype)).sum(),
                                    list(ref_leaves.values()))
    if o.dtype != dtype or ht.dtype != torch.float32:
        raise AssertionError(f"{name}: o is {o.dtype} (expected {dtype}), final_state is {ht.dtype}")
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    errors.update({f"d{n}": relative_error(g, r) for n, g, r in zip(leaves, grads, ref_grads, strict=True)})
    return CaseResult(name, dtype, errors, seconds)


def verify_op(pkg: ModuleType, rec: Recurrence, mode: str, dtype: torch.dtype, *, B: int, T: int, H: int,
              K: int, V: int, device: str = "cpu", cu_seqlens: list[int] | None = None, with_h0: bool = True,
              ref_dtype: torch.dtype = torch.float64,
              guard=contextlib.nullcontext, HV: int | None = None) -> CaseResult:
    """Call ``<mode>_<op>`` on fresh random inputs, then its reference in ``ref_dtype``
    (compare_with_reference).

    Args:
        pkg: the generated package (``generated.<op>``).
        mode: ``chunk`` or ``fused_recurrent``.
        guard: as compare_with_reference.
        HV: value heads of a grouped spec (its inputs on HV and the state [N, HV, K, V]); None means H.

    Returns:
        CaseResult with errors keyed ``o``, ``final_state`` and ``d<input>``.
    """
    op = rec.spec.op
    HV = H if HV is None else HV
    x = sample_inputs(rec, B, T, H, K, V, dtype, device, HV=HV)
    inputs = {i.name: x[i.name] for i in rec.spec.inputs}
    if with_h0:
        N = B if cu_seqlens is None else len(cu_seqlens) - 1
        inputs["initial_state"] = torch.randn(N, HV, K, V, device=device)
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32, device=device)
    return compare_with_reference(getattr(pkg, f"{mode}_{op}"), getattr(pkg, f"{op}_reference"), inputs, dtype,
                                  name=f"{mode}_{op}", guard=guard, ref_dtype=ref_dtype, cu_seqlens=cu)
