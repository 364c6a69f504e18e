#!/usr/bin/env python3
"""Time the generated ops against fla-core and PyTorch SDPA: op x shape preset -> Markdown, JSON, a plot.

    python benchmarks/run.py                                    # every op, every preset
    python benchmarks/run.py --ops gla,delta_rule --presets standard,long --out bench_out

How each number is measured (the same for every op, library and shape):
- One fresh subprocess per shape, which times every requested op at that shape: ours (``generated.<pkg>``),
  fla-core (``fla.ops``, skipped with a note when it is not installed) and, for dense shapes, SDPA causal
  softmax attention at the same B, T, H, D.
- Both libraries are warmed in that process before any timing: their first forward and first backward
  (Triton compiles, fla's autotune), then a second forward and backward.
- Then one untimed round of each library and mode (kept in the JSON as ``settle``), so that no timed round is
  the first after a compile. From here to the end of the op's timing no background thread copies fla's autotune
  picks (``--autotune-picks``; _autotune.timed_stretch): that walk of Triton's cache takes the host's CPU.
  Single slow rounds remain (H200, 1x16384: both libraries' rounds 35-105% apart in a
  process whose settling rounds were fast, the kernel time unchanged): the host, not the GPU, which the
  kernel-time column shows.
- Then ``--rounds`` rounds: each round times the forward of ours and of fla, then their forward+backwards, in
  ``--slices`` alternating slices (ours, fla, fla, ours, ...), each a ``triton.testing.do_bench`` median over
  its share of the round's time; a round's time per library and mode is the median of its slices. A GPU or
  host that slows down or speeds up for a stretch then lands on both libraries instead of one (_ops.timing_order).
  SDPA is timed once per shape.
- The reported fla/ours ratio is the WORST over the rounds, min_r fla[r] / ours[r]: a ratio above 1 holds in
  every round. The times shown are the medians over the rounds; the JSON keeps every round.
- Kernel time: after the rounds, each library's GPU kernel time per call (torch.profiler, every kernel's
  duration summed over 20 calls) and fla/ours of it. A wall time well above its kernel time is a call whose
  GPU waits for the host's launches, which depends on the machine's CPU (fla-core's grouped Gated DeltaNet
  forward on the H200: 0.91 ms of wall time on one machine, 1.12-1.20 on another, over 0.89-0.90 ms of
  kernels); the kernel-time ratio does not.
- Memory floor: the bytes a forward must read and write (every input once, the output once; a decode step
  also reads and writes the fp32 state) over the device-to-device copy bandwidth measured in the same
  process (a 1 GiB copy, bytes read + written). ``ours/floor`` is ours' forward over that time.
- Host time (the JSON's ``host``, and the --breakdown lines): the median over 20 calls of the CPU time from a
  call's start to its return, the GPU synced before each. Kernels launch asynchronously, so this is what the
  host spends issuing the call (validation, planning, allocations, launches). A library whose host time is at
  least its kernel time is host-bound (the JSON's ``host_bound_<mode>``): its wall ratio is marked ``h`` in the
  table, as it measures the machine's CPU as much as the kernels.
- Inputs (benchmarks/_ops.py): q, k, v ~ randn in bf16; log gates g = logsigmoid(randn) / 16 in fp32; the
  delta family's keys l2-normalized over the head dim (as fla's tests do), beta = sigmoid(randn);
  DPLR / RWKV-7 decays -exp(-0.5) sigmoid(randn) in fp32. The forward is timed with autograd on (a
  training forward); forward+backward backpropagates a fixed random ``do``.

Presets: ``standard`` (4x4096x16x128, 8x2048x32x64, 1x16384x16x128, 2x8192x8x256), ``long`` (B = 1,
T = 16384 / 65536 / 131072, H = 16, D = 128), ``varlen`` (32 sequences of 256..8192 tokens, seed 0, packed
through cu_seqlens, H = 16, D = 128), ``decode`` (the fused_recurrent ops at T = 1, B = 64, H = 16,
D = 128, fp32 state in and out, no autograd). ``--shapes`` adds shapes in the same notation: ``BxTxHxD``,
``varlen:NxMIN-MAXxHxD``, ``decode:BxHxD``; ``varlen:L+NxMIN-MAXxHxD`` packs one sequence of L tokens before the N
drawn ones (a long document among short ones: ``varlen:16384+31x256-1024x16x128``).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
for _p in (str(ROOT), str(HERE)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import _ops  # noqa: E402
from _autotune import add_autotune_picks_argument, timed_stretch, use_autotune_picks  # noqa: E402

LIBS = ("ours", "fla", "sdpa")
MODES = ("fwd", "fwdbwd")


# ---------------------------------------------------------------------------------------------------------------
# shapes


@dataclass(frozen=True)
class Shape:
    """One benchmark shape. ``kind``: dense ([B, T, H, D] inputs), varlen (``lengths`` packed into B = 1
    through cu_seqlens) or decode (T = 1 through the fused_recurrent ops, state in and out)."""

    kind: str
    B: int
    T: int
    H: int
    K: int
    V: int
    lengths: tuple[int, ...] = ()
    # varlen: the range the lengths were drawn from, (MIN, MAX)
    span: tuple[int, int] = (0, 0)
    # varlen: the tokens of one sequence packed before the drawn ones (0: none)
    leading: int = 0

    @property
    def name(self) -> str:
        d = f"{self.K}" if self.K == self.V else f"{self.K}x{self.V}"
        if self.kind == "varlen":
            lead = f"{self.leading}+" if self.leading else ""
            drawn = len(self.lengths) - bool(self.leading)
            return f"varlen:{lead}{drawn}x{self.span[0]}-{self.span[1]}x{self.H}x{d}"
        if self.kind == "decode":
            return f"decode:{self.B}x{self.H}x{d}"
        return f"{self.B}x{self.T}x{self.H}x{d}"


# Lengths of the varlen preset: drawn once with this seed, so every run packs the same batch.
VARLEN_SEED = 0

PRESETS: dict[str, tuple[str, ...]] = {
    "standard": _ops.SHAPE_PRESETS["standard"],
    "long": ("1x16384x16x128", "1x65536x16x128", "1x131072x16x128"),
    "varlen": ("varlen:32x256-8192x16x128",),
    "decode": ("decode:64x16x128",),
}


def varlen_lengths(n: int, lo: int, hi: int, seed: int = VARLEN_SEED) -> tuple[int, ...]:
    """``n`` sequence lengths drawn uniformly from [lo, hi] with a fixed seed (the same in every process)."""
    rng = random.Random(seed)
    return tuple(rng.randint(lo, hi) for _ in range(n))


def parse_shape(text: str) -> Shape:
    """'4x4096x16x128' (dense, K = V), '4x4096x16x128x64' (K, V), 'varlen:32x256-8192x16x128' (with one sequence of
    16384 tokens first: 'varlen:16384+31x256-1024x16x128') or 'decode:64x16x128' -> Shape; ValueError naming the
    text otherwise."""
    kind, _, body = text.rpartition(":")
    kind = kind or "dense"
    try:
        if kind == "varlen":
            lead, plus, drawn = body.rpartition("+")
            leading = int(lead) if plus else 0
            n, span, h, *d = drawn.split("x")
            lo, hi = (int(x) for x in span.split("-"))
            if not 0 < lo <= hi or leading < 0 or (plus and not leading):
                raise ValueError
            lengths = (leading,) * bool(leading) + varlen_lengths(int(n), lo, hi)
            K, V = (int(d[0]), int(d[-1]))
            return Shape("varlen", 1, sum(lengths), int(h), K, V, lengths, (lo, hi), leading)
        if kind == "decode":
            b, h, *d = (int(x) for x in body.split("x"))
            return Shape("decode", b, 1, h, d[0], d[-1])
        if kind == "dense":
            B, T, H, K, V = _ops.parse_shape(body)
            return Shape("dense", B, T, H, K, V)
    except (ValueError, IndexError):
        pass
    raise ValueError(f"shape {text!r}: expected BxTxHxD, BxTxHxKxV, varlen:[L+]NxMIN-MAXxHxD or decode:BxHxD")


def parse_shapes(presets: str, shapes: str) -> list[Shape]:
    """The shapes of the comma-separated ``presets`` then ``shapes``, in order, duplicates dropped;
    ValueError naming an unknown preset."""
    out: list[Shape] = []
    for p in (x for x in presets.split(",") if x):
        if p not in PRESETS:
            raise ValueError(f"unknown preset {p!r}; known: {', '.join(PRESETS)}")
        out += [parse_shape(s) for s in PRESETS[p]]
    out += [parse_shape(s) for s in shapes.split(",") if s]
    return list(dict.fromkeys(out))


# ---------------------------------------------------------------------------------------------------------------
# the arithmetic the tables report (pure: tests/tools covers it)


def floor_ms(nbytes: int, copy_tbs: float) -> float:
    """Milliseconds to move ``nbytes`` at ``copy_tbs`` TB/s (the copy bandwidth, bytes read + written)."""
    return nbytes / (copy_tbs * 1e12) * 1e3


def copy_tbs(copied_bytes: int, ms: float) -> float:
    """The bandwidth of a copy of ``copied_bytes`` that took ``ms``: bytes read + written per second, in TB/s."""
    return 2 * copied_bytes / (ms * 1e-3) / 1e12


def worst_ratio(ours: list[float], fla: list[float]) -> float | None:
    """The worst fla/ours ratio over the rounds: min over r of fla[r] / ours[r] (round r timed both, in
    alternation). None without a complete pair of rounds."""
    pairs = [(o, f) for o, f in zip(ours, fla, strict=False) if o and f]
    if not pairs or len(ours) != len(fla):
        return None
    return min(f / o for o, f in pairs)


def host_bound(host_ms: float | None, kernels_ms: float | None) -> bool:
    """Whether a call's host time (to issue it) is at least its GPU kernel time: in a loop of such calls the GPU
    waits for the host, and the wall time measures the machine's CPU as much as the kernels."""
    return host_ms is not None and kernels_ms is not None and host_ms >= kernels_ms


