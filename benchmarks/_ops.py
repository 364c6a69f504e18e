"""Shared by the benchmark tools (run.py, gpu_check.py, sweep_plans.py, kernel_limits.py): which ops exist,
how to build their inputs, how to call them.

An op is called positionally in fla's argument order (so that name differences such as fla's
``fused_recurrent_gla(..., gk=...)`` versus our ``g`` do not matter), with ``scale`` always passed
explicitly (fla's ``chunk_rwkv7`` defaults to 1.0 but its ``fused_recurrent_rwkv7`` to K**-0.5).

Input distributions (documented choice, fixed for every run; the seed changes):
- q, k, v, r: standard normal. Delta-rule family: k (and the a/b direction) L2-normalised over
  the head dim, as those models do; beta = sigmoid(randn).
- simple_gla / gla / gated_delta_rule gate g = logsigmoid(randn) / 16: the GLA paper's
  temperature tau = 16 (decay = sigmoid(x)^(1/16)), mean decay per token about 0.95, so the
  state remembers a few dozen tokens, as in trained models. Plain logsigmoid(randn) (decay ~0.45)
  would make every op nearly local and hide errors in long-range terms.
- simple_gla with --g-gamma: no g; g_gamma[h] = log(1 - 2**(-5 - 7 h / (H - 1))), RetNet's per-head
  decays (0.969 ... 0.99976).
- dplr / rwkv7 gate gk (w) = -0.6065 * sigmoid(randn): RWKV-7's decay exp(-e^-0.5 sigmoid(x)),
  so each step's decay lies in (0.545, 1).
- initial_state (gpu_check only): 0.1 * randn, fp32.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

GATE_TEMPERATURE = 16.0


@dataclass(frozen=True)
class OpSpec:
    """One recurrence: its argument names (fla order), scale default and fla-specific extras."""

    name: str
    args: tuple[str, ...]
    default_scale: float | None = None  # None: K ** -0.5
    packages: tuple[str, ...] = ()  # generated.<pkg> candidates, first that imports wins
    fla_kwargs: dict = field(default_factory=dict)  # extra keyword arguments for fla's function
    fla_name: str = ""  # fla's function suffix (chunk_<fla_name>), default name

    @property
    def suffix(self) -> str:
        return self.fla_name or self.name


OPS: dict[str, OpSpec] = {
    s.name: s
    for s in [
        OpSpec("linear_attn", ("q", "k", "v"), fla_kwargs={"normalize": False}),
        OpSpec("simple_gla", ("q", "k", "v", "g")),
        OpSpec("gla", ("q", "k", "v", "g")),
        OpSpec("delta_rule", ("q", "k", "v", "beta")),
        OpSpec("gated_delta_rule", ("q", "k", "v", "g", "beta")),
        OpSpec("kda", ("q", "k", "v", "g", "beta")),
        OpSpec("dplr_delta_rule", ("q", "k", "v", "a", "b", "gk"), packages=("dplr_delta_rule", "dplr")),
        OpSpec("rwkv7", ("r", "w", "k", "v", "a", "b"), default_scale=1.0),
    ]
}

DELTA_FAMILY = {"delta_rule", "gated_delta_rule", "kda", "dplr_delta_rule", "rwkv7"}


# Named shape lists for --shapes (B x T x H x D, K = V = D). standard: the shapes the plans were tuned on.
SHAPE_PRESETS = {
    "standard": ("4x4096x16x128", "8x2048x32x64", "1x16384x16x128", "2x8192x8x256"),
}


def parse_shapes(text: str) -> list[tuple[int, int, int, int, int]]:
    """'4x4096x16x128,standard,...' -> [(B, T, H, K, V), ...]: comma-separated shapes or preset names,
    duplicates dropped, order kept."""
    out: list[tuple[int, int, int, int, int]] = []
    for item in (x.strip() for x in text.split(",")):
        for s in SHAPE_PRESETS.get(item, (item,) if item else ()):
            shape = parse_shape(s)
            if shape not in out:
                out.append(shape)
    return out


def parse_ops(text: str) -> list[str]:
    """'gla,delta_rule' -> ['gla', 'delta_rule']; SystemExit naming an unknown op."""
    ops = [o for o in text.split(",") if o]
    for o in ops:
        if o not in OPS:
            raise SystemExit(f"unknown op {o!r}; known: {', '.join(OPS)}")
    return ops


def parse_shape(s: str) -> tuple[int, int, int, int, int]:
    """'BxTxHxD' or 'BxTxHxKxV' -> (B, T, H, K, V)."""
    parts = [int(p) for p in s.lower().split("x")]
    if len(parts) == 4:
        return parts[0], parts[1], parts[2], parts[3], parts[3]
    if len(parts) == 5:
        return tuple(parts)  # type: ignore[return-value]
    raise ValueError(f"shape {s!r}: expected BxTxHxD or BxTxHxKxV")


def shape_str(shape) -> str:
    B, T, H, K, V = shape
    return f"{B}x{T}x{H}x{K}" if K == V else f"{B}x{T}x{H}x{K}x{V}"


def seed_for(seed: int, *parts) -> int:
    """A per-(op, shape) seed that does not depend on Python's hash randomisation."""
    h = seed
    for p in parts:
        for ch in str(p):
            h = (h * 1000003 + ord(ch)) % (2**61 - 1)
    return h


