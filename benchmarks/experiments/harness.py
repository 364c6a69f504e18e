"""What the session experiment scripts share: their run options, the timer and the JSON record.

Each experiment runs on the GPU for its timings and, with ``--device cpu --dtype float32`` under
``TRITON_INTERPRET=1``, as a correctness check of its variant kernels (times are then NaN).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile
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


def warm_up_clocks(args: argparse.Namespace, bench: Callable[[Callable[[], object]], float]) -> None:
    """On CUDA, a few hundred ms of matrix products before the first timing: the first variant timed from an
    idle GPU read 2x slow in session 11 (the clocks had not come up)."""
    if args.device == "cuda":
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        bench(lambda: a @ a)


def write_record(args: argparse.Namespace, rows: list) -> None:
    """The rows, with the device and versions, to ``--out`` (nothing without it)."""
    if not args.out:
        return
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else args.device
    with open(args.out, "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, f,
                  indent=1)


def jit_from_source(source: str, name: str):
    """The function ``name`` of a kernel's edited source (a generated kernel's, cut or rewritten as text): written
    to a module of its own and imported, since Triton's JIT reads a kernel's source from its file."""
    path = os.path.join(tempfile.mkdtemp(), f"{name}.py")
    with open(path, "w") as f:
        f.write("import triton\nimport triton.language as tl\n\n\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)
