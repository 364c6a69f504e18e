"""benchmarks/_autotune.py: fla's autotune picks restored into Triton's cache under their cache keys and collected
back at exit, picks only (not the compiled kernels beside them); and the key layout is the one Triton reads."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import _autotune  # noqa: E402


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_restore_then_collect_at_exit(tmp_path):
    picks, cache = tmp_path / "picks", tmp_path / "cache"
    write(picks / "KEYA" / "chunk_fwd_kernel.autotune.json", '{"key": "a"}')
    # a child process keeps the picks, finds the restored one in its cache, autotunes a new kernel (a new pick
    # beside a compiled kernel) and exits: the new pick comes back, the compiled kernel does not
    child = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(REPO_ROOT / "benchmarks")!r})
import os, _autotune
assert _autotune.keep_autotune_picks(Path({str(picks)!r})) == 1
assert os.environ["TRITON_CACHE_AUTOTUNING"] == "1"
cache = Path({str(cache)!r})
assert (cache / "KEYA" / "chunk_fwd_kernel.autotune.json").read_text() == '{{"key": "a"}}'
(cache / "KEYB").mkdir()
(cache / "KEYB" / "chunk_bwd_kernel.autotune.json").write_text('{{"key": "b"}}')
(cache / "KEYB" / "chunk_bwd_kernel.cubin").write_text("binary")
"""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    env.pop("TRITON_CACHE_AUTOTUNING", None)
    subprocess.run([sys.executable, "-c", child], env=env, check=True)
    kept = sorted(str(p.relative_to(picks)) for p in picks.rglob("*") if p.is_file())
    assert kept == ["KEYA/chunk_fwd_kernel.autotune.json", "KEYB/chunk_bwd_kernel.autotune.json"]
    assert (picks / "KEYB" / "chunk_bwd_kernel.autotune.json").read_text() == '{"key": "b"}'


def test_picks_are_collected_while_the_process_runs(tmp_path):
    """A process killed before it exits (a benchmark's time limit) still leaves the picks it autotuned more than one
    collection interval before the kill."""
    picks, cache = tmp_path / "picks", tmp_path / "cache"
    child = f"""
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, {str(REPO_ROOT / "benchmarks")!r})
import _autotune
assert _autotune.keep_autotune_picks(Path({str(picks)!r}), every_s=0.05) == 0
(Path({str(cache)!r}) / "KEYC").mkdir(parents=True)
(Path({str(cache)!r}) / "KEYC" / "chunk_fwd_kernel.autotune.json").write_text('{{"key": "c"}}')
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    run = subprocess.run([sys.executable, "-c", child], env=env)
    assert run.returncode == -9
    assert (picks / "KEYC" / "chunk_fwd_kernel.autotune.json").read_text() == '{"key": "c"}'
    assert not [p for p in picks.rglob("*") if p.name.endswith(".partial")]


def test_cache_dir_follows_triton(monkeypatch, tmp_path):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert _autotune.triton_cache_dir() == tmp_path
    monkeypatch.delenv("TRITON_CACHE_DIR")
    assert _autotune.triton_cache_dir() == Path.home() / ".triton" / "cache"


def test_triton_reads_picks_where_they_are_restored(monkeypatch, tmp_path):
    """Triton's autotuner looks a pick up as <cache dir>/<key>/<kernel>.autotune.json through its cache manager,
    and reads TRITON_CACHE_AUTOTUNING and TRITON_CACHE_DIR when it runs, not when it is imported: what
    keep_autotune_picks relies on."""
    from triton import knobs
    from triton.runtime.autotuner import Autotuner

    source = inspect.getsource(Autotuner.check_disk_cache)
    assert "get_cache_manager(cache_key)" in source and '.autotune.json"' in source
    monkeypatch.setenv("TRITON_CACHE_AUTOTUNING", "1")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert knobs.autotuning.cache
    assert Path(knobs.cache.dir) == tmp_path
