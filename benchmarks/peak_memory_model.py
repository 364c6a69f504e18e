#!/usr/bin/env python3
"""Peak memory of one forward+backward of a generated chunk op, measured on the CPU.

    python benchmarks/peak_memory_model.py [op ...] [--shape 1x256x2x128] [--dtype fp16] [--arch sm90]
        [--stub-kernels] [--scale-to 4x4096x16x128] [--live]

What it counts: every byte that torch's CPU allocator hands out during ``o, _ = chunk_<op>(...);
o.backward(do)`` (the same call as ``bench_ops.py``'s peak on the GPU), read from
``torch.profiler(profile_memory=True)``: outputs, saved tensors, gradients, scratch buffers and any
temporary of any torch op, whoever allocates it. Tensors that exist before the call (the inputs and
``do``) are the base; the peak is the largest sum of bytes allocated during the call and not yet
freed. ``torch.cuda.max_memory_allocated`` on the GPU is then about base + peak (the caching
allocator rounds blocks up to 512 bytes).

Kernels run in Triton's interpreter (TRITON_INTERPRET=1, set here) unless ``--stub-kernels``
replaces them with no-ops, which leaves every allocation as it is (a Triton kernel allocates no torch
memory) and makes full-size shapes cheap. Two interpreter artefacts are removed so that the
numbers are the GPU's:
- the interpreter holds each launch's arguments in a reference cycle (its recursive closures over
  the storages it copied) until Python's cycle collector runs; we collect after every launch. A
  reference cycle in the op's own host code would be collected there too, so this model cannot see
  a leak through a cycle (none is known; ``gc.garbage`` stays empty).
- nothing else: the interpreter's own arrays are NumPy's, which torch's allocator never sees.

Units: one [B, T, H, K] input tensor (B*T*H*K elements of the input dtype). Buffers whose size does
not scale with B*T*H (final states, chunk tables) are tiny; the chunk states h and dh are
[B, T/BT, H, K, V], i.e. V/BT input tensors each, so use the target's K, V and chunk size (and a T
that is a multiple of it) when scaling to MB at a target shape. ``--arch`` picks whose plans run
(default sm90's, the H100's): the chunk size, hence the size of the chunk states, may differ by arch.

Checked against bench_ops.py's H100 ``peak_mb`` (4x4096x16x128 bf16, --stub-kernels, on the code those
runs measured, results/2026-11-23_h100_bench_{delta,gated}.json): chunk_delta_rule 1377.0 MiB (measured
1377.5), gated_delta_rule 1380.0 (1379.5), linear_attn 768.0 (768.5), simple_gla 770.0 (769.5); at
8x2048x32x64 chunk_delta_rule 1282.0 (RESULTS.md: 1282).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (by torch or by an op)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from fla_gen.canonical import Recurrence, canonicalize  # noqa: E402
from fla_gen.check import check_spec  # noqa: E402
from fla_gen.parse import read_spec  # noqa: E402
from fla_gen.runtime.dispatch import forced_arch  # noqa: E402
from fla_gen.sample import sample_inputs  # noqa: E402

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
_KERNEL_TAG = "kernel "


@dataclass(frozen=True)
class MemEvent:
    """One allocation (nbytes > 0) or free (nbytes < 0) of torch's CPU allocator, in time order."""

    ts: float
    addr: int
    nbytes: int


@dataclass(frozen=True)
class Span:
    """A named time range of the trace: a phase (forward, backward) or one kernel launch."""

    name: str
    start: float
    end: float


@dataclass(frozen=True)
class Live:
    """A buffer alive at the peak: its size and the kernel launched first after it was allocated."""

    nbytes: int
    before: str


@dataclass(frozen=True)
class PeakReport:
    """Bytes of one forward+backward; ``unit`` is one [B, T, H, K] input tensor."""

    op: str
    shape: tuple[int, int, int, int, int]
    dtype: torch.dtype
    arch: str  # whose plan ran
    chunk_size: int
    unit: int
    base: int  # inputs and do, alive before the call
    peak: int  # the most bytes allocated during the call and alive at once
    peak_forward: int
    peak_backward: int
    end: int  # allocated during the call and still alive after it (the gradients)
    live_at_peak: tuple[Live, ...]

    def units(self, nbytes: int) -> float:
        return nbytes / self.unit

    def scaled_mib(self, nbytes: int, target: tuple[int, int, int, int]) -> float:
        """``nbytes`` in MiB at target (B, T, H, K) of the same dtype, scaled by one input tensor."""
        B, T, H, K = target
        return self.units(nbytes) * B * T * H * K * self.dtype.itemsize / 2**20


# ----------------------------------------------------------------------------- accounting (pure)

