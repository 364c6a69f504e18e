"""Register a generated op with ``torch.library`` so that torch.compile and CUDA graphs see one opaque op.

Every public generated function (``chunk_<op>``, ``fused_recurrent_<op>``) validates its arguments in
Python and then calls one custom op, ``fla_gen::<public name>``, whose backward is a second custom op,
``fla_gen::<public name>_backward``. The ops take only what ``torch.library`` can carry (tensors,
optional tensors, a float scale, a bool), so the plan is selected inside the op from (device,
dtype, head dim) and the varlen chunk tables are built there from ``cu_seqlens_cpu``.

Fake (meta) implementations are not written by hand: :func:`shape_twin` copies the generated
module's namespace with every Triton kernel replaced by a no-op, and the fake implementation runs
the op's own host code in that copy. Its allocations (outputs, saved tensors, gradients) are the
fake outputs, so the shapes under tracing cannot drift from what the kernels really produce.
"""

from __future__ import annotations

import contextlib
import hashlib
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.autograd.function import once_differentiable
from triton.runtime.jit import KernelInterface

from fla_gen.runtime import launch
from fla_gen.runtime.dispatch import active_plan_override, overridden_plans
from fla_gen.runtime.plan_types import SegmentRule
from fla_gen.runtime.segments import segment_tables
from fla_gen.runtime.tracing import shapes_only, shapes_only_scope
from fla_gen.runtime.validate import check_cu_seqlens_values
from fla_gen.runtime.varlen import prepare_chunk_indices, sequence_chunks

NAMESPACE = "fla_gen"

def _no_launch(*args, **kwargs) -> None:
    return None


class _NoKernel:
    """Stands in for a Triton kernel in a shape twin: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid) -> Callable[..., None]:
        return _no_launch


def shape_twin(namespace: dict) -> dict:
    """A copy of a module namespace whose Triton kernels are no-ops and whose functions read the copy.

    Functions defined in the module are rebound to the copy, so a launcher that calls a helper that
    launches a kernel reaches the no-op too. Nothing global is patched: real calls are untouched.
    """
    twin = dict(namespace)
    for name, value in namespace.items():
        if isinstance(value, KernelInterface):
            twin[name] = _NoKernel()
        elif isinstance(value, types.FunctionType) and value.__globals__ is namespace:
            f = types.FunctionType(value.__code__, twin, value.__name__, value.__defaults__, value.__closure__)
            f.__kwdefaults__ = value.__kwdefaults__
            twin[name] = f
    return twin


def varlen_bounds(op: str, cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None,
                  T: int) -> torch.Tensor | None:
    """The CPU copy of ``cu_seqlens`` [N + 1], its values checked (start 0, non-decreasing, end T).

    The public wrapper skips value checks while torch.compile traces it (reading values would break
    the graph); this runs inside the op, on real tensors, so a bad ``cu_seqlens`` is still a
    ValueError before any kernel. Without ``cu_seqlens_cpu`` it copies ``cu_seqlens`` (one sync).
    """
    if cu_seqlens is None or shapes_only():
        return cu_seqlens_cpu
    cpu = cu_seqlens.detach().to("cpu") if cu_seqlens_cpu is None else cu_seqlens_cpu
    check_cu_seqlens_values(op, cpu.tolist(), T)
    return cpu


def _varlen_tables(op: str, cu_seqlens: torch.Tensor, cu_seqlens_cpu: torch.Tensor | None, chunk_size: int,
                   T: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """chunk_tables of a varlen call, and the CPU copy of its ``cu_seqlens`` (None while only shapes are wanted)."""
    N = cu_seqlens.shape[0] - 1
    if shapes_only():
        nt = -(-T // chunk_size) + N
        return (cu_seqlens.new_empty(nt, 2, dtype=torch.int32), cu_seqlens.new_empty(2 * N + 1, dtype=torch.int32),
                None)
    bounds = varlen_bounds(op, cu_seqlens, cu_seqlens_cpu, T)
    return (*prepare_chunk_indices(bounds, chunk_size, cu_seqlens.device), bounds)


def chunk_tables(op: str, cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None,
                 chunk_size: int, T: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``chunk_indices`` [NT, 2] and ``chunk_offsets`` [2N + 1] (int32; varlen.prepare_chunk_indices) for a varlen
    call, or (None, None).

    While only shapes are wanted (fake tensors carry no values) it returns tables of the largest
    possible NT, ceil(T / BT) + N: they size scratch buffers only, never an output.
    """
    if cu_seqlens is None:
        return None, None
    return _varlen_tables(op, cu_seqlens, cu_seqlens_cpu, chunk_size, T)[:2]


