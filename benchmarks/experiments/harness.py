"""What the session experiment scripts share: their run options, the timer and the JSON record.

Each experiment runs on the GPU for its timings and, with ``--device cpu --dtype float32`` under
``TRITON_INTERPRET=1``, as a correctness check of its variant kernels (times are then NaN).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import triton
from triton.testing import do_bench


def add_run_options(p: argparse.ArgumentParser) -> None:
    """--reps, --device, --dtype and --out, as every experiment takes them."""
    p.add_argument("--reps", type=int, default=200, help="do_bench's rep (ms) per timing")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", help="float32 for a CPU check under TRITON_INTERPRET=1")
    p.add_argument("--out", default=None, help="write the rows as JSON here")


def timer(args: argparse.Namespace) -> Callable[[Callable[[], object]], float]:
    """ms of a no-argument function: do_bench's median on CUDA, NaN elsewhere (a correctness run only)."""
    def bench(fn: Callable[[], object]) -> float:
        if args.device != "cuda":
            return float("nan")
        return do_bench(fn, warmup=25, rep=args.reps, return_mode="median")
    return bench


def write_record(args: argparse.Namespace, rows: list) -> None:
    """The rows, with the device and versions, to ``--out`` (nothing without it)."""
    if not args.out:
        return
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    with open(args.out, "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, f,
                  indent=1)