def replay(events: list[MemEvent], until: float = float("inf")) -> dict[int, MemEvent]:
    """The allocations of ``events`` (up to time ``until``) not freed by then, keyed by address.

    A free of an address that ``events`` never allocated (a tensor from before the trace) is ignored.
    """
    live: dict[int, MemEvent] = {}
    for e in events:
        if e.ts > until:
            break
        if e.nbytes > 0:
            live[e.addr] = e
        else:
            live.pop(e.addr, None)
    return live


def live_peak(events: list[MemEvent], start: float = float("-inf"), end: float = float("inf"),
              ) -> tuple[int, dict[int, MemEvent]]:
    """The most bytes allocated in ``events`` and alive at once between ``start`` and ``end``.

    Allocations before ``start`` still count while they are alive inside the window.

    Returns:
        (peak bytes, the allocations alive at the peak keyed by address).
    """
    live = replay([e for e in events if e.ts < start])
    now = sum(e.nbytes for e in live.values())
    peak, at_peak = now, dict(live)
    for e in events:
        if e.ts < start:
            continue
        if e.ts > end:
            break
        if e.nbytes > 0:
            live[e.addr] = e
            now += e.nbytes
        elif e.addr in live:
            now -= live.pop(e.addr).nbytes
        if now > peak:
            peak, at_peak = now, dict(live)
    return peak, at_peak


def first_after(spans: list[Span], ts: float) -> str:
    """The name of the first kernel span starting at or after ``ts`` ('end' if none)."""
    later = [s for s in spans if s.start >= ts and s.name.startswith(_KERNEL_TAG)]
    return min(later, key=lambda s: s.start).name[len(_KERNEL_TAG):] if later else "end"


def parse_trace(trace: dict) -> tuple[list[MemEvent], list[Span]]:
    """The CPU allocator events and the named ranges (record_function) of a Chrome trace."""
    events, spans = [], []
    for e in trace["traceEvents"]:
        if e.get("name") == "[memory]" and e["args"].get("Device Type", 0) == 0:
            events.append((e["ts"], e["args"].get("Ev Idx", 0), MemEvent(e["ts"], e["args"]["Addr"],
                                                                         e["args"]["Bytes"])))
        elif e.get("cat") == "user_annotation":
            spans.append(Span(e["name"], e["ts"], e["ts"] + e.get("dur", 0)))
    return [m for _, _, m in sorted(events, key=lambda x: x[:2])], spans


# ----------------------------------------------------------------------------- running an op

@contextlib.contextmanager
def kernel_launches(stub: bool) -> Iterator[None]:
    """Name every Triton launch in the trace; collect the interpreter's cyclic garbage after each
    (see the module docstring); with ``stub`` launch nothing at all."""
    from triton.runtime.interpreter import GridExecutor  # the interpreter's `kernel[grid](...)`

    original = GridExecutor.__call__

    def launch(self, *args, **kwargs):
        with record_function(_KERNEL_TAG + self.fn.__name__):
            if not stub:
                original(self, *args, **kwargs)
        gc.collect()

    GridExecutor.__call__ = launch
    try:
        yield
    finally:
        GridExecutor.__call__ = original


def recurrence(op: str) -> Recurrence:
    return canonicalize(check_spec(read_spec(ROOT / "specs" / f"{op}.fla")))


