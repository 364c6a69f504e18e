"""Run a generated op forward and backward and compare it with its derived reference.

Used by the tests (in the interpreter), by ``fla-gen run`` and by the GPU checks, so that
all three measure the same thing: relative norm errors of the output, the final state and
the gradient of every input and of the initial state.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from types import ModuleType

import torch

from fla_gen.canonical import Recurrence
from fla_gen.sample import relative_error, sample_inputs

# Relative-error tolerances (forward, gradients) per input dtype (docs/design.md, Tests: fp32 far under 1e-3).
# fp32 gradients get 5e-4: the gate's and the per-head parameters' gradients are sums over tokens whose rounding
# adds up (dA_log of gated_delta_rule_rope, B=2 T=70 H=2: 6.5e-7 to 1.0e-5 over ten draws against its typical
# size, per_head_gradient_scales; 8.0e-7 to 2.9e-5 against each draw's own norm; its dq ~1e-7).
TOLERANCE = {torch.float32: (1e-4, 5e-4), torch.float16: (5e-3, 1e-2), torch.bfloat16: (1e-2, 2e-2)}


@contextlib.contextmanager
def poisoned_allocations():
    """Make torch.empty, torch.empty_like and Tensor.new_empty return NaN-filled floating tensors while the block
    runs, so that an element a kernel forgets to write shows up as NaN in the result instead of passing by luck
    (with memory that last held the expected values, say). Used by the tests and benchmarks/long_sequence_check.py."""
    originals = (torch.empty, torch.empty_like, torch.Tensor.new_empty)

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    def empty(*args, **kwargs):
        return poison(originals[0](*args, **kwargs))

    def empty_like(*args, **kwargs):
        return poison(originals[1](*args, **kwargs))

    def new_empty(self, *args, **kwargs):
        return poison(originals[2](self, *args, **kwargs))

    torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = originals


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
        CaseResult with errors keyed ``o``, ``final_state`` and ``d<input>``: relative norm errors, a per-head
        input's gradient ([H] or [H, K]) divided by the larger of its norm and its typical norm
        (per_head_gradient_scales).
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
    per_head = [n for n, t in ref_leaves.items() if n != "initial_state" and t.dim() <= 2]
    ref_grads = torch.autograd.grad((ref_o * do.to(ref_dtype)).sum() + (ref_ht * dht.to(ref_dtype)).sum(),
                                    list(ref_leaves.values()), retain_graph=bool(per_head))
    if o.dtype != dtype or ht.dtype != torch.float32:
        raise AssertionError(f"{name}: o is {o.dtype} (expected {dtype}), final_state is {ht.dtype}")
    scales = per_head_gradient_scales(ref_o, ref_ht, {n: ref_leaves[n] for n in per_head})
    errors = {"o": relative_error(o, ref_o), "final_state": relative_error(ht, ref_ht)}
    errors.update({f"d{n}": relative_error(g, r, scales.get(n, 0.0))
                   for n, g, r in zip(leaves, grads, ref_grads, strict=True)})
    return CaseResult(name, dtype, errors, seconds)


def per_head_gradient_scales(ref_o: torch.Tensor, ref_ht: torch.Tensor, per_head: dict[str, torch.Tensor],
                             draws: int = 2) -> dict[str, float]:
    """A typical norm of each per-head input's gradient ([H] or [H, K]: a sum over every token): its root mean
    square over ``draws`` further, independent draws of output weights, through the reference's graph.

    Such a gradient is the sum of B * T contributions of either sign. In some draws it cancels to a small
    value while the op's rounding error, which scales with the contributions, does not: simple_gla's dg_gamma
    at one head and 130 tokens in fp16 read a relative error of 0.046 in one draw, 1.7e-5 to 1.0e-3 in
    twelve others. Its mean square over draws of unit-variance weights is the squared norm of the outputs'
    derivative in it (Hutchinson's estimator), so dividing by the larger of this draw's norm and the estimate
    keeps the error relative to the gradient's size; a gradient that is wrong still reads as wrong, as both
    are norms of the right one. Two draws and this one all cancel by 100x in under one call in a million."""
    if not per_head:
        return {}
    squares = dict.fromkeys(per_head, 0.0)
    for i in range(draws):
        do, dht = torch.randn_like(ref_o), torch.randn_like(ref_ht)
        grads = torch.autograd.grad((ref_o * do).sum() + (ref_ht * dht).sum(), list(per_head.values()),
                                    retain_graph=i + 1 < draws)
        for n, g in zip(per_head, grads, strict=True):
            squares[n] += g.detach().double().square().sum().item() / draws
    return {n: math.sqrt(sq) for n, sq in squares.items()}


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


@dataclass(frozen=True)
class CheckCase:
    """One call of ``fla-gen run``: an op mode at sizes [B, T, H, K, V], dense or with ``cu_seqlens``."""

    mode: str
    B: int
    T: int
    H: int
    K: int
    V: int
    cu_seqlens: tuple[int, ...] | None = None

    @property
    def label(self) -> str:
        """``chunk B=2 T=97 H=2 K=16 V=32`` and the offsets of a varlen call."""
        sizes = f"B={self.B} T={self.T} H={self.H} K={self.K} V={self.V}"
        return f"{self.mode} {sizes}" + (f" cu_seqlens={list(self.cu_seqlens)}" if self.cu_seqlens else "")


def check_cases(chunk_size: int, shape: tuple[int, int, int, int, int] | None = None,
                long: bool = False) -> tuple[CheckCase, ...]:
    """The calls of ``fla-gen run``: both ops, dense and varlen (with an empty sequence), each forward and
    backward with an initial state.

    The default sizes run every kernel in Triton's interpreter within about a minute on two CPU cores: the
    chunk op over a full chunk and a partial one, the token-by-token op over twelve tokens. The interpreter
    runs programs one after another and each tl operation as a Python call, so the recurrent kernels cost a
    fixed time per token and program: rwkv7 at B=2 H=2 K=32 V=48 took 160 ms per token forward and 600 ms
    backward (which walks the sequence three times: forward with checkpoints, each segment recomputed, then
    in reverse), flat from T=8 to T=64, so the former default T=100 spent minutes there. The chunk kernels
    step by chunks of 16 or 64 tokens instead. ``shape`` sets the dense calls of both ops; ``long`` checks
    fla-size tiles (K=32, V=48, two heads) and longer sequences.
    """
    C = chunk_size
    if shape is not None:
        B, T, H, K, V = shape
        cu = (0, T // 3, T // 3, T)
        return (CheckCase("chunk", B, T, H, K, V), CheckCase("chunk", 1, T, H, K, V, cu),
                CheckCase("fused_recurrent", B, T, H, K, V), CheckCase("fused_recurrent", 1, T, H, K, V, cu))
    if long:
        return (CheckCase("chunk", 2, 100, 2, 32, 48), CheckCase("chunk", 1, 100, 2, 32, 48, (0, 37, 37, 100)),
                CheckCase("fused_recurrent", 2, 32, 2, 32, 48),
                CheckCase("fused_recurrent", 1, 32, 2, 32, 48, (0, 13, 13, 32)))
    T = C + C // 2 + 1  # a full chunk and a partial one: the state passes between chunks
    return (CheckCase("chunk", 2, T, 2, 16, 32), CheckCase("chunk", 1, T, 1, 16, 32, (0, C + 3, C + 3, T)),
            CheckCase("fused_recurrent", 2, 12, 2, 16, 32),
            CheckCase("fused_recurrent", 1, 12, 1, 16, 32, (0, 5, 5, 12)))


def run_checks(pkg: ModuleType, rec: Recurrence, dtype: torch.dtype, *, device: str = "cpu",
               shape: tuple[int, int, int, int, int] | None = None, long: bool = False,
               value_heads: int | None = None):
    """Run ``check_cases`` (verify_op on each, with an initial state) and yield each CaseResult as it finishes,
    its name saying the call (mode, sizes, cu_seqlens). ``value_heads``: HV of a grouped spec (with ``shape``,
    a multiple of its H)."""
    from fla_gen.runtime.dispatch import select_plan

    # the chunk size of the plan at the quick sizes' head dim (the gated plans' 64, the DPLR plans' 16)
    plan = select_plan(pkg.chunk.CHUNK_PLANS, torch.device(device), dtype, 32)
    for case in check_cases(plan.chunk_size, shape, long):
        r = verify_op(pkg, rec, case.mode, dtype, B=case.B, T=case.T, H=case.H, K=case.K, V=case.V, device=device,
                      cu_seqlens=list(case.cu_seqlens) if case.cu_seqlens else None, HV=value_heads)
        label = case.label if value_heads is None else f"{case.label} HV={value_heads}"
        yield CaseResult(label, r.dtype, r.errors, r.seconds)
