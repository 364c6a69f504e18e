"""Host-side validation generated into every public op: a bad input never reaches a kernel.

Each check raises TypeError (wrong kind or dtype) or ValueError (wrong shape or value) with a
message that names the op, the argument, what was expected and what was given. Nothing here
syncs the GPU when the caller passes ``cu_seqlens_cpu``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256

# Layout letters: B, T, H index the batch, the tokens and the query/key heads; G the value heads HV of a
# grouped op (a multiple of H: value head hv reads query/key head hv // (HV / H)); K and V the head dims.
_LETTER_NAMES = {"G": "HV"}
_LAYOUT_DIMS = {layout: "[" + ", ".join(_LETTER_NAMES.get(c, c) for c in layout) + "]"
                for layout in ("BTHK", "BTHV", "BTH", "H", "HK", "HV", "BTGK", "BTGV", "BTG", "G", "GK", "GV")}


@dataclass(frozen=True)
class TensorArg:
    """A tensor argument of a generated op: ``layout`` is one of BTHK, BTHV, BTH, H, HK, HV, or with G (the
    value heads HV) in place of H: BTGK, BTGV, BTG, G, GK, GV; a ``gate`` may be float32 when the other
    inputs are 16-bit. A ``flat`` per-head vector (HK, GK, HV, GV) may also come flattened, e.g. [H * K], as
    fla passes dt_bias: the kernels that read it see the same contiguous memory, and its gradient takes the
    shape it came in."""

    name: str
    layout: str
    optional: bool = False
    gate: bool = False
    flat: bool = False


class CallShape(NamedTuple):
    """The sizes of one validated call. ``N`` sequences (B, or len(cu_seqlens) - 1); ``HV`` value heads (the
    state's and the output's, a multiple of H; == H unless the op's inputs declare value heads).

    A NamedTuple rather than a frozen dataclass: built on every call, it costs ~0.3 us against ~1.5 us.
    """

    B: int
    T: int
    H: int
    K: int
    V: int
    N: int
    dtype: torch.dtype
    cu_seqlens_cpu: torch.Tensor | None  # None only while torch.compile traces a call without it
    HV: int


def _flat_dims(layout: str) -> str:
    """The flat form of a per-head vector layout: HK → ``[H * K]``."""
    return "[" + " * ".join(_LETTER_NAMES.get(c, c) for c in layout) + "]"


def _shape(t: torch.Tensor) -> str:
    return "[" + ", ".join(str(s) for s in t.shape) + "]"


def _expect_tensor(op: str, name: str, value, optional: bool) -> None:
    if value is None and optional:
        return
    if not isinstance(value, torch.Tensor):
        what = "None" if value is None else type(value).__name__
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {what}")


def validate_call(
    op: str,
    args: tuple[TensorArg, ...],
    values: tuple,
    *,
    params: tuple[tuple[str, object], ...],
    initial_state,
    output_final_state,
    cu_seqlens,
    cu_seqlens_cpu,
) -> CallShape:
    """Check every argument of a call and return its sizes.

    Args:
        op: the public function's name, for messages.
        args: the op's tensor arguments in signature order; ``values`` their values.
        params: (name, value) of the op's scalar params (e.g. scale): None or a finite real number.
        initial_state: None or ``[N, HV, K, V]`` float32 (HV = H unless some input is on the value heads).
        cu_seqlens: None or ``[N + 1]`` int32/int64 on the inputs' device, with B == 1.
        cu_seqlens_cpu: optional CPU copy of cu_seqlens; with it, validation never syncs the GPU.
    """
    if cu_seqlens is None and cu_seqlens_cpu is None and not torch.compiler.is_compiling():
        # A dense call's tensor checks depend only on each tensor's shape, dtype and device: a call that repeats
        # an accepted one's skips them (16 us of the checks against 4 for the key, on the CPU machine).
        key = _metadata_key(op, args, values, initial_state)
        if key is not None:
            known = _ACCEPTED.get(key)
            if known is None or known[0] is not args:
                known = (args, _validate_tensors(op, args, values, initial_state, None, None))
                if len(_ACCEPTED) >= _ACCEPTED_MAX:
                    _ACCEPTED.clear()
                _ACCEPTED[key] = known
            _check_scalars(op, params, output_final_state)
            return known[1]
    call = _validate_tensors(op, args, values, initial_state, cu_seqlens, cu_seqlens_cpu)
    _check_scalars(op, params, output_final_state)
    return call


# (op, id of its TensorArg tuple, each tensor's (shape, dtype, device) or None, initial_state's) -> (that tuple,
# the CallShape) of the dense calls accepted so far; cleared when full (a training run sees a handful of shapes).
_ACCEPTED: dict[tuple, tuple[tuple[TensorArg, ...], CallShape]] = {}
_ACCEPTED_MAX = 1024


def _metadata_key(op: str, args: tuple[TensorArg, ...], values: tuple, initial_state) -> tuple | None:
    """What a dense call's tensor checks read, or None where a value is neither None nor a plain torch.Tensor
    (a subclass, a wrong type: the checks run in full)."""
    key: list = [op, id(args)]
    for x in (*values, initial_state):
        if x is None:
            key.append(None)
        elif type(x) is torch.Tensor:
            key.append((x.shape, x.dtype, x.device))
        else:
            return None
    return tuple(key)


def _validate_tensors(op: str, args: tuple[TensorArg, ...], values: tuple, initial_state, cu_seqlens,
                      cu_seqlens_cpu) -> CallShape:
    """validate_call's checks of the tensors, cu_seqlens and initial_state."""
    present = []
    for a, x in zip(args, values, strict=True):
        if x is None and a.optional:
            continue
        if not isinstance(x, torch.Tensor):
            _expect_tensor(op, a.name, x, a.optional)
        present.append((a, x))
    ref_arg, ref = next((a, x) for a, x in present if a.layout in ("BTHK", "BTHV", "BTGK", "BTGV"))
    ref_shape = ref.shape
    if len(ref_shape) != 4:
        raise ValueError(f"{op}: {ref_arg.name} must be {_LAYOUT_DIMS[ref_arg.layout]} (4 dims), "
                         f"got shape {_shape(ref)}")
    B, T, H = ref_shape[0], ref_shape[1], ref_shape[2]
    heads = ref_arg.layout[2]
    sizes = {"B": B, "T": T, heads: H}
    owner = {"B": ref_arg.name, "T": ref_arg.name, heads: ref_arg.name}
    flat = []
    for a, x in present:
        layout, shape = a.layout, x.shape
        if len(shape) != len(layout):
            if a.flat and len(shape) == 1:
                flat.append((a, x))  # checked once every dim's size is known
                continue
            either = f" or flat {_flat_dims(layout)}" if a.flat else ""
            raise ValueError(f"{op}: {a.name} must be {_LAYOUT_DIMS[layout]} ({len(layout)} dims){either}, "
                             f"got shape {_shape(x)}")
        for letter, size in zip(layout, shape, strict=True):
            known = sizes.get(letter)
            if known is None:  # the first tensor with this letter sets its size
                sizes[letter] = size
                owner[letter] = a.name
            elif known != size:
                dim = _LETTER_NAMES.get(letter, letter)
                either = f" or flat {_flat_dims(layout)}" if a.flat else ""
                raise ValueError(f"{op}: {a.name} has {dim} = {size} (shape {_shape(x)}) but {owner[letter]} "
                                 f"has {dim} = {known}; expected {a.name} {_LAYOUT_DIMS[layout]}{either}")
    for a, x in flat:
        expected = math.prod(sizes.get(letter, 0) for letter in a.layout)
        if x.shape[0] != expected:
            sizes_of = ", ".join(f"{_LETTER_NAMES.get(c, c)} = {sizes.get(c)}" for c in a.layout)
            raise ValueError(f"{op}: {a.name} must be {_LAYOUT_DIMS[a.layout]} or flat {_flat_dims(a.layout)} = "
                             f"[{expected}] ({sizes_of}), got shape {_shape(x)}")
    K, V = sizes.get("K"), sizes.get("V")
    H, HV = sizes.get("H"), sizes.get("G")
    if HV is None:
        HV = H
    elif H is None:
        H = HV
    elif H and HV % H:
        raise ValueError(f"{op}: {owner['G']} has HV = {HV} value heads but {owner['H']} has H = {H} heads; HV must be "
                         f"a multiple of H (each query/key head serves HV / H value heads)")
    for letter, size in (("K", K), ("V", V)):
        if size is not None and not 1 <= size <= MAX_HEAD_DIM:
            raise ValueError(f"{op}: head dim {letter} = {size} (from {owner[letter]}) is outside 1..{MAX_HEAD_DIM}, "
                             f"the range the kernels are planned for")
    if T == 0 or B == 0 or H == 0:
        raise ValueError(f"{op}: {ref_arg.name} has an empty dimension (shape {_shape(ref)}); B, T and H must be >= 1")
    if HV == 0:
        raise ValueError(f"{op}: {owner['G']} has no value heads (HV = 0); HV must be >= 1")

    dtype = ref.dtype
    device = ref.device
    for a, x in present:
        x_dtype = x.dtype
        if x_dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: {a.name} must be float16, bfloat16 or float32, got {x_dtype}")
        if a.gate:
            if x_dtype != dtype and x_dtype != torch.float32:
                raise TypeError(f"{op}: gate {a.name} must be float32 or {dtype} (the inputs' dtype), got {x_dtype}")
        elif x_dtype != dtype:
            raise TypeError(f"{op}: {a.name} is {x_dtype} but {ref_arg.name} is {dtype}; inputs must share one dtype")
        if x.device != device:
            raise ValueError(f"{op}: {a.name} is on {x.device} but {ref_arg.name} is on {device}; "
                             f"all tensors must be on one device")

    N = B
    if cu_seqlens is not None or cu_seqlens_cpu is not None:
        cu_seqlens_cpu = _validate_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, B, T, device)
        N = cu_seqlens.shape[0] - 1

    if initial_state is not None:
        _expect_tensor(op, "initial_state", initial_state, False)
        expected = (N, HV, K, V)
        if tuple(initial_state.shape) != expected:
            what = "number of sequences" if cu_seqlens is not None else "batch size"
            heads = "HV" if "G" in sizes else "H"
            raise ValueError(f"{op}: initial_state must be [N, {heads}, K, V] = [{N}, {HV}, {K}, {V}] (N = {what}), "
                             f"got {_shape(initial_state)}")
        if initial_state.dtype != torch.float32:
            raise TypeError(f"{op}: initial_state must be float32 (states are kept in fp32), "
                            f"got {initial_state.dtype}")
        if initial_state.device != device:
            raise ValueError(f"{op}: initial_state is on {initial_state.device} but {ref_arg.name} is on {device}")
    return CallShape(B, T, H, K or 0, V or 0, N, dtype, cu_seqlens_cpu, HV)