def traced(fn: Callable[[], None]) -> tuple[list[MemEvent], list[Span]]:
    """Run ``fn`` once under the profiler; its allocator events and named ranges."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return parse_trace(json.load(f))


def measure(op: str, B: int, T: int, H: int, K: int, V: int, dtype: torch.dtype = torch.float16, *,
            arch: str | None = None, stub_kernels: bool = False, seed: int = 0, warmup: bool = True) -> PeakReport:
    """Peak bytes of ``o, _ = chunk_<op>(*inputs); o.backward(do)`` with every input a leaf.

    Inputs are fla_gen.sample's (gates float32, the rest ``dtype``), q, k: [B, T, H, K],
    v: [B, T, H, V]; ``do``: [B, T, H, V]. ``arch`` selects that GPU's plans (chunk sizes, hence the
    size of the chunk states, may differ by arch); None: the CPU's (sm80's). As bench_ops.py, one
    warm-up call first (caches that a first call fills do not count), then the gradients are reset.
    """
    rec = recurrence(op)
    fn = getattr(importlib.import_module(f"generated.{op}"), f"chunk_{rec.spec.op}")
    x = sample_inputs(rec, B, T, H, K, V, dtype, seed=seed)
    leaves = [x[i.name].detach().requires_grad_(x[i.name].is_floating_point()) for i in rec.spec.inputs]
    do = torch.randn(B, T, H, V, dtype=dtype)

    def forward_backward():
        with record_function("forward"):
            o, _ = fn(*leaves)
        with record_function("backward"):
            o.backward(do)

    gc.collect()
    with kernel_launches(stub_kernels), forced_arch(arch) if arch else contextlib.nullcontext():
        if warmup:
            forward_backward()
        for t in leaves:
            t.grad = None
        events, spans = traced(forward_backward)
        package = importlib.import_module(f"generated.{op}.chunk")
        plan = package.select_plan(package.CHUNK_PLANS, torch.device("cpu"), dtype, max(K, V))
    phases = {s.name: s for s in spans if not s.name.startswith(_KERNEL_TAG)}
    peak, live = live_peak(events)
    return PeakReport(
        op=op, shape=(B, T, H, K, V), dtype=dtype, arch=plan.arch, chunk_size=plan.chunk_size,
        unit=B * T * H * K * dtype.itemsize,
        base=sum(t.numel() * t.element_size() for t in [*leaves, do]),
        peak=peak,
        peak_forward=live_peak(events, phases["forward"].start, phases["forward"].end)[0],
        peak_backward=live_peak(events, phases["backward"].start, phases["backward"].end)[0],
        end=sum(e.nbytes for e in replay(events).values()),
        live_at_peak=tuple(sorted((Live(e.nbytes, first_after(spans, e.ts)) for e in live.values()),
                                  key=lambda b: -b.nbytes)),
    )


# ----------------------------------------------------------------------------- command line

def _shape(text: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in text.lower().split("x"))
    if len(parts) not in (4, 5):
        raise argparse.ArgumentTypeError(f"{text!r}: expected BxTxHxD or BxTxHxKxV")
    return parts if len(parts) == 5 else (*parts, parts[3])


def format_report(r: PeakReport, target: tuple[int, ...] | None, live: bool) -> str:
    """One line per number, in input tensors and in MiB at ``target`` (default: the measured shape)."""
    B, T, H, K, V = r.shape
    at = (target or r.shape)[:4]

    def cell(n: int) -> str:
        return f"{r.units(n):6.2f} x [B,T,H,K] = {r.scaled_mib(n, at):7.1f} MiB at {'x'.join(map(str, at))}"

    dtype = str(r.dtype).removeprefix("torch.")
    lines = [f"chunk_{r.op} {B}x{T}x{H}x{K}x{V} {dtype} ({r.arch} plan, chunk {r.chunk_size}), "
             f"unit [B,T,H,K] = {r.unit} bytes",
             f"  base (inputs + do)    {cell(r.base)}",
             f"  peak during fwd+bwd   {cell(r.peak)}",
             f"    within forward      {cell(r.peak_forward)}",
             f"    within backward     {cell(r.peak_backward)}",
             f"  after (gradients)     {cell(r.end)}",
             f"  base + peak           {cell(r.base + r.peak)}"]
    if live:
        lines.append("  alive at the peak (size, first kernel launched after its allocation):")
        lines += [f"    {r.units(b.nbytes):6.3f}  {b.before}" for b in r.live_at_peak]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ops", nargs="*", default=["delta_rule", "gated_delta_rule", "gated_delta_rule_rope"])
    p.add_argument("--shape", type=_shape, default=(1, 256, 2, 128, 128), help="BxTxHxD or BxTxHxKxV")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp16",
                   help="fp16 has bf16's element size and runs in the interpreter")
    p.add_argument("--arch", default="sm90", help="whose plans to run (default the H100's; 'cpu': sm80's)")
    p.add_argument("--stub-kernels", action="store_true", help="launch no kernel (full-size shapes)")
    p.add_argument("--scale-to", type=_shape, default=None, help="give MiB at this BxTxHxD (same dtype)")
    p.add_argument("--live", action="store_true", help="list the buffers alive at the peak")
    p.add_argument("--json", default=None, help="write the reports here")
    args = p.parse_args(argv)
    reports = []
    for op in args.ops:
        r = measure(op, *args.shape, DTYPES[args.dtype], arch=None if args.arch == "cpu" else args.arch,
                    stub_kernels=args.stub_kernels)
        reports.append(r)
        print(format_report(r, args.scale_to, args.live), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"op": r.op, "shape": r.shape, "dtype": str(r.dtype), "arch": r.arch, "chunk_size": r.chunk_size,
                        "unit_bytes": r.unit, "base_units": r.units(r.base), "peak_units": r.units(r.peak),
                        "peak_forward_units": r.units(r.peak_forward),
                        "peak_backward_units": r.units(r.peak_backward), "end_units": r.units(r.end)}
                       for r in reports], f, indent=1)


if __name__ == "__main__":
    main()