def has_value_heads(op: OpSpec) -> bool:
    """Whether our generated op takes grouped value heads (v, the gates and beta on HV heads, a multiple of q and
    k's H): its package's INPUTS have a layout on G."""
    pkg = importlib.import_module(f"generated.{(op.packages or (op.name,))[0]}")
    return any("G" in layout for _name, layout, _role, _optional in pkg.INPUTS)


def check_value_heads(op: OpSpec, H: int, HV: int) -> None:
    """ValueError unless ``op`` can take HV value heads beside H query/key heads (HV == H always can)."""
    if HV == H:
        return
    if HV % H:
        raise ValueError(f"{HV} value heads is not a multiple of H = {H}")
    if not has_value_heads(op):
        raise ValueError(f"{op.name} has no grouped value heads")


def make_inputs(op: OpSpec, shape, dtype, device, seed: int, g_gamma: bool = False,
                gate_dtype=None, requires_grad: bool = True, gate_scale: float = 1.0, value_heads: int | None = None):
    """Fresh random inputs, identical in every process for the same seed and device.

    ``gate_scale`` multiplies every per-token log gate (g, gk, w): e.g. 100 makes a 16-token chunk's
    gates move by hundreds, which sends the DPLR kernels down their entry-wise path (a timing A/B of
    the same kernels on the same shapes). ``value_heads``: HV for an op with grouped value heads (v, g and
    beta on HV heads, q and k on the shape's H; Qwen3-Next: H = 16, HV = 32); None: H.

    Returns (names, args, kwargs): positional tensors in fla's order and keyword tensors
    (``g_gamma`` for simple_gla with --g-gamma). Tensors that take gradients are leaves.
    """
    B, T, H, K, V = shape
    HV = value_heads or H
    check_value_heads(op, H, HV)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed % (2**63))
    gate_dtype = gate_dtype or dtype

    def randn(*s):
        return torch.randn(*s, generator=gen, device=device, dtype=torch.float32)

    tensors: dict[str, torch.Tensor] = {}
    kwargs: dict[str, torch.Tensor] = {}
    names = list(op.args)
    for n in op.args:
        if n in ("q", "r"):
            tensors[n] = randn(B, T, H, K)
        elif n == "k":
            x = randn(B, T, H, K)
            tensors[n] = F.normalize(x, p=2, dim=-1) if op.name in DELTA_FAMILY else x
        elif n == "v":
            tensors[n] = randn(B, T, HV, V)
        elif n == "g":
            if op.name == "simple_gla" and g_gamma:
                continue
            gshape = (B, T, HV, K) if op.name in ("gla", "kda") else (B, T, HV)
            tensors[n] = (gate_scale * F.logsigmoid(randn(*gshape)) / GATE_TEMPERATURE).to(gate_dtype)
        elif n == "beta":
            tensors[n] = torch.sigmoid(randn(B, T, HV))
        elif n in ("gk", "w"):
            tensors[n] = (-gate_scale * math.exp(-0.5) * torch.sigmoid(randn(B, T, H, K))).to(gate_dtype)
        elif n == "a":
            kk = F.normalize(randn(B, T, H, K), p=2, dim=-1)
            tensors["a"] = -kk
            tensors["_kk"] = kk
        elif n == "b":
            tensors["b"] = tensors.pop("_kk") * torch.sigmoid(randn(B, T, H, K))
        else:
            raise ValueError(f"no input recipe for argument {n!r} of {op.name}")
    if op.name == "simple_gla" and g_gamma:
        names.remove("g")
        h = torch.arange(H, device=device, dtype=torch.float32)
        kwargs["g_gamma"] = torch.log1p(-(2.0 ** (-5.0 - 7.0 * h / max(H - 1, 1))))
    args = []
    for n in names:
        t = tensors[n]
        if t.dtype == torch.float32 and n not in ("g", "gk", "w"):
            t = t.to(dtype)
        t = t.contiguous().detach()
        if requires_grad:
            t.requires_grad_(True)
        args.append(t)
    return names, args, kwargs