def summarize(row: dict) -> dict:
    """Derived columns of one (op, shape) row: median ms per library and mode, the worst fla/ours ratio per
    mode, each library's kernel time and fla/ours of it, the libraries whose calls are host-bound per mode, the
    forward's memory floor and ours over it."""
    out: dict = {}
    for mode in MODES:
        for lib in LIBS:
            rounds = row.get(lib, {}).get(mode)
            out[f"{lib}_{mode}_ms"] = statistics.median(rounds) if rounds else None
            out[f"{lib}_{mode}_kernels_ms"] = row.get("kernels", {}).get(lib, {}).get(mode)
            out[f"{lib}_{mode}_host_ms"] = row.get("host", {}).get(lib, {}).get(mode)
        out[f"ratio_{mode}"] = worst_ratio(row.get("ours", {}).get(mode) or [], row.get("fla", {}).get(mode) or [])
        ours_k, fla_k = out[f"ours_{mode}_kernels_ms"], out[f"fla_{mode}_kernels_ms"]
        out[f"ratio_{mode}_kernels"] = fla_k / ours_k if ours_k and fla_k else None
        out[f"host_bound_{mode}"] = [lib for lib in LIBS if host_bound(out[f"{lib}_{mode}_host_ms"],
                                                                       out[f"{lib}_{mode}_kernels_ms"])]
    if row.get("bytes_fwd") and row.get("copy_tbs"):
        out["floor_fwd_ms"] = floor_ms(row["bytes_fwd"], row["copy_tbs"])
        if out["ours_fwd_ms"]:
            out["ours_over_floor"] = out["ours_fwd_ms"] / out["floor_fwd_ms"]
    return out


