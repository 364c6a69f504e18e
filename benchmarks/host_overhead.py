#!/usr/bin/env python3
"""Host (CPU/Python) time of one call of a generated op, with every Triton kernel stubbed out so a
launch costs nothing: what is left is validation, plan selection, allocations and the dispatcher.

    python benchmarks/host_overhead.py [op ...] [--modes nograd,fwd,fwdbwd,decode] [--profile MODE]
    python benchmarks/host_overhead.py gated_delta_rule kda --group 2 --flags use_qk_l2norm_in_kernel
    python benchmarks/host_overhead.py gated_delta_rule --modes fwd --shape 1x16384x16x128 --sms 132
    python benchmarks/host_overhead.py simple_gla --modes fwd --shape 1x16384x16x128 --sms 132 --launches

``--launches`` counts the launches too: every kernel goes through runtime/cached_launch.py as on an sm90 GPU
(Triton's binder for sm90, the cache of binaries) up to the driver's launch, which a stand-in binary makes a no-op,
and the calls take sm90's plans (dispatch.forced_arch). At B = 1 that path is about half of a call's host time. It
needs the compiled kernels' objects: not under TRITON_INTERPRET=1.

Modes: ``nograd`` chunk op under no_grad; ``fwd`` chunk op with inputs that require grad (forward
only); ``fwdbwd`` forward and torch.autograd.grad; ``decode`` the fused_recurrent op at T = 1 with an
initial state and output_final_state=True (the path that skips the dispatcher, runtime/torch_op.py).
Runs on the CPU; no device is needed. ``--sms`` plans the launches as on a GPU with that many SMs
(launch.forced_sm_count): without it the CPU's plans run, which never split a sequence into segments, so a
B = 1 call's segment walks and scan (and their launches) are left out.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import importlib
import importlib.util
import os
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from triton.compiler.compiler import CompiledKernel  # noqa: E402

from fla_gen.runtime import cached_launch, launch  # noqa: E402
from fla_gen.runtime.dispatch import forced_arch  # noqa: E402

# every generated package (a spec added to specs/ and built is measured without a change here)
OPS = tuple(sorted(d.name for d in (ROOT / "generated").iterdir() if (d / "chunk.py").is_file()))
MODES = ("nograd", "fwd", "fwdbwd", "decode")
# B, T, H, D of the chunk modes. The CPU's allocator costs more per large tensor than CUDA's caching
# allocator does: a small shape (--shape 1x64x16x128) leaves the host code's own time.
CHUNK_SHAPE = (8, 2048, 32, 64)


class _Stub:
    """``kernel[grid](...)`` that does nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


class _StandInBinary(CompiledKernel):
    """A compiled kernel whose launch does nothing (no binary to load, no driver call)."""

    def __init__(self) -> None:
        self.function, self.packed_metadata = None, None

    def run(self, *launch) -> None:
        pass


def _route_launches(module) -> None:
    """Route every kernel of ``module`` through cached_launch as on an sm90 GPU: Triton's sm90 binder specializes
    each launch, and the first launch of a specialization "compiles" a stand-in binary; device 0, stream 0."""
    from types import SimpleNamespace

    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend
    from triton.runtime.jit import create_function_from_signature

    cached_launch.driver = SimpleNamespace(active=SimpleNamespace(get_current_device=lambda: 0,
                                                                  get_current_stream=lambda device: 0))
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    for name in dir(module):
        kernel = getattr(module, name)
        if isinstance(kernel, cached_launch.CachedLaunchKernel):
            jit = kernel.jit
            binder = create_function_from_signature(jit.signature, jit.params, backend)
            jit.device_caches[0] = ({}, {}, None, backend, binder)  # Triton 3.6's per-device cache entry
            jit.run = lambda *args, grid, warmup, **kwargs: _StandInBinary()


def _stub_kernels(module) -> None:
    for name in dir(module):
        if name.endswith("_kernel"):
            setattr(module, name, _Stub())


def _inputs(op: str, B: int, T: int, H: int, D: int, requires_grad: bool, group: int) -> list[torch.Tensor | None]:
    """One tensor per input of ``op`` (INPUTS), shaped by its layout; optional gates are given. A spec with
    grouped value heads (layout letter G) gets ``group`` value heads per q/k head; other specs ignore it."""
    package = importlib.import_module(f"generated.{op}")
    sizes = {"B": B, "T": T, "H": H, "G": H * group, "K": D, "V": D}
    out = []
    for _name, layout, role, _optional in package.INPUTS:
        x = torch.randn(*(sizes[c] for c in layout))
        if role == "gate":
            x = torch.nn.functional.logsigmoid(x) / 16
        out.append(x.requires_grad_(requires_grad))
    return out


def _value(op: str, args: list[torch.Tensor | None]) -> torch.Tensor:
    """The values input among ``args`` (in INPUTS order): it has the output's and the state's heads."""
    roles = [role for _name, _layout, role, _optional in importlib.import_module(f"generated.{op}").INPUTS]
    return args[roles.index("value")]