def scale_for(op: OpSpec, K: int) -> float:
    return op.default_scale if op.default_scale is not None else K ** -0.5


def err_text(e: BaseException, limit: int = 300) -> str:
    """'Type: first line of the message', short enough for a table footnote."""
    msg = str(e).strip().splitlines()
    first = msg[0] if msg else ""
    # Triton compile errors put the useful line last
    if len(msg) > 1 and len(first) < 20:
        first = " | ".join(m.strip() for m in msg[:3])
    return f"{type(e).__name__}: {first}"[:limit]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float64 (nan if either has a non-finite value)."""
    a = a.detach().double()
    b = b.detach().double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return float("nan")
    den = b.norm().item()
    num = (a - b).norm().item()
    return num / den if den > 0 else num


def resolve_ours(op: OpSpec, mode: str, fake: bool = False):
    """Our function (mode 'chunk' / 'fused_recurrent' / 'reference') or raise ImportError."""
    if fake:
        return fake_impl(op, mode)
    pkgs = op.packages or (op.name,)
    last: Exception | None = None
    for pkg in pkgs:
        try:
            mod = importlib.import_module(f"generated.{pkg}")
        except ImportError as e:
            last = e
            continue
        fname = f"{pkg}_reference" if mode == "reference" else f"{mode}_{op.suffix}"
        cands = [fname, f"{op.name}_reference"] if mode == "reference" else [fname, f"{mode}_{pkg}"]
        for c in cands:
            if hasattr(mod, c):
                return getattr(mod, c)
        raise ImportError(f"generated.{pkg} has no {fname}")
    raise ImportError(f"generated.{pkgs[0]} not importable ({last})")


def resolve_fla(op: OpSpec, mode: str, fake: bool = False):
    """fla-core's function with our calling convention (extras such as normalize=False bound)."""
    if fake:
        fn = fake_impl(op, mode)
        if op.name == "simple_gla" and mode == "chunk":
            return _FakeRefusal(fn)
        return fn
    mod = importlib.import_module("fla.ops")
    fn = getattr(mod, f"{mode}_{op.suffix}")
    extra = dict(op.fla_kwargs)
    if not extra:
        return fn

    def call(*args, **kwargs):
        return fn(*args, **{**extra, **kwargs})

    call.__name__ = fn.__name__
    return call


# ---------------------------------------------------------------------------------------------
# CPU stand-ins, only for exercising the scripts' plumbing without a GPU (--fake).


def _naive(op: OpSpec, *args, scale=None, initial_state=None, output_final_state=False,
           cu_seqlens=None, g_gamma=None, **_):
    """Quadratic-form linear_attn / simple_gla / gla in float64 (short T only)."""
    if op.name not in ("linear_attn", "simple_gla", "gla"):
        raise NotImplementedError(f"--fake has no stand-in for {op.name}")
    if cu_seqlens is not None:  # one sequence at a time
        cuts = [int(c) for c in cu_seqlens.tolist()]
        outs, hts = [], []
        for i in range(len(cuts) - 1):
            sl = [x[:, cuts[i]:cuts[i + 1]] for x in args]
            h0 = initial_state[i:i + 1] if initial_state is not None else None
            o, ht = _naive(op, *sl, scale=scale, initial_state=h0, output_final_state=output_final_state,
                           g_gamma=g_gamma)
            outs.append(o)
            hts.append(ht)
        return torch.cat(outs, 1), (torch.cat(hts, 0) if output_final_state else None)
    q, k, v = args[:3]
    g = args[3] if len(args) > 3 else None
    B, T, H, K = q.shape
    dt = q.dtype
    q, k, v = q.double(), k.double(), v.double()
    if g is None and g_gamma is not None:
        g = g_gamma.double().view(1, 1, H).expand(B, T, H)
    if g is None:
        G = torch.zeros(B, T, H, 1, dtype=torch.float64, device=q.device)
    else:
        g = g.double()
        G = g.cumsum(1) if g.dim() == 4 else g.cumsum(1).unsqueeze(-1)
    scale = K ** -0.5 if scale is None else scale
    A = torch.einsum("bthk,bshk->bhts", q * G.exp(), k * (-G).exp())
    A = A.masked_fill(~torch.ones(T, T, dtype=torch.bool, device=q.device).tril(), 0)
    o = scale * torch.einsum("bhts,bshv->bthv", A, v)
    if initial_state is not None:
        o = o + scale * torch.einsum("bthk,bhkv->bthv", q * G.exp(), initial_state.double())
    ht = None
    if output_final_state:
        GT = G[:, -1:]
        ht = torch.einsum("bshk,bshv->bhkv", k * (GT - G).exp(), v)
        if initial_state is not None:
            ht = ht + GT[:, 0].unsqueeze(-1).exp() * initial_state.double()
        ht = ht.float()
    return o.to(dt), ht