# ---------------------------------------------------------------------------------------------------------------
# the worker: one shape, every op, in a fresh process


def _timer(device: str, quick: bool, slices: int = 1):
    """Median milliseconds of fn(): do_bench on CUDA, over 1 / ``slices`` of a round's repetition time (a round
    times each library in that many slices), a perf_counter loop on the CPU (``--fake`` plumbing)."""
    import torch

    if torch.device(device).type == "cuda":
        from triton.testing import do_bench

        warmup, rep = (5, 20 / slices) if quick else (25, 100 / slices)
        return lambda fn, grads=None: float(do_bench(fn, warmup=warmup, rep=rep, grad_to_none=grads,
                                                     return_mode="median"))

    def cpu(fn, grads=None):
        ts = []
        for _ in range(3):
            for t in grads or ():
                t.grad = None
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return sorted(ts)[1]
    return cpu


def _measure_copy(device: str, bench) -> float:
    """The device-to-device copy bandwidth in TB/s (1 GiB on a GPU, 64 MiB on the CPU)."""
    import torch

    n = (1 << 30) if device != "cpu" else (1 << 26)
    x = torch.empty(n // 4, device=device).normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return copy_tbs(n, ms)


def _nbytes(tensors) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _op_calls(op, shape: Shape, spec: dict):
    """(calls, bytes_fwd, notes): per library a dict mode -> (fn, leaves to reset), for one op at one shape."""
    import torch

    device = spec["device"]
    dtype = torch.float32 if spec["fake"] else getattr(torch, spec["dtype"])
    decode = shape.kind == "decode"
    dims = (shape.B, shape.T, shape.H, shape.K, shape.V)
    seed = _ops.seed_for(spec["seed"], op.name, shape.name)
    names, args, kwargs = _ops.make_inputs(op, dims, dtype, device, seed, gate_dtype=torch.float32,
                                           requires_grad=not decode)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed + 1)
    do = torch.randn(*dims[:3], shape.V, generator=gen, device=device).to(dtype)
    call_kw: dict = {"scale": _ops.scale_for(op, shape.K), **kwargs}
    if shape.kind == "varlen":
        cu = torch.tensor([0, *torch.tensor(shape.lengths).cumsum(0).tolist()], dtype=torch.int64)
        call_kw["cu_seqlens"] = cu.to(device)
    state_bytes = 0
    if decode:
        h0 = torch.randn(shape.B, shape.H, shape.K, shape.V, generator=gen, device=device)
        call_kw.update(initial_state=h0, output_final_state=True)
        state_bytes = 2 * _nbytes([h0])
    bytes_fwd = _nbytes(args) + _nbytes(kwargs.values()) + shape.B * shape.T * shape.H * shape.V * dtype.itemsize
    bytes_fwd += state_bytes
    mode_name = "fused_recurrent" if decode else "chunk"
    calls, notes = {}, {}
    for lib in ("ours", "fla"):
        if lib not in spec["libs"]:
            continue
        try:
            fn = (_ops.resolve_ours if lib == "ours" else _ops.resolve_fla)(op, mode_name, spec["fake"])
        except Exception as e:
            notes[lib] = _ops.err_text(e, 200)
            continue
        if lib == "ours" and shape.kind == "varlen":
            fn = _with_cpu_seqlens(fn, call_kw["cu_seqlens"].cpu())

        def fwd(fn=fn):
            if decode:
                with torch.no_grad():
                    return fn(*args, **call_kw)
            return fn(*args, **call_kw)

        def fwd_bwd(fwd=fwd):
            fwd()[0].backward(do)

        calls[lib] = {"fwd": (fwd, None)} if decode else {"fwd": (fwd, None), "fwdbwd": (fwd_bwd, args)}
    return calls, bytes_fwd, notes