def _callable(op: str, mode: str, group: int = 1, flags: tuple[str, ...] = (),
              shape: tuple[int, int, int, int] = CHUNK_SHAPE, launches: bool = False):
    """A zero-argument function running one call of ``op`` in ``mode``, with the call-time ``flags``
    (fla's boolean switches, e.g. ``use_qk_l2norm_in_kernel``) set to True; ``launches``: every kernel launched
    through cached_launch with a stand-in binary (_route_launches) rather than stubbed."""
    kind = "fused_recurrent" if mode == "decode" else "chunk"
    replace_kernels = _route_launches if launches else _stub_kernels
    replace_kernels(importlib.import_module(f"generated.{op}.{kind}"))
    if importlib.util.find_spec(f"generated.{op}.transforms"):  # a spec's transforms launch kernels too
        replace_kernels(importlib.import_module(f"generated.{op}.transforms"))
    # and the runtime's (the group sum of dq and dk): run, it would count its kernel as host time, and add the
    # uninitialized partials the stubbed kernels left
    replace_kernels(launch)
    package = importlib.import_module(f"generated.{op}")
    # the public function is named by the spec's op, which a package may rename (dplr: chunk_dplr_delta_rule)
    public = next(name for name in dir(package) if name.startswith(f"{kind}_"))
    fn = functools.partial(getattr(package, public), **dict.fromkeys(flags, True))
    if mode == "decode":
        B, T, H, D = 64, 1, 16, 128
        args = _inputs(op, B, T, H, D, False, group)
        h0 = torch.zeros(B, _value(op, args).shape[2], D, D)
        return lambda: fn(*args, initial_state=h0, output_final_state=True)
    B, T, H, D = shape
    args = _inputs(op, B, T, H, D, mode != "nograd", group)
    if mode == "nograd":
        def call():
            with torch.no_grad():
                fn(*args)
        return call
    if mode == "fwd":
        return lambda: fn(*args)
    do = torch.randn_like(_value(op, args))
    leaves = [a for a in args if a is not None]
    return lambda: torch.autograd.grad(fn(*args)[0], leaves, do)


def measure(op: str, mode: str, iters: int = 500, repeats: int = 3, group: int = 1,
            flags: tuple[str, ...] = (), shape: tuple[int, int, int, int] = CHUNK_SHAPE,
            launches: bool = False) -> float:
    """Microseconds of host time per call of ``op`` in ``mode``: the best of ``repeats`` runs of
    ``iters`` calls, after 20 warm-up calls (the best, as the CPU's allocator of the large tensors
    makes single runs noisy)."""
    call = _callable(op, mode, group, flags, shape, launches)
    for _ in range(20):
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iters):
            call()
        best = min(best, (time.perf_counter() - start) / iters * 1e6)
    return best


def main() -> int:
    head, _, rest = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(description=" ".join(head.split()), epilog=rest,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="*", default=["simple_gla", "gla", "gated_delta_rule"], choices=OPS,
                        metavar="OP", help=f"generated packages to measure (default: simple_gla gla gated_delta_rule; "
                                           f"any of {', '.join(OPS)})")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)} "
                                                                 f"(default: all)")
    parser.add_argument("--iters", type=int, default=500, help="calls per timed run (default: 500)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per cell; the best is reported "
                                                               "(default: 3)")
    parser.add_argument("--profile", choices=MODES, help="cProfile one op in this mode instead")
    parser.add_argument("--group", type=int, default=1,
                        help="value heads per q/k head, for specs with grouped value heads (Qwen3-Next: 2)")
    parser.add_argument("--flags", default="", help="comma-separated call-time switches set to True, "
                        "e.g. use_qk_l2norm_in_kernel")
    default_shape = "x".join(map(str, CHUNK_SHAPE))
    parser.add_argument("--shape", default=default_shape, help=f"BxTxHxD of the chunk modes (default: {default_shape})")
    parser.add_argument("--sms", type=int, default=0,
                        help="plan the launches for a GPU with this many SMs (H100/H200: 132; default: the CPU's "
                             "plans, which never split a sequence)")
    parser.add_argument("--launches", action="store_true",
                        help="launch every kernel through runtime/cached_launch.py with a stand-in binary, on sm90's "
                             "plans, instead of stubbing it (not under TRITON_INTERPRET=1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    flags = tuple(f for f in args.flags.split(",") if f)
    unknown = [m for m in args.modes.split(",") if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    shape = tuple(int(n) for n in args.shape.split("x"))
    if len(shape) != 4:
        parser.error(f"--shape takes BxTxHxD, got {args.shape!r}")
    if args.sms < 0:
        parser.error(f"--sms must be 0 (the CPU's plans) or more, got {args.sms}")
    if args.launches and os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        parser.error("--launches needs the compiled kernels' objects: unset TRITON_INTERPRET")
    with contextlib.ExitStack() as scope:
        if args.sms:
            scope.enter_context(launch.forced_sm_count(args.sms))
        if args.launches:
            scope.enter_context(forced_arch("sm90"))
        return _report(args, flags, shape)


def _report(args: argparse.Namespace, flags: tuple[str, ...], shape: tuple[int, ...]) -> int:
    """The table of host times per op and mode (or one cProfile), under the caller's SM count."""
    if args.profile:
        call = _callable(args.ops[0], args.profile, args.group, flags, shape, args.launches)
        for _ in range(20):
            call()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.iters):
            call()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return 0
    print(f"{'op':24s}" + "".join(f"{m:>10s}" for m in args.modes.split(",")) + "   (host us/call)")
    for op in args.ops:
        row = [measure(op, m, args.iters, args.repeats, args.group, flags, shape, args.launches)
               for m in args.modes.split(",")]
        print(f"{op:24s}" + "".join(f"{us:10.1f}" for us in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
