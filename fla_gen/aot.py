"""Ahead-of-time compile check: compile, without a GPU, exactly the kernels a real call launches.

A generated op is plain Python that launches Triton kernels (``kernel[grid](*args, BT=..., num_warps=4)``)
from host launchers. This module

1. runs a zero-argument ``call`` (which calls generated ops on small CPU tensors) with Triton's launch
   path intercepted, so no kernel runs, and records every launch (:func:`capture_launches`);
2. specializes each launch exactly as ``JITFunction.run`` would on a GPU, reusing Triton's own binder
   (:func:`specialize`, :func:`signature_of`);
3. compiles it with ``triton.compile(ASTSource(...), target=GPUTarget("cuda", cap, 32))`` for each target
   and summarises the result (:func:`compile_launch`, :func:`compile_matrix`);
4. checks the summary against the hardware (:data:`ARCH_LIMITS`, :func:`check_report`): shared memory
   within the per-block limit, and no MMA -> MMA layout conversion off Ampere (docs/design.md, "Avoiding
   MMA->MMA conversions").

Kernels must have been decorated with ``TRITON_INTERPRET`` unset: under the interpreter ``@triton.jit``
yields an ``InterpretedFunction``, which cannot be compiled. The command line entry point runs in its own
process and drops the variable before importing anything::

    python -m fla_gen.aot --call tests.aot_calls:chunk_ops --caps 80,89,90,100 --json aot.json

It prints one row per (kernel specialization, target), writes the reports as JSON, and exits 1 when any
check fails (2 when nothing could be captured).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import inspect
import io
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

import torch
import triton
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend, get_ptxas, sm_arch_from_capability
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction, create_function_from_signature

DEFAULT_CAPS: tuple[int, ...] = (80, 89, 90, 100)

# --------------------------------------------------------------------------------------------------
# Hardware facts
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchLimits:
    """What one compute capability allows a single kernel (thread block / CTA).

    ``max_shared_bytes`` is the opt-in maximum of dynamic shared memory per block
    (``cudaDevAttrMaxSharedMemoryPerBlockOptin``), the number Triton compares ``metadata.shared``
    against when it loads a kernel. ``mma_to_mma_ok`` says whether a ``convert_layout`` between two
    different ``nvidia_mma`` encodings is acceptable on this target.
    """

    cap: int
    name: str
    max_shared_bytes: int
    mma_to_mma_ok: bool
    source: str


# Per-block shared memory is the SM's largest carveout less the 1 KB that CUDA reserves per block.
# Sources (NVIDIA documentation):
#   [PG8]  CUDA C++ Programming Guide, "Shared Memory" for compute capability 8.x
#          (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#shared-memory-8-x): "Devices of compute
#          capability 8.0 and 8.7 allow a single thread block to address up to 163 KB of shared memory,
#          while devices of compute capabilities 8.6 and 8.9 allow up to 99 KB of shared memory."
#   [AMP]  Ampere Tuning Guide §1.4.2.3 (https://docs.nvidia.com/cuda/ampere-tuning-guide/): A100 carveout
#          up to 164 KB per SM; "CUDA reserves 1 KB of shared memory per thread block".
#   [PG9]  CUDA C++ Programming Guide, "Shared Memory" for compute capability 9.0
#          (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#shared-memory-9-0): carveout up to 228 KB;
#          "Devices of compute capability 9.0 allow a single thread block to address up to 227 KB".
#   [BW]   Blackwell Tuning Guide §1.4.2.3 (https://docs.nvidia.com/cuda/blackwell-tuning-guide/): "the B200
#          GPU enables a single thread block to address up to 227 KB of shared memory".
#   CUTLASS agrees in bytes: sm90_smem_capacity_bytes = sm100_smem_capacity_bytes = 232448
#   (cutlass/gemm/collective/builders/sm90_common.inl, cutlass/arch/arch.h).
# MMA -> MMA: allowed on Ampere (sm80) only (docs/design.md, "Avoiding MMA->MMA conversions").
ARCH_LIMITS: dict[int, ArchLimits] = {
    80: ArchLimits(
        cap=80,
        name="sm80 (A100)",
        max_shared_bytes=163 * 1024,  # 166912
        mma_to_mma_ok=True,
        source="163 KB per block on cc 8.0 [CUDA C++ Programming Guide, shared memory 8.x]",
    ),
    89: ArchLimits(
        cap=89,
        name="sm89 (Ada: L4, L40S, RTX 4090)",
        max_shared_bytes=99 * 1024,  # 101376
        mma_to_mma_ok=False,
        source="99 KB per block on cc 8.6 / 8.9 [CUDA C++ Programming Guide, shared memory 8.x]",
    ),
    90: ArchLimits(
        cap=90,
        name="sm90 (H100 / H200)",
        max_shared_bytes=227 * 1024,  # 232448
        mma_to_mma_ok=False,
        source="227 KB per block on cc 9.0 [CUDA C++ Programming Guide, shared memory 9.0]",
    ),
    100: ArchLimits(
        cap=100,
        name="sm100 (B200)",
        max_shared_bytes=227 * 1024,  # 232448
        mma_to_mma_ok=False,
        source="227 KB per block on B200 [Blackwell Tuning Guide 1.4.2.3]",
    ),
}

# --------------------------------------------------------------------------------------------------
# Capture
# --------------------------------------------------------------------------------------------------


class AotCaptureError(RuntimeError):
    """The launches of a call could not be captured for ahead-of-time compilation."""


@dataclass(frozen=True)
class DeviceTensorStandIn:
    """What a launch records in place of a tensor: its dtype and a GPU-like address.

    Only the dtype and the pointer's alignment reach the compiler. CUDA allocations are aligned far
    beyond 16 bytes (``cudaMalloc``: 256 B; PyTorch's caching allocator: 512 B blocks), so a tensor's
    device address is exactly as aligned as ``storage_offset * element_size``; the CPU buffer's own
    address (64-byte aligned by PyTorch, arbitrary from ``numpy``) must not decide it. Triton's native
    specializer accepts any object with ``dtype`` and ``data_ptr()``.
    """

    dtype: torch.dtype
    offset_bytes: int

    def data_ptr(self) -> int:
        """A GPU-like address: an aligned base plus the tensor's byte offset into its storage."""
        return _DEVICE_BASE_ADDRESS + self.offset_bytes


_DEVICE_BASE_ADDRESS = 1 << 40


@dataclass(frozen=True)
class KernelLaunch:
    """One intercepted ``kernel[grid](*args, **kwargs)``.

    ``args`` and ``kwargs`` are as passed, with tensors replaced by :class:`DeviceTensorStandIn`;
    ``kwargs`` holds constexpr arguments and launch options (``num_warps``, ``num_stages``, ...) alike.
    ``grid`` is the launch grid when it could be evaluated.
    """

    kernel: JITFunction
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]
    grid: tuple[int, ...] | None

    @property
    def name(self) -> str:
        """The kernel's Python name."""
        return self.kernel.fn.__name__

    @property
    def options(self) -> dict[str, Any]:
        """The launch options passed explicitly (keyword arguments that are not kernel parameters)."""
        params = set(self.kernel.arg_names)
        return {k: v for k, v in self.kwargs if k not in params}