def _check_scalars(op: str, params: tuple[tuple[str, object], ...], output_final_state) -> None:
    """validate_call's checks of the scalar params (None or a finite real number) and output_final_state."""
    for name, value in params:
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{op}: {name} must be a float or None, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{op}: {name} must be finite, got {value}")
    if not isinstance(output_final_state, bool):
        raise TypeError(f"{op}: output_final_state must be a bool, got {type(output_final_state).__name__}")


def _validate_cu_seqlens(op, cu_seqlens, cu_seqlens_cpu, B, T, device) -> torch.Tensor:
    if cu_seqlens is None:
        raise ValueError(f"{op}: cu_seqlens_cpu was given without cu_seqlens; pass both")
    _expect_tensor(op, "cu_seqlens", cu_seqlens, False)
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: cu_seqlens must be int32 or int64, got {cu_seqlens.dtype}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"{op}: cu_seqlens must be 1-D [N + 1] with N >= 1, got shape {_shape(cu_seqlens)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{op}: cu_seqlens is on {cu_seqlens.device} but the inputs are on {device}")
    if B != 1:
        raise ValueError(f"{op}: with cu_seqlens the batch must be packed into B = 1, got B = {B}; "
                         f"flatten the batch to [1, total_tokens, ...]")
    if cu_seqlens_cpu is not None:
        _expect_tensor(op, "cu_seqlens_cpu", cu_seqlens_cpu, False)
        if cu_seqlens_cpu.device.type != "cpu":
            raise ValueError(f"{op}: cu_seqlens_cpu must be on the CPU, got {cu_seqlens_cpu.device}")
        if cu_seqlens_cpu.shape != cu_seqlens.shape:
            raise ValueError(f"{op}: cu_seqlens_cpu has shape {_shape(cu_seqlens_cpu)} but cu_seqlens has "
                             f"{_shape(cu_seqlens)}")
    if torch.compiler.is_compiling():
        # Reading values would break the graph: the op checks them when it runs (runtime/torch_op.py).
        return cu_seqlens_cpu
    if cu_seqlens_cpu is None:
        cu_seqlens_cpu = cu_seqlens.detach().to("cpu")  # one sync; pass cu_seqlens_cpu to avoid it
    check_cu_seqlens_values(op, cu_seqlens_cpu.tolist(), T)
    return cu_seqlens_cpu


