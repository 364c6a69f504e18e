"""Keep fla-core's autotune picks between processes and machines.

fla-core autotunes most of its kernels: its first call at a new shape compiles and times every config, minutes
per op (5.5 minutes for chunk_kda's forward and backward at two shapes on the H100). Triton can keep each
autotuned kernel's timings beside its compiled code (``TRITON_CACHE_AUTOTUNING=1``: a ``<kernel>.autotune.json``
in the kernel's cache directory, keyed by the kernel's source, its configs and the autotune key), and a later
process then takes the same pick without timing anything. A fresh machine has an empty cache, so the picks are
kept in a directory of their own here (a few KB each, unlike the compiled kernels): restored into Triton's cache
before the run, collected back after it.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import threading
import time
from pathlib import Path

PICK_SUFFIX = ".autotune.json"


def triton_cache_dir() -> Path:
    """Triton's cache directory as Triton resolves it: ``TRITON_CACHE_DIR``, else ``~/.triton/cache``."""
    return Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache")


def copy_picks(source: Path, target: Path) -> int:
    """Copy every ``*.autotune.json`` under ``source`` to the same relative path under ``target`` (the relative
    path is Triton's cache key: the file is found again only there), each through a temporary file and a rename,
    so that a process killed mid-copy leaves no half-written pick. Returns how many were copied."""
    count = 0
    for pick in sorted(source.rglob(f"*{PICK_SUFFIX}")):
        dest = target / pick.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        # named per thread too: the collecting thread and the copy at exit can run at once in one process
        partial = dest.with_name(f".{dest.name}.{os.getpid()}.{threading.get_ident()}.partial")
        shutil.copyfile(pick, partial)
        os.replace(partial, dest)
        count += 1
    return count


def keep_autotune_picks(picks: Path, every_s: float = 20.0) -> int:
    """Turn on Triton's autotune cache for this process and the processes it starts, restore the picks kept in
    ``picks`` into Triton's cache now, and copy every pick the cache holds back into ``picks`` every ``every_s``
    seconds and at exit. The copies along the way keep what fla autotuned before a time limit killed the process
    (a kill skips the copy at exit; one sweep lost minutes of fla's autotuning so). Call it before the first
    autotuned launch. Returns how many picks were restored."""
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    cache = triton_cache_dir()
    picks.mkdir(parents=True, exist_ok=True)
    restored = copy_picks(picks, cache)
    atexit.register(copy_picks, cache, picks)

    def collect() -> None:
        while True:
            time.sleep(every_s)
            copy_picks(cache, picks)

    threading.Thread(target=collect, name="keep-autotune-picks", daemon=True).start()
    return restored


def use_autotune_picks(picks: Path | None, prefix: str = "") -> None:
    """``keep_autotune_picks(picks)`` when ``--autotune-picks`` was given (``picks`` not None), saying how many
    picks it restored (``prefix`` starts the line)."""
    if picks:
        restored = keep_autotune_picks(picks)
        print(f"{prefix}{restored} fla autotune picks restored from {picks}", flush=True)


def add_autotune_picks_argument(parser: argparse.ArgumentParser) -> None:
    """``--autotune-picks DIR`` (a Path, default None), the same option in every benchmark that runs fla-core."""
    parser.add_argument("--autotune-picks", type=Path, default=None, metavar="DIR",
                        help="keep fla-core's autotune picks in DIR: restored before the run, saved after it, so "
                             "that a later run (another machine too) skips fla's minutes of autotuning at shapes "
                             "DIR has seen")