def capture_launches(call: Callable[[], object]) -> list[KernelLaunch]:
    """Run ``call()`` with Triton launches intercepted and return the distinct launches, in order.

    No kernel runs: outputs stay as allocated (``torch.empty`` garbage), which host code may read.
    Launches that would compile to the same kernel (same specialization and options) are kept once.
    An autotuned kernel contributes one launch per config. Raises :class:`AotCaptureError` when a
    kernel was decorated under ``TRITON_INTERPRET=1`` (an ``InterpretedFunction``).
    """
    require_compiled_mode()
    launches: list[KernelLaunch] = []
    with intercept_launches(launches):
        call()
    return dedupe_launches(launches)


def require_compiled_mode() -> None:
    """Raise :class:`AotCaptureError` unless Triton runs in compiled (not interpreter) mode.

    ``@triton.jit`` checks ``TRITON_INTERPRET`` when it decorates, so Triton's own library kernels are
    interpreted functions if the variable was set when ``triton`` was imported, even if it is unset now.
    """
    from triton.language import standard

    if knobs.runtime.interpret or not isinstance(standard.cdiv, JITFunction):
        raise AotCaptureError(
            "Triton is in interpreter mode (TRITON_INTERPRET=1 when it was imported): kernels cannot be"
            " compiled ahead of time in this process. Run `python -m fla_gen.aot --call MODULE:FUNC` (it"
            " drops the variable) or a subprocess whose environment does not set it."
        )