def chunk_and_segment_tables(op: str, cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None,
                             chunk_size: int, q: torch.Tensor, v: torch.Tensor, rule: SegmentRule) -> tuple:
    """``chunk_tables`` plus the call's sequence segments (fla_gen.runtime.segments; None when its sequences
    are walked whole) and its launch.PackedWalks (None for a dense call), for the chunked ops whose state walks
    split long sequences. ``q``: [B, T, HK, K]; ``v``: [B, T, H, V], H the value heads the walks run over;
    ``rule``: the algorithm's SegmentRule."""
    B, T, H, V = v.shape
    K = q.shape[-1]
    if cu_seqlens is None:
        return None, None, segment_tables(B, T, H, K, V, chunk_size, None, None, v.device, rule, shapes_only()), None
    chunk_indices, chunk_offsets, bounds = _varlen_tables(op, cu_seqlens, cu_seqlens_cpu, chunk_size, T)
    segments = segment_tables(B, T, H, K, V, chunk_size, cu_seqlens.shape[0] - 1, bounds, v.device, rule,
                              bounds is None)
    return chunk_indices, chunk_offsets, segments, _packed_walks(bounds, chunk_size, H)


def _packed_walks(bounds: torch.Tensor | None, chunk_size: int, heads: int) -> launch.PackedWalks:
    """The PackedWalks of a packed call over ``heads`` heads from its validated CPU ``cu_seqlens`` (``bounds``).
    While tracing (no values) no work is known: launch.LONGEST_WALK_BOUND."""
    if bounds is None:
        return launch.LONGEST_WALK_BOUND
    seq_chunks = sequence_chunks(bounds.numpy().astype(np.int64), chunk_size)
    return launch.PackedWalks(int(seq_chunks.sum()) * heads, int(seq_chunks.max()) if len(seq_chunks) else 0)


def _placeholder(like: torch.Tensor) -> torch.Tensor:
    # torch.library ops return no None: an absent tensor is an empty float32 tensor.
    return like.new_empty(0, dtype=torch.float32)


def forward_outputs(o: torch.Tensor, final_state: torch.Tensor | None, saved: Sequence[torch.Tensor]) -> list:
    """The forward op's outputs: [o, final_state (or an empty placeholder), *saved]."""
    return [o, _placeholder(o) if final_state is None else final_state, *saved]


def backward_outputs(grads: Sequence[torch.Tensor | None], like: Sequence[torch.Tensor | None]) -> list:
    """The backward op's outputs: one gradient per tensor input (placeholders where the input is None),
    each in its input's dtype (a launcher may accumulate in fp32)."""
    out = []
    for g, x in zip(grads, like, strict=True):
        if x is None or g is None:
            out.append(_placeholder(like[0]))
        else:
            out.append(g if g.dtype == x.dtype else g.to(x.dtype))
    return out


def _may_be_traced() -> bool:
    """Whether this call may be traced or transformed (torch.compile, torch.func, a dispatch mode such
    as FakeTensorMode or make_fx): then only the registered op will do."""
    return (torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active()
            or torch._C._len_torch_dispatch_stack() > 0)


def _gradient_needed(values: Sequence[object]) -> bool | None:
    """Whether a tensor among ``values`` needs a gradient (autograd on and it requires one); None where one is
    not a plain torch.Tensor (a subclass: only the registered op will do). Other values are skipped."""
    grad = torch.is_grad_enabled()
    needed = False
    for a in values:
        if isinstance(a, torch.Tensor):
            if type(a) is not torch.Tensor:
                return None
            needed = needed or (grad and a.requires_grad)
    return needed


