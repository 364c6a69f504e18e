#!/usr/bin/env python3
"""Host (CPU/Python) time of one call of a generated op, with every Triton kernel stubbed out so a
launch costs nothing: what is left is validation, plan selection, allocations and the dispatcher.

    python benchmarks/host_overhead.py [op ...] [--modes nograd,fwd,fwdbwd,decode] [--profile MODE]

Modes: ``nograd`` chunk op under no_grad; ``fwd`` chunk op with inputs that require grad (forward
only); ``fwdbwd`` forward and torch.autograd.grad; ``decode`` the fused_recurrent op at T = 1 with an
initial state and output_final_state=True (the path that skips the dispatcher, runtime/torch_op.py).
Runs on the CPU; no device is needed.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import importlib.util
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

OPS = ("simple_gla", "gla", "gated_delta_rule", "delta_rule", "linear_attn", "rwkv7", "dplr",
       "gated_delta_rule_rope")
MODES = ("nograd", "fwd", "fwdbwd", "decode")


class _Stub:
    """``kernel[grid](...)`` that does nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


def _stub_kernels(module) -> None:
    for name in dir(module):
        if name.endswith("_kernel"):
            setattr(module, name, _Stub())


def _inputs(op: str, B: int, T: int, H: int, D: int, requires_grad: bool) -> list[torch.Tensor | None]:
    """One tensor per input of ``op`` (INPUTS), shaped by its layout; optional gates are given."""
    package = importlib.import_module(f"generated.{op}")
    sizes = {"B": B, "T": T, "H": H, "K": D, "V": D}
    out = []
    for _name, layout, role, _optional in package.INPUTS:
        x = torch.randn(*(sizes[c] for c in layout))
        if role == "gate":
            x = torch.nn.functional.logsigmoid(x) / 16
        out.append(x.requires_grad_(requires_grad))
    return out


def _callable(op: str, mode: str):
    """A zero-argument function running one call of ``op`` in ``mode``."""
    kind = "fused_recurrent" if mode == "decode" else "chunk"
    _stub_kernels(importlib.import_module(f"generated.{op}.{kind}"))
    if importlib.util.find_spec(f"generated.{op}.transforms"):  # a spec's transforms launch kernels too
        _stub_kernels(importlib.import_module(f"generated.{op}.transforms"))
    fn = getattr(importlib.import_module(f"generated.{op}"), f"{kind}_{op}")
    if mode == "decode":
        B, T, H, D = 64, 1, 16, 128
        args = _inputs(op, B, T, H, D, False)
        h0 = torch.zeros(B, H, D, D)
        return lambda: fn(*args, initial_state=h0, output_final_state=True)
    B, T, H, D = 8, 2048, 32, 64
    args = _inputs(op, B, T, H, D, mode != "nograd")
    if mode == "nograd":
        def call():
            with torch.no_grad():
                fn(*args)
        return call
    if mode == "fwd":
        return lambda: fn(*args)
    do = torch.randn(B, T, H, D)
    leaves = [a for a in args if a is not None]
    return lambda: torch.autograd.grad(fn(*args)[0], leaves, do)


def measure(op: str, mode: str, iters: int = 500, repeats: int = 3) -> float:
    """Microseconds of host time per call of ``op`` in ``mode``: the best of ``repeats`` runs of
    ``iters`` calls, after 20 warm-up calls (the best, as the CPU's allocator of the large tensors
    makes single runs noisy)."""
    call = _callable(op, mode)
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ops", nargs="*", default=["simple_gla", "gla", "gated_delta_rule"])
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", choices=MODES, help="cProfile one op in this mode instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.profile:
        call = _callable(args.ops[0], args.profile)
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
        row = [measure(op, m, args.iters, args.repeats) for m in args.modes.split(",")]
        print(f"{op:24s}" + "".join(f"{us:10.1f}" for us in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