@contextlib.contextmanager
def intercept_launches(sink: list[KernelLaunch]) -> Iterator[None]:
    """Within the block, record each Triton launch into ``sink`` instead of running it."""
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction

    def record(self: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        sink.append(make_launch(self, args, kwargs, grid))

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise AotCaptureError(
            f"kernel {self.fn.__module__}.{self.fn.__qualname__} is an InterpretedFunction: it was decorated"
            " with TRITON_INTERPRET=1, so it cannot be compiled. Capture in a fresh process without"
            " TRITON_INTERPRET, e.g. `python -m fla_gen.aot --call MODULE:FUNC`."
        )

    def every_config(self: Autotuner, *args: Any, **kwargs: Any) -> None:
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    saved = (JITFunction.run, InterpretedFunction.run, Autotuner.run)
    JITFunction.run, InterpretedFunction.run, Autotuner.run = record, refuse, every_config
    try:
        yield
    finally:
        JITFunction.run, InterpretedFunction.run, Autotuner.run = saved


def make_launch(kernel: JITFunction, args: Sequence[Any], kwargs: dict[str, Any], grid: Any) -> KernelLaunch:
    """Record one launch, tensors replaced by stand-ins."""
    args = tuple(stand_in(a) for a in args)
    kwargs = {k: stand_in(v) for k, v in kwargs.items()}
    return KernelLaunch(kernel, args, tuple(kwargs.items()), evaluate_grid(kernel, grid, args, kwargs))


def stand_in(value: Any) -> Any:
    """Replace tensors (also inside tuples) by :class:`DeviceTensorStandIn`; keep everything else."""
    if isinstance(value, torch.Tensor):
        return DeviceTensorStandIn(value.dtype, value.storage_offset() * value.element_size())
    if isinstance(value, tuple):
        items = [stand_in(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    return value


def evaluate_grid(
    kernel: JITFunction, grid: Any, args: Sequence[Any], kwargs: dict[str, Any]
) -> tuple[int, ...] | None:
    """The launch grid as a tuple; a callable grid gets the bound arguments, as ``JITFunction.run`` does."""
    try:
        if callable(grid):
            params = set(kernel.arg_names)
            bound = kernel.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in params})
            bound.apply_defaults()
            grid = grid(dict(bound.arguments))
        return tuple(int(g) for g in grid)
    except Exception:  # the grid is informative only; a launch without one still compiles
        return None


def dedupe_launches(launches: Sequence[KernelLaunch]) -> list[KernelLaunch]:
    """Keep the first launch of each distinct (kernel, specialization, options)."""
    seen: set[tuple[int, str]] = set()
    kept = []
    for launch in launches:
        key = (id(launch.kernel), specialization_key(launch))
        if key not in seen:
            seen.add(key)
            kept.append(launch)
    return kept


# --------------------------------------------------------------------------------------------------
# Specialization
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Specialization:
    """What ``JITFunction.run`` hands to ``ASTSource`` and ``triton.compile`` for one launch.

    ``signature`` maps every parameter name to its Triton type string (``"*bf16"``, ``"i32"``,
    ``"constexpr"``, ...); ``constexprs`` and ``attrs`` are keyed by argument path (a tuple of indices,
    as Triton keys them); ``attrs`` holds ``[["tt.divisibility", 16]]`` for 16-divisible ints and
    16-byte-aligned pointers; ``options`` are the parsed backend options.
    """

    signature: dict[str, Any]
    constexprs: dict[tuple[int, ...], Any]
    attrs: dict[tuple[int, ...], list[list[Any]]]
    options: dict[str, Any]


def specialize(launch: KernelLaunch, cap: int = 90) -> Specialization:
    """Specialize ``launch`` for ``sm<cap>`` with Triton's own binder, as ``JITFunction.run`` does.

    The binder (``create_function_from_signature``) applies Triton's rules: tensors become ``*<dtype>``
    pointers (``*k<dtype>`` for ``const`` params), ints ``i32`` / ``i64`` / ``u64`` by range, an int
    equal to 1 and ``None`` become constexprs, floats ``fp32``, bools ``u1``, ``tl.constexpr`` params
    constexprs; ``do_not_specialize`` / annotations are honoured. The packing that follows mirrors
    ``JITFunction.run`` / ``_pack_args`` of Triton 3.6.
    """
    from triton._utils import find_paths_if, get_iterable_path

    kernel = launch.kernel
    backend = CUDABackend(GPUTarget("cuda", cap, 32))
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", kernel.debug) or knobs.runtime.debug
    instrumentation = getattr(knobs.compilation, "instrumentation_mode", None)
    if instrumentation is not None:
        kwargs["instrumentation_mode"] = instrumentation
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound_args, specialization, _ = binder(*launch.args, **kwargs)
    options = backend.parse_options(kwargs)
    names = [p.name for p in kernel.params]
    unknown = [k for k in kwargs if k not in options.__dict__ and k not in names]
    if unknown:
        raise KeyError(f"{kernel.fn.__name__}: keyword argument(s) {unknown} were specified but unrecognised")
    types = [s[0] for s in specialization]
    values = list(bound_args.values())
    constexpr_paths = find_paths_if(types, lambda _, t: t == "constexpr")
    constexprs = {p: get_iterable_path(values, p) for p in constexpr_paths}
    hints = [s[1] for s in specialization]
    attrs = {
        p: backend.parse_attr(get_iterable_path(hints, p))
        for p in find_paths_if(hints, lambda _, h: isinstance(h, str))
    }
    return Specialization(dict(zip(names, types, strict=True)), constexprs, attrs, dict(options.__dict__))


def signature_of(launch: KernelLaunch, cap: int = 90) -> tuple[dict[str, Any], dict[tuple[int, ...], Any]]:
    """The (signature, constexprs) pair of ``launch``; see :func:`specialize` for the rules."""
    spec = specialize(launch, cap)
    return spec.signature, spec.constexprs


def specialization_key(launch: KernelLaunch) -> str:
    """A string that is equal for two launches exactly when they compile to the same kernel."""
    spec = specialize(launch)
    return repr((spec.signature, spec.constexprs, spec.attrs, sorted(spec.options.items())))


def describe_launch(launch: KernelLaunch) -> str:
    """A short readable label: name, pointer dtypes, scalar constexprs, warps and stages."""
    try:
        spec = specialize(launch)
    except Exception:  # an unbindable launch still needs a name in the report
        return launch.name
    names = list(spec.signature)
    consts = [f"{names[p[0]]}={v}" for p, v in spec.constexprs.items() if len(p) == 1 and v is not None]
    pointers = [t for t in spec.signature.values() if isinstance(t, str) and t.startswith("*")]
    dtypes = sorted({t.lstrip("*k") for t in pointers})
    return (
        f"{launch.name}[{','.join(dtypes)}]({', '.join(consts)})"
        f" w{spec.options['num_warps']}s{spec.options['num_stages']}"
    )


# --------------------------------------------------------------------------------------------------
# TTGIR / ptxas parsing (pure functions on text)
# --------------------------------------------------------------------------------------------------

_ALIAS = re.compile(r"^(#[\w.$-]+)\s*=\s*(.+?)\s*$", re.MULTILINE)
_NVIDIA_MMA = "#ttg.nvidia_mma<"


def encoding_aliases(ttgir: str) -> dict[str, str]:
    """The attribute aliases defined at the top of a TTGIR module: ``{"#mma1": "#ttg.nvidia_mma<...>"}``."""
    return {m.group(1): m.group(2) for m in _ALIAS.finditer(ttgir)}


def tensor_types(text: str) -> list[str]:
    """Every ``tensor<...>`` type in ``text``, brackets matched (inline encodings nest ``<{...}>``)."""
    found = []
    start = text.find("tensor<")
    while start >= 0:
        depth, i = 0, start + len("tensor")
        for i in range(start + len("tensor"), len(text)):
            depth += {"<": 1, ">": -1}.get(text[i], 0)
            if depth == 0:
                break
        found.append(text[start : i + 1])
        start = text.find("tensor<", i + 1)
    return found


def tensor_encoding(tensor_type: str) -> str | None:
    """The layout encoding of ``tensor<64x64xf32, #mma>`` (``"#mma"``), or None when it has none."""
    inner = tensor_type[len("tensor<") : -1]
    depth, last_comma = 0, -1
    for i, ch in enumerate(inner):
        if ch in "<{[(":
            depth += 1
        elif ch in ">}])":
            depth -= 1
        elif ch == "," and depth == 0:
            last_comma = i
    encoding = inner[last_comma + 1 :].strip() if last_comma >= 0 else ""
    return encoding if encoding.startswith("#") else None


def resolve_encoding(encoding: str, aliases: dict[str, str]) -> str:
    """The definition behind an alias such as ``#mma1``; an inline encoding is returned as is."""
    return aliases.get(encoding, encoding)


def _mma_version(definition: str) -> int | None:
    m = re.search(r"versionMajor\s*=\s*(\d+)", definition)
    return int(m.group(1)) if m else None


def mma_to_mma_conversions(ttgir: str) -> tuple[str, ...]:
    """The ``ttg.convert_layout`` ops whose source and result are two different ``nvidia_mma`` layouts,
    except between two MMA v2 (Ampere-style ``mma.sync``) layouts: Triton lowers those on every
    target that uses v2 (sm80, sm86, sm89); what fails off Ampere ("mma -> mma layout conversion is
    only supported on Ampere") is a conversion that involves another version (wgmma's v3).

    Returns the offending lines (without their ``loc(...)``), in order; empty when there is none.
    """
    aliases = encoding_aliases(ttgir)
    found = []
    for line in ttgir.splitlines():
        if "ttg.convert_layout" not in line:
            continue
        op = line.split(" loc(")[0].strip()
        types = tensor_types(op.split("ttg.convert_layout", 1)[1])
        if len(types) < 2:
            continue
        src, dst = tensor_encoding(types[0]), tensor_encoding(types[-1])
        if src is None or dst is None:
            continue
        src_def, dst_def = resolve_encoding(src, aliases), resolve_encoding(dst, aliases)
        if src_def.startswith(_NVIDIA_MMA) and dst_def.startswith(_NVIDIA_MMA) and src_def != dst_def:
            if _mma_version(src_def) == _mma_version(dst_def) == 2:
                continue
            found.append(op)
    return tuple(found)


def uses_wgmma(ttgir: str, ptx: str = "") -> bool:
    """Whether the kernel issues Hopper warp-group MMAs (``ttng.warp_group_dot`` / PTX ``wgmma``)."""
    return "ttng.warp_group_dot" in ttgir or "wgmma.mma_async" in ptx


# A non-vector global load of one or two bytes: what a 16-bit tile's load becomes when its mask varies along the
# contiguous dim (docs/design.md, "Kernel conventions: triangular tiles load whole rows").
_NARROW_LOAD = re.compile(r"\bld\.global\S*?\.[bsu](?:8|16)\s")


def narrow_global_loads(ptx: str) -> int:
    """How many one- or two-byte global loads (not vectors) the PTX issues, counted statically (each load
    instruction once, loops not unrolled): per-element loads of 16-bit tiles, a sign of a load mask that
    breaks the tile's rows (a [64, 64] tile under a triangular mask on 4 warps: 32 per thread)."""
    return sum(1 for line in ptx.splitlines() if ".v2." not in line and ".v4." not in line
               and _NARROW_LOAD.search(line))


# ex2.approx.f32 without .ftz: what tl.exp on fp32 becomes. Its denormal handling adds instructions around each
# MUFU.EX2; the templates' exp_ftz (fla_gen/runtime/triton_math.py) is ex2.approx.ftz.f32.
_DENORMAL_EX2 = re.compile(r"\bex2\.approx\.f32\s")


def denormal_exps(ptx: str) -> int:
    """How many ex2.approx.f32 instructions (the non-flushing form of tl.exp) the PTX issues, counted
    statically."""
    return sum(1 for line in ptx.splitlines() if _DENORMAL_EX2.search(line))


def uses_tcgen05(ttgir: str) -> bool:
    """Whether the kernel issues Blackwell ``tcgen05`` MMAs (``ttng.tc_gen5_mma``)."""
    return "ttng.tc_gen5_mma" in ttgir


@dataclass(frozen=True)
class PtxasUsage:
    """Register and spill figures from ``ptxas -v``; None where the log did not say."""

    registers: int | None
    spill_stores: int | None
    spill_loads: int | None


def parse_ptxas_log(log: str) -> PtxasUsage:
    """Read ``Used N registers`` and ``N bytes spill stores, M bytes spill loads`` from a ptxas log."""
    regs = [int(m) for m in re.findall(r"Used (\d+) registers", log)]
    spill_re = r"(\d+) bytes spill stores, (\d+) bytes spill loads"
    spills = [(int(s), int(ld)) for s, ld in re.findall(spill_re, log)]
    return PtxasUsage(
        max(regs) if regs else None,
        sum(s for s, _ in spills) if spills else None,
        sum(ld for _, ld in spills) if spills else None,
    )


# --------------------------------------------------------------------------------------------------
# Compile
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompiledKernelReport:
    """The outcome of compiling one launch for one target.

    ``error`` is None on success; then ``shared_bytes`` is ``metadata.shared``, ``mma_to_mma`` the
    offending ``convert_layout`` lines, ``registers`` / ``spill_*`` come from ``ptxas -v`` (None when it
    could not be read), ``narrow_loads`` / ``denormal_exps`` count PTX instructions (narrow_global_loads,
    denormal_exps), and ``ttgir`` is the TTGIR text for debugging.
    """

    kernel: str
    launch: str
    cap: int
    error: str | None = None
    shared_bytes: int = 0
    num_warps: int = 0
    num_stages: int = 0
    mma_to_mma: tuple[str, ...] = ()
    uses_wgmma: bool = False
    uses_tcgen05: bool = False
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    narrow_loads: int = 0
    denormal_exps: int = 0
    ttgir: str = ""

    @property
    def ok(self) -> bool:
        """Whether the kernel compiled."""
        return self.error is None


def compile_launch(launch: KernelLaunch, cap: int) -> CompiledKernelReport:
    """Compile ``launch`` for ``GPUTarget("cuda", cap, 32)`` and summarise it.

    A compiler error does not raise: it is the report's ``error``.
    """
    label = describe_launch(launch)
    try:
        spec = specialize(launch, cap)
        compiled, log = compile_specialization(launch.kernel, spec, cap)
    except Exception as exc:  # any compiler failure is a finding of the check, not a crash of the tool
        return failed_report(launch, cap, f"{type(exc).__name__}: {exc}")
    ttgir, ptx = compiled.asm["ttgir"], compiled.asm["ptx"]
    usage = parse_ptxas_log(log or ptxas_log(ptx, cap))
    meta = compiled.metadata
    return CompiledKernelReport(
        kernel=launch.kernel.fn.__qualname__,
        launch=label,
        cap=cap,
        shared_bytes=int(meta.shared),
        num_warps=int(meta.num_warps),
        num_stages=int(meta.num_stages),
        mma_to_mma=mma_to_mma_conversions(ttgir),
        uses_wgmma=uses_wgmma(ttgir, ptx),
        uses_tcgen05=uses_tcgen05(ttgir),
        registers=usage.registers,
        spill_stores=usage.spill_stores,
        spill_loads=usage.spill_loads,
        narrow_loads=narrow_global_loads(ptx),
        denormal_exps=denormal_exps(ptx),
        ttgir=ttgir,
    )


def failed_report(launch: KernelLaunch, cap: int, error: str) -> CompiledKernelReport:
    """The report of a launch that did not compile for ``sm<cap>``."""
    return CompiledKernelReport(launch.kernel.fn.__qualname__, describe_launch(launch), cap, error=error)


def compile_specialization(kernel: JITFunction, spec: Specialization, cap: int) -> tuple[Any, str]:
    """``triton.compile`` one specialization; returns the compiled kernel and the ptxas log.

    The log is captured from Triton's own ptxas run (``TRITON_DUMP_PTXAS_LOG``); it is empty when the
    kernel came from Triton's cache.
    """
    src = ASTSource(kernel, spec.signature, spec.constexprs, spec.attrs)
    out = io.StringIO()
    with knobs.nvidia.scope(), contextlib.redirect_stdout(out):
        knobs.nvidia.dump_ptxas_log = True
        compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32), options=spec.options)
    return compiled, out.getvalue()