def needs_autograd(tensors: Sequence[torch.Tensor | None]) -> bool:
    """Whether a launcher given these tensors must run through its autograd.Function (or registered op): the
    call is traced or transformed, a tensor is not a plain one, or one needs a gradient. Otherwise it may
    launch its forward kernels directly, as :func:`call_op` runs an op's body."""
    return _may_be_traced() or _gradient_needed(tensors) is not False


def call_op(op: Callable, body: Callable, *args) -> list:
    """Run the custom op ``op``, or its body directly where the dispatcher adds nothing.

    The dispatcher costs ~40 us of host time per call (measured on the CPU, kernels stubbed: 84 us
    against 44 us for a decode step), and its autograd wrapper (torch.library's, with pytree
    flattening and schema defaults) ~150 us more per forward and backward. So when nothing is being
    traced or transformed and the arguments are plain tensors, ``body`` — the very function the op
    runs — is called directly, through an autograd.Function with the op's own ``setup_context``
    and backward when a gradient is needed. Called directly without one, it runs under
    ``launch.no_backward``: its launchers may free what only a backward would read. CUDA-graph capture
    works either way.
    """
    if _may_be_traced():
        return op(*args)
    needed = _gradient_needed(args)
    if needed is None:
        return op(*args)
    if needed:
        eager = _EAGER_AUTOGRAD.get(op)
        return op(*args) if eager is None else eager.apply(*args)
    with launch.no_backward():
        return body(*args)


@dataclass(frozen=True)
class OpSignature:
    """The tensors of a launcher, in order, and which of them may be None."""

    tensors: tuple[str, ...]
    optional: tuple[bool, ...]

    def declare(self) -> str:
        return ", ".join(f"Tensor{'?' if opt else ''} {n}" for n, opt in zip(self.tensors, self.optional, strict=True))


# Arguments after the launcher's tensors, shared by every op (torch.library schema syntax).
_TAIL = ("float scale, Tensor? initial_state, bool output_final_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, "
         "float? gate_lower_bound")
_REGISTERED: dict[str, tuple[str, Callable]] = {}
# Forward op -> the autograd.Function that runs its body eagerly with the same autograd (call_op).
_EAGER_AUTOGRAD: dict[Callable, type[torch.autograd.Function]] = {}


def build_hash(namespace: dict, spec_hash: str) -> str:
    """16 hex digits naming the build of a generated module: the sha256 of its source file (``__file__`` in its
    ``namespace``), or ``spec_hash`` where there is no readable file."""
    try:
        return hashlib.sha256(Path(namespace["__file__"]).read_bytes()).hexdigest()[:16]
    except (KeyError, TypeError, OSError):
        return spec_hash[:16]