def _with_cpu_seqlens(fn, cu_cpu):
    """Our op with ``cu_seqlens_cpu`` passed too, so its validation never syncs the GPU."""
    def call(*a, **kw):
        return fn(*a, **kw, cu_seqlens_cpu=cu_cpu)
    return call


def _sdpa_calls(shape: Shape, spec: dict):
    """SDPA causal forward and forward+backward at a dense shape's B, T, H, D."""
    import torch
    import torch.nn.functional as F

    device = spec["device"]
    dtype = torch.float32 if spec["fake"] else getattr(torch, spec["dtype"])
    gen = torch.Generator(device=device)
    gen.manual_seed(spec["seed"])
    qkv = [torch.randn(shape.B, shape.T, shape.H, d, generator=gen, device=device).to(dtype).requires_grad_(True)
           for d in (shape.K, shape.K, shape.V)]
    do = torch.randn(shape.B, shape.H, shape.T, shape.V, generator=gen, device=device).to(dtype)

    def fwd():
        q, k, v = (t.transpose(1, 2) for t in qkv)  # [B, H, T, D] views of [B, T, H, D]
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        fwd().backward(do)
    return {"fwd": (fwd, None), "fwdbwd": (fwd_bwd, qkv)}


def _warm(calls: dict, row: dict, lib: str) -> dict:
    """Each mode's first and second call (compile, autotune, first backward); a mode that raises is dropped,
    its error the library's note for that mode (e.g. fla's refusal of a gated backward: its forward still
    runs). Returns the modes that work."""
    t0 = time.perf_counter()
    ok = {}
    for mode, (fn, grads) in calls.items():
        try:
            for _ in range(2):
                fn()
                for t in grads or ():
                    t.grad = None
            _ops.sync(row["_device"])
            ok[mode] = (fn, grads)
        except Exception as e:
            row.setdefault("notes", {})[f"{lib} {mode}"] = _ops.err_text(e, 200)
    row.setdefault("warmup_s", {})[lib] = round(time.perf_counter() - t0, 2)
    return ok