def ptxas_log(ptx: str, cap: int) -> str:
    """Run the ptxas that Triton ships with ``-v`` on ``ptx``; its log, or "" when it cannot run."""
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [
            get_ptxas(cap).path,
            "-v",
            f"--gpu-name={sm_arch_from_capability(cap)}",
            src,
            "-o",
            os.path.join(tmp, "kernel.cubin"),
        ]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
        except (OSError, subprocess.CalledProcessError):
            return ""


_POOL_LAUNCHES: list[KernelLaunch] = []


def _compile_nth(index: int, cap: int) -> CompiledKernelReport:
    """Worker of :func:`compile_all` (forked: it reads the launches its parent left in a global)."""
    return compile_launch(_POOL_LAUNCHES[index], cap)


def compile_all(launches: Sequence[KernelLaunch], caps: Sequence[int], jobs: int = 1) -> list[CompiledKernelReport]:
    """Compile every launch for every cap, launch-major; with ``jobs > 1`` in forked worker processes.

    Workers also contain a compiler crash (an abort in MLIR or ptxas): instead of killing the tool, it
    fails the entries that had not finished.
    """
    work = [(i, cap) for i in range(len(launches)) for cap in caps]
    if jobs <= 1:
        return [compile_launch(launches[i], cap) for i, cap in work]
    _POOL_LAUNCHES[:] = launches
    reports = []
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            futures = [pool.submit(_compile_nth, i, cap) for i, cap in work]
            for (i, cap), fut in zip(work, futures, strict=True):
                try:
                    reports.append(fut.result())
                except BrokenProcessPool as exc:
                    reports.append(failed_report(launches[i], cap, f"compiler process died: {exc}"))
    finally:
        _POOL_LAUNCHES.clear()
    return reports