def check_cu_seqlens_values(op: str, bounds: list[int], T: int) -> None:
    """Raise ValueError unless the offsets ``bounds`` [N + 1] start at 0, never decrease and end at T."""
    if bounds[0] != 0:
        raise ValueError(f"{op}: cu_seqlens must start at 0, got {bounds[0]}")
    for i in range(len(bounds) - 1):
        if bounds[i + 1] < bounds[i]:
            raise ValueError(f"{op}: cu_seqlens must be non-decreasing, got {bounds[i]} then {bounds[i + 1]} at "
                             f"positions {i}, {i + 1}")
    if bounds[-1] != T:
        raise ValueError(f"{op}: cu_seqlens must end at T = {T} (the inputs' length), got {bounds[-1]}")


def validate_gate_lower_bound(op: str, bound) -> None:
    """Check the value of ``gate_lower_bound``: a finite negative number (a log decay) or None."""
    if bound is None:
        return
    if isinstance(bound, bool) or not isinstance(bound, (int, float)):
        raise TypeError(f"{op}: gate_lower_bound must be a float or None, got {type(bound).__name__}")
    if not math.isfinite(bound) or bound >= 0:
        raise ValueError(f"{op}: gate_lower_bound must be a finite negative number (a log decay), got {bound}")


def check_gates_respect_bound(op: str, bound: float, gate_name: str, gate: torch.Tensor | None,
                              head_gate: torch.Tensor | None = None) -> None:
    """Raise ValueError if an entry of the log gate ``gate`` ([B, T, H, K] or [B, T, H]; None: zeros) plus
    ``head_gate`` ([H] added to every token of head h, or None) is below ``bound``.

    The bound lets a plan build the pairwise decays as products of exp factors that a gate below it
    would overflow, so it is checked against the data: one reduction and a device sync (pass the
    bound only where it pays for that, e.g. training at long T).
    """
    if head_gate is not None:
        gate = head_gate if gate is None else gate.float() + head_gate.float()
    lowest = gate.min().item() if gate is not None and gate.numel() else 0.0
    if not lowest >= bound:
        raise ValueError(f"{op}: {gate_name} has an entry {lowest:.6g} below gate_lower_bound={bound}; "
                         f"pass a bound that holds for every token, or none")