def measure_op(op, shape: Shape, spec: dict, bench) -> dict:
    """Every round of ours and fla (alternating) and SDPA for one op at one shape; see the module doc."""
    row: dict = {"op": op.name, "shape": shape.name, "kind": shape.kind, "_device": spec["device"]}
    try:
        calls, row["bytes_fwd"], notes = _op_calls(op, shape, spec)
    except Exception as e:
        row["notes"] = {"ours": f"inputs: {_ops.err_text(e, 200)}"}
        return row
    if notes:
        row["notes"] = notes
    calls = {lib: _warm(modes, row, lib) for lib, modes in calls.items()}
    with timed_stretch():
        _time_rounds(calls, row, spec, bench)
    return row


def _time_rounds(calls: dict, row: dict, spec: dict, bench) -> None:
    """measure_op's settling round, its timed rounds and each mode's host and kernel time, into ``row``."""
    libs = [lib for lib in ("ours", "fla") if calls.get(lib)]
    for lib in libs:  # the untimed settling round (module doc); a mode that raises here raises again below
        for mode, (fn, grads) in calls[lib].items():
            try:
                row.setdefault("settle", {}).setdefault(lib, {})[mode] = bench(fn, grads)
            except Exception:
                pass
    sliced: dict = {}  # (lib, mode) -> one list of slice times per round
    for r, lib, mode in _ops.timing_order(libs, [list(calls[lib]) for lib in libs], spec["rounds"], spec["slices"]):
        fn, grads = calls[lib][mode]
        rounds = sliced.setdefault((lib, mode), [])
        if len(rounds) == r:
            rounds.append([])
        try:
            rounds[r].append(bench(fn, grads))
        except Exception as e:  # e.g. fla's refusal of a gated backward on Hopper
            row.setdefault("notes", {})[f"{lib} {mode}"] = _ops.err_text(e, 200)
    for (lib, mode), rounds in sliced.items():
        complete = [times for times in rounds if len(times) == spec["slices"]]
        row.setdefault(lib, {})[mode] = [statistics.median(times) for times in complete]
        row.setdefault("slices", {}).setdefault(lib, {})[mode] = rounds
    # a mode that failed in some round has no complete series: drop it, keep the note
    for lib in libs:
        for mode in list(row.get(lib, {})):
            if len(row[lib][mode]) != spec["rounds"]:
                del row[lib][mode]
    for lib in libs:
        for mode in row.get(lib, {}):
            fn, grads = calls[lib][mode]
            row.setdefault("host", {}).setdefault(lib, {})[mode] = _ops.host_ms(fn, spec["device"], grads)
            if spec["device"] == "cuda":
                per_kernel = _ops.kernel_breakdown(fn, grads)
                row.setdefault("kernels", {}).setdefault(lib, {})[mode] = sum(per_kernel.values())
                if spec.get("breakdown"):
                    row.setdefault("per_kernel", {}).setdefault(lib, {})[mode] = {
                        name: round(ms, 4) for name, ms in per_kernel.items()}