def define_op(name: str, spec_hash: str, namespace: dict, signature: OpSignature,
              forward: str = "_op_forward", backward: str = "_op_backward") -> Callable:
    """Register ``fla_gen::<name>`` (forward) and ``fla_gen::<name>_backward`` and return the forward op.

    Args:
        name: the public function's name, e.g. ``chunk_gla``.
        spec_hash: the spec's hash, which stands for the build where the module's file cannot be read. A
            second package of the same build (the same generated file, imported from another directory)
            reuses the registered op; any other build is registered as ``<name>_<build hash>`` (an op name
            cannot be registered twice in a process). The build, not the spec: two builds of one spec by
            different compilers (an A/B of a kernel change in one process) must each run their own code.
        namespace: the generated module's ``globals()``.
        signature: the launcher's tensors (``q, k, v, ...``).
        forward: name of ``f(*tensors, scale, initial_state, output_final_state, cu_seqlens,
            cu_seqlens_cpu, gate_lower_bound) -> forward_outputs(...)`` in ``namespace``.
        backward: name of ``f(*tensors, scale, initial_state, output_final_state, cu_seqlens,
            cu_seqlens_cpu, gate_lower_bound, do, dht, saved) -> backward_outputs(...)`` in ``namespace``.

    Returns:
        The forward op: called with the arguments of ``forward``, it returns
        ``[o, final_state or an empty placeholder, *saved]`` and is differentiable in the tensors
        and ``initial_state``.
    """
    build = build_hash(namespace, spec_hash)
    known = _REGISTERED.get(name)
    if known is not None:
        if known[0] == build:
            return known[1]
        name = f"{name}_{build}"
        if name in _REGISTERED:
            return _REGISTERED[name][1]
    n = len(signature.tensors)
    fwd_fn, bwd_fn = namespace[forward], namespace[backward]
    twin: dict = {}

    def in_twin(fn_name: str, *args):
        if not twin:
            twin.update(shape_twin(namespace))
        with shapes_only_scope():
            return twin[fn_name](*args)

    fwd = torch.library.custom_op(f"{NAMESPACE}::{name}", fwd_fn, mutates_args=(),
                                  schema=f"({signature.declare()}, {_TAIL}) -> Tensor[]")
    fwd.register_fake(lambda *args: in_twin(forward, *args))
    bwd = torch.library.custom_op(f"{NAMESPACE}::{name}_backward", bwd_fn, mutates_args=(),
                                  schema=f"({signature.declare()}, {_TAIL}, Tensor do, Tensor? dht, "
                                         f"Tensor[] saved) -> Tensor[]")
    bwd.register_fake(lambda *args: in_twin(backward, *args))

    def save_context(ctx, inputs, output):
        tensors, (scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu, bound) = inputs[:n], inputs[n:]
        ctx.save_for_backward(*tensors, initial_state, cu_seqlens, cu_seqlens_cpu, *output[2:])
        ctx.scale, ctx.output_final_state, ctx.gate_lower_bound = scale, output_final_state, bound
        # No zero gradients for the outputs nobody used (the saved tensors, often final_state): each
        # would cost a memset as large as the output. differentiate handles the None.
        ctx.set_materialize_grads(False)
        o = output[0]
        ctx.o_meta = (o.shape, o.dtype, o.device)
        # the backward op selects its plan again: under the forward's plan override, if any
        ctx.plan_override = active_plan_override()

    def differentiate(ctx, grads):
        *tensors, initial_state, cu_seqlens, cu_seqlens_cpu = ctx.saved_tensors[:n + 3]
        saved = list(ctx.saved_tensors[n + 3:])
        do, dht = grads[0], grads[1] if ctx.output_final_state else None
        if do is None:  # only final_state was used: o's gradient is zero
            shape, dtype, device = ctx.o_meta
            do = torch.zeros(shape, dtype=dtype, device=device)
        # dht None (final_state unused) means a zero gradient to the kernels: nothing to read.
        with overridden_plans(ctx.plan_override) if ctx.plan_override else contextlib.nullcontext():
            out = call_op(bwd, bwd_fn, *tensors, ctx.scale, initial_state, ctx.output_final_state, cu_seqlens,
                          cu_seqlens_cpu, ctx.gate_lower_bound, do.contiguous(),
                          None if dht is None else dht.contiguous(), saved)
        # One gradient per forward input: the tensors, then scale, initial_state and the rest.
        dx = [None if x is None else g for x, g in zip(tensors, out[:n], strict=True)]
        dh0 = None if initial_state is None else out[n]
        return (*dx, None, dh0, None, None, None, None)

    fwd.register_autograd(differentiate, setup_context=save_context)

    # fla_gen::<name> with its autograd, run eagerly without the dispatcher (call_op). forward takes
    # ctx rather than a separate setup_context: apply() then skips binding the arguments to forward's
    # signature with inspect (~8 us a call).
    def eager_forward(ctx, *args):
        output = tuple(fwd_fn(*args))
        save_context(ctx, args, output)
        return output

    @once_differentiable  # as the op: its backward op has no autograd of its own
    def eager_backward(ctx, *grads):
        return differentiate(ctx, grads)

    _EAGER_AUTOGRAD[fwd] = type(f"{name}_eager", (torch.autograd.Function,), {
        "forward": staticmethod(eager_forward), "backward": staticmethod(eager_backward)})
    _REGISTERED[name] = (build, fwd)
    return fwd