def compile_matrix(
    call: Callable[[], object], caps: Sequence[int] = DEFAULT_CAPS, jobs: int = 1
) -> list[CompiledKernelReport]:
    """Capture the launches of ``call()`` and compile each for every target in ``caps``."""
    return compile_all(capture_launches(call), caps, jobs)


# --------------------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------------------


def check_report(report: CompiledKernelReport, limits: dict[int, ArchLimits] = ARCH_LIMITS) -> list[str]:
    """The problems of one report (empty when it passes): compile failure, shared memory over the
    per-block limit of its target, MMA -> MMA layout conversion on a target that must not have one."""
    where = f"{report.launch} on sm{report.cap}"
    if not report.ok:
        return [f"{where}: compile failed: {report.error}"]
    problems = []
    arch = limits.get(report.cap)
    if arch is None:
        return [f"{where}: no limits known for sm{report.cap} (known: {sorted(limits)})"]
    if report.shared_bytes > arch.max_shared_bytes:
        problems.append(
            f"{where}: shared memory {report.shared_bytes} B exceeds the {arch.max_shared_bytes} B per-block"
            f" limit of {arch.name} ({arch.source})"
        )
    if report.mma_to_mma and not arch.mma_to_mma_ok:
        problems.append(
            f"{where}: {len(report.mma_to_mma)} MMA -> MMA layout conversion(s), which {arch.name} must not"
            f" have (docs/design.md): {report.mma_to_mma[0]}"
        )
    return problems