def validate_flags(op: str, flags: tuple[tuple[str, object], ...],
                   requires: tuple[tuple[str, str], ...] = ()) -> None:
    """Check the op's boolean params (the switches of guarded transforms): each must be a bool, and a flag
    declared ``requires OTHER`` may be True only with OTHER True (``requires``: (flag, other) pairs)."""
    for name, value in flags:
        if not isinstance(value, bool):
            raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__}")
    values = dict(flags)
    for name, other in requires:
        if values[name] and not values[other]:
            raise ValueError(f"{op}: {name}=True requires {other}=True")


def validate_options(op: str, options: tuple[tuple[str, object, object], ...]) -> None:
    """Check keywords the op accepts with one supported value (a spec's ``option NAME = value`` lines):
    (name, given, supported). Anything but the supported value is refused, never ignored."""
    for name, value, supported in options:
        if supported is None:
            ok = value is None
        elif isinstance(supported, bool):
            ok = isinstance(value, bool) and value == supported
        else:
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and value == supported
        if not ok:
            given = f"<a tensor of shape {_shape(value)}>" if isinstance(value, torch.Tensor) else (
                repr(value) if value is None or isinstance(value, (bool, int, float, str)) else
                f"<a {type(value).__name__}>")
            raise ValueError(f"{op}: {name}={given} is not supported; this op runs only with "
                             f"{name}={supported!r}")


def validate_guarded_inputs(op: str, inputs: tuple[tuple[str, object, str, bool, bool], ...]) -> None:
    """Check the inputs a spec declares ``if FLAG`` (read only by transforms that flag switches on):
    (name, value, flag, flag's value, optional). Given with the flag off is refused rather than ignored;
    absent with it on is refused unless the input is optional (zeros)."""
    for name, value, flag, on, optional in inputs:
        if value is not None and not on:
            raise ValueError(f"{op}: {name} is given but {flag} is False; {name} is read only with {flag}=True")
        if value is None and on and not optional:
            raise ValueError(f"{op}: {name} is required when {flag}=True")