def fake_impl(op: OpSpec, mode: str):
    def fn(*args, **kwargs):
        return _naive(op, *args, **kwargs)

    fn.__name__ = f"fake_{mode}_{op.name}"
    return fn


class _RefusingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("fake: gated backward refused on this GPU (stand-in for fla's Hopper check)")


class _FakeRefusal:
    """Mimics fla's chunk_simple_gla on Hopper: forward runs, backward raises."""

    def __init__(self, fn):
        self.fn = fn
        self.__name__ = fn.__name__

    def __call__(self, *args, **kwargs):
        o, ht = self.fn(*args, **kwargs)
        if len(args) < 4 or args[3] is None:  # fla refuses only with a per-token gate g
            return o, ht
        return _RefusingBackward.apply(o), ht


def print_table(table: str, path: str | None) -> None:
    """Print a result table, and also write it to ``path`` when given (the device runs bring it back)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(table + "\n")
    print(table, flush=True)


def write_json(path: str | None, obj) -> None:
    """Write ``obj`` as JSON atomically (a run killed mid-write leaves the previous file)."""
    if not path:
        return
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = path + ".tmp"
    Path(tmp).write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def timing_order(libs: list[str], modes: list[list[str]], rounds: int, slices: int = 1) -> list[tuple[int, str, str]]:
    """The (round, library, mode) timings of ``rounds`` rounds, in order (``modes[i]``: what ``libs[i]`` runs).
    In a round each mode's libraries alternate over ``slices`` slices, the library that goes first alternating
    from slice to slice and from round to round (ours, fla, fla, ours, ...).

    The host's speed drifts within a process: on an H200 host the same forward's host time per call fell from
    0.35 to 0.18 ms between two stretches of 0.1 s (ours and fla-core's alike, simple_gla at 1x16384), and
    fla-core's linear_attn forward measured 0.227 and 0.466 ms in two rounds of one process. A library timed in
    one stretch while the other was timed in the next took that change alone; in slices that alternate, both
    sample the same stretches."""
    order = []
    for r in range(rounds):
        for mode in dict.fromkeys(m for lib_modes in modes for m in lib_modes):
            for s in range(slices):
                ranked = list(zip(libs, modes, strict=True))
                if (r + s) % 2:
                    ranked.reverse()
                order += [(r, lib, mode) for lib, lib_modes in ranked if mode in lib_modes]
    return order


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def prime_torch_autograd() -> float:
    """Run one tiny CPU backward with an explicit output gradient and return its seconds.

    A process's first ``Tensor.backward(grad)`` imports torch.fx.experimental.symbolic_shapes and
    sympy (torch.autograd's ``_make_grads``): 2.8 s on the H100 machine, whose site-packages have no
    bytecode cache. Every torch model pays it once, whatever its
    ops, so first-call timings of ours and fla's take it out first and report it apart.
    """
    t0 = time.perf_counter()
    x = torch.ones(2, requires_grad=True)
    (x * 2).backward(torch.ones(2))
    return time.perf_counter() - t0


def wall(fn, device) -> float:
    """Seconds for one call, device work included."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def kernel_breakdown(fn, grads=None, calls: int = 20) -> dict[str, float] | None:
    """The GPU's time of one ``fn()`` per CUDA kernel name, in ms, largest first: each kernel's summed
    duration over ``calls`` calls (torch.profiler), divided by ``calls``; None off CUDA. A kernel launched
    twice per call (a walk in the forward and again in the backward) counts both launches. ``grads``:
    tensors whose .grad is reset before each call, as do_bench's grad_to_none does (accumulating into a
    kept .grad would add an elementwise kernel per input)."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            for t in grads or ():
                t.grad = None
            fn()
        torch.cuda.synchronize()
    per_kernel: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name] = per_kernel.get(e.name, 0.0) + e.time_range.elapsed_us() / 1000 / calls
    return dict(sorted(per_kernel.items(), key=lambda kv: -kv[1]))


def host_ms(fn, device, grads=None, calls: int = 20) -> float:
    """The host's time to issue one ``fn()``, in ms: the median over ``calls`` calls of the CPU time from the
    call's start to its return, the device synced before each call so that no wait for earlier work counts.
    Kernels launch asynchronously, so on CUDA this is validation, planning, allocations and launches; a wall
    time near it, above the kernel time, is a call whose GPU waits for the host. On the CPU it is the whole
    call. ``grads``: as kernel_breakdown."""
    times = []
    for _ in range(calls):
        for t in grads or ():
            t.grad = None
        sync(device)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    sync(device)
    return statistics.median(times)


def kernel_ms(fn, grads=None, calls: int = 20) -> float | None:
    """The GPU's kernel time of one ``fn()`` in ms: the summed duration of every CUDA kernel that ``calls`` calls
    launch (``kernel_breakdown`` summed); None off CUDA. Unlike a wall time it leaves out the gaps in which the
    GPU waits for the host's launches, so it does not depend on the machine's CPU."""
    breakdown = kernel_breakdown(fn, grads, calls)
    return None if breakdown is None else sum(breakdown.values())


def op_step(fn, leaves, call_kwargs: dict, fwd_only: bool):
    """One call of an op as the profilers repeat it: the forward without autograd (``fwd_only``), or the
    forward and a backward of ones into the leaves. Returns o. Each call first resets the leaves' .grad:
    accumulating into it would add one elementwise kernel per input to the profile."""
    do = None

    def step() -> torch.Tensor:
        nonlocal do
        for t in leaves:
            if isinstance(t, torch.Tensor):
                t.grad = None
        if fwd_only:
            with torch.no_grad():
                return fn(*leaves, **call_kwargs)[0]
        o = fn(*leaves, **call_kwargs)[0]
        do = torch.ones_like(o) if do is None else do
        o.backward(do)
        return o

    return step


def interleaved_times(names, measure, rounds: int) -> dict:
    """``measure(name)`` (ms) for every name, ``rounds`` times, the order reversed every other round: a drift or a
    slow stretch of the GPU then shows as a spread between rounds rather than landing on
    one name. Returns {name: [ms per round]}; callers keep the fastest."""
    names = list(names)
    times: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(measure(n))
    return times


def fmt(x, nd=3) -> str:
    """A table cell: '-' for None, 'nan', at most ``nd`` decimals, no trailing zeros."""
    if x is None:
        return "-"
    if isinstance(x, float):
        if x != x:
            return "nan"
        if abs(x) >= 100 or nd == 0:
            return f"{x:.0f}"
        if abs(x) < 1e-2 and x != 0:
            return f"{x:.{max(nd - 1, 1)}e}"
        t = f"{x:.{nd}f}"
        return t.rstrip("0").rstrip(".") if "." in t else t
    return str(x)


def grid(hdr: list, body: list) -> list:
    """A fixed-width text table: the first two columns left-aligned, the rest right-aligned."""
    cols = zip(hdr, *body, strict=True) if body else ([h] for h in hdr)
    w = [max(len(str(x)) for x in col) for col in cols]
    line = "  ".join(f"{{:<{n}}}" if i < 2 else f"{{:>{n}}}" for i, n in enumerate(w))
    out = [line.format(*hdr), "  ".join("-" * n for n in w)]
    out += [line.format(*[str(x) for x in r]) for r in body]
    return out


def versions() -> dict:
    """Python, torch, Triton and fla-core versions and the GPU's name, without initialising CUDA."""
    import subprocess
    import sys
    from importlib import metadata

    v: dict = {"python": sys.version.split()[0]}
    for pkg, key in (("torch", "torch"), ("triton", "triton"), ("fla-core", "fla")):
        try:
            v[key] = metadata.version(pkg)
        except Exception:
            v[key] = None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0 and out.stdout.strip():
            v["gpu"] = out.stdout.strip().splitlines()[0].split(",")[0].strip()
            v["driver"] = out.stdout.strip().splitlines()[0].split(",")[1].strip()
    except Exception:
        pass
    return v