def worker(spec: dict) -> None:
    """One shape in this process: the copy bandwidth, then every op; writes spec['result'] (JSON)."""
    import torch

    shape = Shape(**{**spec["shape"], "lengths": tuple(spec["shape"]["lengths"]), "span": tuple(spec["shape"]["span"])})
    bench = _timer(spec["device"], spec["quick"], spec["slices"])
    out: dict = {"shape": shape.name, "rows": [], "device_name": (torch.cuda.get_device_name()
                                                                  if spec["device"] == "cuda" else "cpu")}
    if spec.get("autotune_picks") and "fla" in spec["libs"]:
        out["fla_picks_restored"] = use_autotune_picks(Path(spec["autotune_picks"]), shape.name)
    out["copy_tbs"] = _measure_copy(spec["device"], bench)
    sdpa = None
    if "sdpa" in spec["libs"] and shape.kind == "dense":
        try:
            sc = _sdpa_calls(shape, spec)
            for fn, grads in sc.values():
                fn()
                for t in grads or ():
                    t.grad = None
            sdpa = {mode: [bench(fn, grads)] for mode, (fn, grads) in sc.items()}
            del sc
        except Exception as e:
            sdpa = {"note": _ops.err_text(e, 200)}
    for name in spec["ops"]:
        row = measure_op(_ops.OPS[name], shape, spec, bench)
        row.pop("_device")
        row["copy_tbs"] = out["copy_tbs"]
        if sdpa and "note" not in sdpa:
            row["sdpa"] = sdpa
        elif sdpa:
            row.setdefault("notes", {})["sdpa"] = sdpa["note"]
        out["rows"].append(row)
        Path(spec["result"]).write_text(json.dumps(out, indent=1))
        if spec["device"] == "cuda":
            torch.cuda.empty_cache()
    Path(spec["result"]).write_text(json.dumps(out, indent=1))


# ---------------------------------------------------------------------------------------------------------------
# the parent: one subprocess per shape, then the report