def report_to_dict(report: CompiledKernelReport, include_ttgir: bool = False) -> dict[str, Any]:
    """A JSON-ready dict of the report, with its problems; the TTGIR only when asked."""
    data = dataclasses.asdict(report)
    data["mma_to_mma"] = list(report.mma_to_mma)
    data["problems"] = check_report(report)
    if not include_ttgir:
        del data["ttgir"]
    return data


def format_table(reports: Sequence[CompiledKernelReport]) -> str:
    """One row per report: launch, target, warps, shared memory vs limit, registers, spills, flags."""
    head = ("launch", "sm", "warps", "smem B", "limit B", "regs", "spill B", "wgmma", "mma->mma", "status")
    rows = [head]
    for r in reports:
        limit = ARCH_LIMITS[r.cap].max_shared_bytes if r.cap in ARCH_LIMITS else "?"
        spill = "?" if r.spill_stores is None else (r.spill_stores or 0) + (r.spill_loads or 0)
        status = "ok" if not check_report(r) else ("FAILED" if not r.ok else "PROBLEM")
        rows.append(
            (
                r.launch,
                str(r.cap),
                str(r.num_warps),
                str(r.shared_bytes),
                str(limit),
                "?" if r.registers is None else str(r.registers),
                str(spill),
                "yes" if r.uses_wgmma else "-",
                str(len(r.mma_to_mma)),
                status,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


# --------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------


def load_call(spec: str) -> Callable[[], object]:
    """Import ``MODULE:FUNC`` and return the function."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"--call expects MODULE:FUNC, got {spec!r}")
    func = getattr(importlib.import_module(module_name), func_name, None)
    if func is None:
        raise ValueError(f"--call: module {module_name!r} has no attribute {func_name!r}")
    if not callable(func) or inspect.signature(func).parameters:
        raise ValueError(f"{spec} must be a function that takes no arguments")
    return func


def parse_caps(text: str) -> tuple[int, ...]:
    """``"80,89,90,100"`` -> ``(80, 89, 90, 100)``; unknown targets are an error."""
    caps = tuple(int(c) for c in text.split(",") if c.strip())
    unknown = [c for c in caps if c not in ARCH_LIMITS]
    if not caps or unknown:
        raise ValueError(f"--caps: unknown target(s) {unknown or text!r}; known: {sorted(ARCH_LIMITS)}")
    return caps


def main(argv: Sequence[str] | None = None) -> int:
    """Capture, compile, print a table, write JSON.

    Returns 0 when every check passes, 1 on any problem, 2 when nothing could be captured. With
    ``TRITON_INTERPRET`` set, the process re-executes itself without it (``os.execve``) first.
    """
    parser = argparse.ArgumentParser(prog="python -m fla_gen.aot", description=__doc__.splitlines()[0])
    parser.add_argument("--call", required=True, help="MODULE:FUNC, a zero-argument function calling the ops")
    parser.add_argument("--caps", default=",".join(map(str, DEFAULT_CAPS)), help="comma-separated targets")
    parser.add_argument("--json", help="write the reports here")
    parser.add_argument("--ttgir", action="store_true", help="include each kernel's TTGIR in the JSON")
    parser.add_argument("--jobs", type=int, default=1, help="compile in this many forked processes")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0").lower() not in ("", "0", "false", "off", "no"):
        # Triton reads the variable when it decorates kernels, including its own at import: start afresh.
        print("note: re-running without TRITON_INTERPRET for ahead-of-time compilation", file=sys.stderr)
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        argv = sys.argv[1:] if argv is None else list(argv)
        os.execve(sys.executable, [sys.executable, "-m", "fla_gen.aot", *argv], env)
    try:
        caps = parse_caps(args.caps)
    except ValueError as exc:
        parser.error(str(exc))
    sys.path.insert(0, os.getcwd())
    try:
        call = load_call(args.call)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        launches = capture_launches(call)
    except AotCaptureError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not launches:
        print(f"error: {args.call} launched no Triton kernel", file=sys.stderr)
        return 2
    reports = compile_all(launches, caps, args.jobs)
    problems = [p for r in reports for p in check_report(r)]
    print(format_table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "call": args.call,
                    "caps": list(caps),
                    "triton": triton.__version__,
                    "reports": [report_to_dict(r, args.ttgir) for r in reports],
                    "problems": problems,
                },
                f,
                indent=2,
                default=str,
            )
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print(f"{len(launches)} kernel launch(es) x {len(caps)} target(s): {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
