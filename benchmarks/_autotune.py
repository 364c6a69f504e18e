"""Keep fla-core's autotune picks between processes and machines.

fla-core autotunes most of its kernels: its first call at a new shape compiles and times every config, minutes
per op (5.5 minutes for chunk_kda's forward and backward at two shapes on the H100). Triton can keep each
autotuned kernel's timings beside its compiled code (``TRITON_CACHE_AUTOTUNING=1``: a ``<kernel>.autotune.json``
in the kernel's cache directory, keyed by the kernel's source, its configs and the autotune key), and a later
process then takes the same pick without timing anything. A fresh machine has an empty cache, so the picks are
kept in a directory of their own here (a few KB each, unlike the compiled kernels): restored into Triton's cache
before the run, collected back after it.

Picks are kept per measured shape (``<DIR>/<tag>``). fla's autotune keys leave the batch and the sequence length
out (``chunk_gated_delta_rule_fwd_kernel_h_blockdim64`` keys on H, K, V, BT and the dtypes), so one directory for
every shape gave a 1x16384 call whichever config fla had timed first at, say, 4x4096; fla-core's forward time at
1x16384 then differed by 20-30% between two of our tools. A fresh fla process tunes at the shape it meets first;
per-shape picks reproduce that. For the same reason every pick is cleared from Triton's cache before the restore:
an earlier process on the machine, at another shape, leaves its picks there.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
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


def clear_picks(cache: Path) -> int:
    """Delete every ``*.autotune.json`` under ``cache`` (compiled kernels stay). Returns how many."""
    count = 0
    for pick in cache.rglob(f"*{PICK_SUFFIX}") if cache.is_dir() else ():
        pick.unlink(missing_ok=True)
        count += 1
    return count


def shape_picks_dir(picks: Path, tag: str) -> Path:
    """The directory under ``picks`` that keeps one measured shape's picks: ``tag`` (e.g. ``1x16384x16x128``,
    ``varlen:32x256-8192x16x128``) with every character but letters, digits, ``.`` and ``-`` as ``_``."""
    name = "".join(c if c.isalnum() or c in ".-" else "_" for c in tag)
    if not name.strip("._"):
        raise ValueError(f"autotune picks: {tag!r} names no shape")
    return picks / name


# (Triton's cache, the picks directory) of this process's keep_autotune_picks, or None
_kept: tuple[Path, Path] | None = None
# Held by a copy of the background thread, and by timed_stretch while it pauses them.
_copy_lock = threading.Lock()
_paused = threading.Event()


def keep_autotune_picks(picks: Path, every_s: float = 20.0) -> int:
    """Turn on Triton's autotune cache for this process and the processes it starts, clear every pick from
    Triton's cache, restore the picks kept in ``picks`` into it now, and copy every pick the cache holds back into
    ``picks`` every ``every_s`` seconds and at exit. The copies along the way keep what fla autotuned before a time
    limit killed the process (a kill skips the copy at exit; one sweep lost minutes of fla's autotuning so). Call it
    before the first autotuned launch, with one shape's directory (shape_picks_dir). Returns how many picks were
    restored."""
    os.environ["TRITON_CACHE_AUTOTUNING"] = "1"
    cache = triton_cache_dir()
    clear_picks(cache)
    picks.mkdir(parents=True, exist_ok=True)
    restored = copy_picks(picks, cache)
    atexit.register(copy_picks, cache, picks)
    global _kept
    _kept = (cache, picks)

    def collect() -> None:
        while True:
            time.sleep(every_s)
            with _copy_lock:
                if not _paused.is_set():
                    copy_picks(cache, picks)

    threading.Thread(target=collect, name="keep-autotune-picks", daemon=True).start()
    return restored


@contextlib.contextmanager
def timed_stretch():
    """No background copy of keep_autotune_picks while a benchmark times: its walk of Triton's cache takes the GIL
    and the CPU from calls whose host time can bound their wall time (a B = 1 forward at 1x16384). A copy on entry
    first keeps what the warm-up autotuned, as the background copy would have; a no-op without
    keep_autotune_picks."""
    if _kept is None:
        yield
        return
    with _copy_lock:
        copy_picks(*_kept)
        _paused.set()
    try:
        yield
    finally:
        _paused.clear()


def use_autotune_picks(picks: Path | None, tag: str, prefix: str = "") -> int | None:
    """``keep_autotune_picks`` on ``tag``'s directory under ``picks`` when ``--autotune-picks`` was given (``picks``
    not None), saying how many picks it restored (``prefix`` starts the line). ``tag``: the shape (or shapes) this
    process times fla at. Returns the count, or None without ``picks``."""
    if not picks:
        return None
    where = shape_picks_dir(picks, tag)
    restored = keep_autotune_picks(where)
    print(f"{prefix}{restored} fla autotune picks restored from {where}", flush=True)
    return restored


def add_autotune_picks_argument(parser: argparse.ArgumentParser) -> None:
    """``--autotune-picks DIR`` (a Path, default None), the same option in every benchmark that runs fla-core."""
    parser.add_argument("--autotune-picks", type=Path, default=None, metavar="DIR",
                        help="keep fla-core's autotune picks in DIR, one subdirectory per measured shape: "
                             "restored before the run, saved after it, so that a later run (another machine too) "
                             "skips fla's minutes of autotuning at shapes DIR has seen")