def run_shape(shape: Shape, args, workdir: Path) -> dict:
    """Run one shape's worker in a fresh process; a crash or timeout becomes the shape's note."""
    result = workdir / f"{shape.name.replace(':', '_')}.json"
    spec = {"shape": asdict(shape), "ops": args.ops, "libs": args.libs, "rounds": args.rounds, "slices": args.slices,
            "dtype": args.dtype, "device": args.device, "fake": args.fake, "quick": args.quick,
            "breakdown": args.breakdown,
            "seed": args.seed, "result": str(result),
            "autotune_picks": str(args.autotune_picks) if args.autotune_picks else None}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    note = None
    try:
        proc = subprocess.run(cmd, cwd=str(ROOT), timeout=args.timeout, capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            note = f"worker exited {proc.returncode}: {tail[0][:200]}"
    except subprocess.TimeoutExpired:
        note = f"worker timed out after {args.timeout} s"
    data = json.loads(result.read_text()) if result.exists() else {"shape": shape.name, "rows": []}
    if note:
        data["note"] = note
    return data


def build_report(shape_results: list[dict], meta: dict) -> dict:
    """The JSON report: meta (versions, command, method) and one row per (op, shape) with its rounds and the
    derived columns of summarize()."""
    rows, notes = [], {}
    for res in shape_results:
        if res.get("note"):
            notes[res["shape"]] = res["note"]
        for row in res["rows"]:
            rows.append({**row, **summarize(row)})
    devices = sorted({r["device_name"] for r in shape_results if r.get("device_name")})
    return {"meta": {**meta, "device": ", ".join(devices)}, "rows": rows, "shape_notes": notes}


def _ratio_cell(x: float | None, host_bound_libs: list[str] | None = None) -> str:
    cell = "-" if x is None else (f"**{x:.2f}**" if x < 1.0 else f"{x:.2f}")
    return f"{cell} h" if x is not None and host_bound_libs else cell


def render_markdown(report: dict) -> str:
    """One Markdown table per shape kind: ms per library and mode, worst fla/ours, floor and ours/floor;
    footnotes for every missing cell."""
    meta = report["meta"]
    lines = [f"# Benchmark: {meta.get('device') or 'unknown device'}", "",
             f"torch {meta.get('torch')}, Triton {meta.get('triton')}, fla-core {meta.get('fla') or 'not installed'}, "
             f"{meta.get('dtype')}, {meta.get('rounds')} rounds. `{meta.get('command')}`", "",
             "ms: median over the rounds of do_bench medians. fla/ours: the worst round (min over rounds of fla / ours "
             "timed in alternation; > 1: ours faster; **bold** below 1). kernels: fla/ours of the GPU's kernel time "
             "per call (torch.profiler), which leaves out the time the GPU waits for the host. h: a host-bound cell, "
             "where a library's host time to issue a call is at least its kernel time (Notes: which); its wall ratio "
             "depends on the machine's CPU, and the kernel ratio is the comparison of the GPU work. floor: inputs "
             "read once and the output written once at the copy bandwidth measured in the same process.", ""]
    hdr = ["op", "shape", "ours fwd", "fla fwd", "fla/ours fwd", "kernels fwd", "ours f+b", "fla f+b",
           "fla/ours f+b", "kernels f+b", "sdpa fwd", "sdpa f+b", "floor fwd", "ours/floor"]
    footnotes: list[str] = []
    for kind in ("dense", "varlen", "decode"):
        rows = [r for r in report["rows"] if r.get("kind") == kind]
        if not rows:
            continue
        lines += [f"## {kind}", "", "| " + " | ".join(hdr) + " |", "|" + "---|" * len(hdr)]
        for r in rows:
            cells = [r["op"], r["shape"]]
            for key in ("ours_fwd_ms", "fla_fwd_ms"):
                cells.append(_ops.fmt(r.get(key)))
            cells += [_ratio_cell(r.get("ratio_fwd"), r.get("host_bound_fwd")), _ratio_cell(r.get("ratio_fwd_kernels"))]
            for key in ("ours_fwdbwd_ms", "fla_fwdbwd_ms"):
                cells.append(_ops.fmt(r.get(key)))
            cells += [_ratio_cell(r.get("ratio_fwdbwd"), r.get("host_bound_fwdbwd")),
                      _ratio_cell(r.get("ratio_fwdbwd_kernels"))]
            cells += [_ops.fmt(r.get("sdpa_fwd_ms")), _ops.fmt(r.get("sdpa_fwdbwd_ms")),
                      _ops.fmt(r.get("floor_fwd_ms"), 4), _ops.fmt(r.get("ours_over_floor"), 2)]
            for lib, why in sorted(r.get("notes", {}).items()):
                footnotes.append(f"- {r['op']} {r['shape']}, {lib}: {why}")
            for mode in MODES:
                if r.get(f"host_bound_{mode}") and r.get(f"ratio_{mode}") is not None:
                    issued = ", ".join(f"{lib} {_ops.fmt(r[f'{lib}_{mode}_host_ms'])} ms of host over "
                                       f"{_ops.fmt(r[f'{lib}_{mode}_kernels_ms'])} of kernels"
                                       for lib in r[f"host_bound_{mode}"])
                    footnotes.append(f"- {r['op']} {r['shape']} {mode}: host-bound, {issued}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    for shape, why in report.get("shape_notes", {}).items():
        footnotes.append(f"- {shape}: {why}")
    if footnotes:
        lines += ["Notes:", ""] + footnotes + [""]
    lines += render_breakdown(report["rows"])
    return "\n".join(lines)


BREAKDOWN_KERNELS = 8


def render_breakdown(rows: list[dict]) -> list[str]:
    """Markdown lines for the rows timed with --breakdown: per op, shape, library and mode, the kernel time per
    call, the host's time to issue the call, and the BREAKDOWN_KERNELS largest kernels (ms per call, a kernel
    launched twice counted twice)."""
    lines = []
    for r in rows:
        for lib, modes in r.get("per_kernel", {}).items():
            for mode, per_kernel in modes.items():
                top = list(per_kernel.items())[:BREAKDOWN_KERNELS]
                rest = sum(list(per_kernel.values())[BREAKDOWN_KERNELS:])
                cells = [f"{name} {_ops.fmt(ms)}" for name, ms in top]
                cells += [f"the rest {_ops.fmt(rest)}"] if rest else []
                host = r.get("host", {}).get(lib, {}).get(mode)
                issued = f", host {_ops.fmt(host)} ms" if host is not None else ""
                lines.append(f"- {r['op']} {r['shape']} {lib} {mode}, {_ops.fmt(sum(per_kernel.values()))} ms of "
                             f"kernels{issued}: " + ", ".join(cells))
    return ["## Where the kernel time goes (ms per call)", "", *lines, ""] if lines else []


def plot(report: dict, path: Path) -> str:
    """fla/ours (worst round) and ours/floor per op and shape as a PNG; a message instead without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    rows = report["rows"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    ops = list(dict.fromkeys(r["op"] for r in rows))
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(shapes)) * 2, 5))
    width = 0.8 / max(len(ops), 1)
    for ax, key, title in ((axes[0], "ratio_fwd", "fla / ours, forward (worst round; > 1: ours faster)"),
                           (axes[1], "ours_over_floor", "ours / memory floor, forward")):
        for i, op in enumerate(ops):
            ys = [next((r.get(key) for r in rows if r["op"] == op and r["shape"] == s), None) for s in shapes]
            ax.bar([j + i * width for j in range(len(shapes))], [y if y is not None else math.nan for y in ys],
                   width, label=op)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, rotation=30, ha="right")
        ax.set_title(title)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot: {path}"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--ops", default=",".join(_ops.OPS), help=f"comma-separated, from: {', '.join(_ops.OPS)}")
    p.add_argument("--presets", default=None,
                   help=f"comma-separated, from: {', '.join(PRESETS)} (default: all of them, unless --shapes is given)")
    p.add_argument("--shapes", default="", help="shapes to run (after the presets'): BxTxHxD, varlen:NxMIN-MAXxHxD "
                                                "(varlen:L+NxMIN-MAXxHxD: one sequence of L tokens first), "
                                                "decode:BxHxD")
    p.add_argument("--libs", default=",".join(LIBS), help="subset of ours,fla,sdpa")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds of ours and fla (the worst is reported)")
    p.add_argument("--slices", type=int, default=4,
                   help="slices per round: a round times each library and mode as the median of this many do_bench "
                        "runs over its share of the round's time, the libraries alternating slice by slice")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--out", type=Path, default=Path("bench_out"), help="directory for results.{md,json,png}")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per shape's process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="shorter do_bench (5 ms warm-up, 20 ms)")
    p.add_argument("--device", default=None, help="torch device of the timed calls (default: cuda; cpu with --fake)")
    p.add_argument("--fake", action="store_true", help="CPU stand-ins for every op: the plumbing only, no GPU")
    p.add_argument("--breakdown", action="store_true",
                   help="also keep each kernel's time per call (torch.profiler, 20 calls) in the JSON, and list the "
                        "largest ones per op, library and mode in the Markdown: where a ratio comes from")
    add_autotune_picks_argument(p)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    args.ops = _ops.parse_ops(args.ops)
    if args.device is None:
        args.device = "cpu" if args.fake else "cuda"
    args.libs = [x for x in args.libs.split(",") if x]
    if unknown := [x for x in args.libs if x not in LIBS]:
        p.error(f"unknown library {unknown[0]!r}; known: {', '.join(LIBS)}")
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.slices < 1:
        p.error("--slices must be at least 1")
    try:
        if args.presets is None:
            args.presets = "" if args.shapes else ",".join(PRESETS)
        args.shape_list = parse_shapes(args.presets, args.shapes)
    except ValueError as e:
        p.error(str(e))
    if not args.shape_list:
        p.error("no shapes: give --presets or --shapes")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = args.out / "shapes"
    workdir.mkdir(exist_ok=True)
    meta = {**_ops.versions(), "dtype": args.dtype, "rounds": args.rounds, "slices": args.slices, "libs": args.libs,
            "command": " ".join(["python", "benchmarks/run.py", *(argv if argv is not None else sys.argv[1:])])}
    if "fla" in args.libs and not meta.get("fla") and not args.fake:
        print("fla-core is not installed: timing ours (and SDPA) only", flush=True)
    results = []
    for shape in args.shape_list:
        t0 = time.perf_counter()
        print(f"[run] {shape.name}: {len(args.ops)} ops ...", flush=True)
        results.append(run_shape(shape, args, workdir))
        restored = results[-1].get("fla_picks_restored")
        print(f"[run] {shape.name}: {time.perf_counter() - t0:.0f} s"
              + (f", {restored} fla autotune picks restored" if restored is not None else "")
              + (f" ({results[-1]['note']})" if results[-1].get("note") else ""), flush=True)
        report = build_report(results, meta)
        (args.out / "results.json").write_text(json.dumps(report, indent=1))
        (args.out / "results.md").write_text(render_markdown(report))
    print(render_markdown(report))
    print(plot(report, args.out / "results.png"))
    print(f"written: {args.out / 'results.md'}, {args.out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
