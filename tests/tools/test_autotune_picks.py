"""benchmarks/_autotune.py: fla's autotune picks restored into Triton's cache under their cache keys and collected
back at exit, picks only (not the compiled kernels beside them); and the key layout is the one Triton reads."""

from __future__ import annotations

import inspect
import json
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


def test_no_background_copy_while_timing(tmp_path):
    """timed_stretch copies once on entry (what the warm-up autotuned), then the background thread copies nothing
    until it ends; outside one the copies go on. Without keep_autotune_picks it does nothing. In a child process:
    the background thread lives as long as its process."""
    child = f"""
import sys, time
from pathlib import Path
sys.path.insert(0, {str(REPO_ROOT / "benchmarks")!r})
import _autotune
copies = []
real_copy = _autotune.copy_picks
_autotune.copy_picks = lambda src, dst: copies.append((src, dst)) or 0
with _autotune.timed_stretch():
    pass
assert copies == []
_autotune.keep_autotune_picks(Path({str(tmp_path / "picks")!r}), every_s=0.02)
kept = (_autotune.triton_cache_dir(), Path({str(tmp_path / "picks")!r}))
copies.clear()
with _autotune.timed_stretch():
    assert copies == [kept], copies
    time.sleep(0.2)  # ten intervals of the background thread
    assert copies == [kept], copies
time.sleep(0.2)
assert len(copies) > 1 and set(copies) == {{kept}}, copies
_autotune.copy_picks = real_copy
"""
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / "cache")}
    subprocess.run([sys.executable, "-c", child], env=env, check=True)


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


def test_a_pick_left_by_another_shape_is_cleared_before_the_restore(tmp_path):
    """fla's autotune keys leave B and T out: a pick an earlier process made at another shape sits in Triton's
    cache under the same key and would be taken. keep_autotune_picks clears it (not the compiled kernel beside it),
    restores only this shape's picks, and does not collect the stale one into this shape's directory."""
    picks, cache = tmp_path / "picks", tmp_path / "cache"
    here = _autotune.shape_picks_dir(picks, "1x16384x16x128")
    write(here / "KEYA" / "chunk_fwd_kernel.autotune.json", '{"tuned at": "1x16384"}')
    write(_autotune.shape_picks_dir(picks, "4x4096x16x128") / "KEYA" / "chunk_fwd_kernel.autotune.json",
          '{"tuned at": "4x4096"}')
    write(cache / "KEYA" / "chunk_fwd_kernel.autotune.json", '{"tuned at": "4x4096"}')
    write(cache / "KEYS" / "chunk_bwd_kernel.autotune.json", '{"tuned at": "4x4096"}')
    write(cache / "KEYS" / "chunk_bwd_kernel.cubin", "binary")
    child = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(REPO_ROOT / "benchmarks")!r})
import _autotune
assert _autotune.use_autotune_picks(Path({str(picks)!r}), "1x16384x16x128") == 1
cache = Path({str(cache)!r})
assert (cache / "KEYA" / "chunk_fwd_kernel.autotune.json").read_text() == '{{"tuned at": "1x16384"}}'
assert not (cache / "KEYS" / "chunk_bwd_kernel.autotune.json").exists()
assert (cache / "KEYS" / "chunk_bwd_kernel.cubin").read_text() == "binary"
"""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, "-c", child], env=env, check=True)
    assert sorted(str(p.relative_to(here)) for p in here.rglob("*") if p.is_file()) == [
        "KEYA/chunk_fwd_kernel.autotune.json"]


def test_shape_directories_are_plain_names():
    picks = Path("picks")
    assert _autotune.shape_picks_dir(picks, "1x16384x16x128") == picks / "1x16384x16x128"
    assert _autotune.shape_picks_dir(picks, "varlen:32x256-8192x16x128") == picks / "varlen_32x256-8192x16x128"
    assert _autotune.shape_picks_dir(picks, "../x") == picks / ".._x"
    for bad in ("", "/", ".."):
        try:
            _autotune.shape_picks_dir(picks, bad)
        except ValueError as e:
            assert "names no shape" in str(e)
        else:
            raise AssertionError(f"{bad!r} was taken")


def test_run_py_keeps_picks_per_shape(tmp_path):
    """run.py's worker restores the picks of its own shape only (CPU stand-ins, --fake)."""
    picks, cache, out = tmp_path / "picks", tmp_path / "cache", tmp_path / "out"
    write(picks / "1x32x2x16" / "KEYA" / "k.autotune.json", '{"tuned at": "1x32"}')
    write(picks / "4x32x2x16" / "KEYB" / "k.autotune.json", '{"tuned at": "4x32"}')
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "run.py"), "--fake", "--device", "cpu", "--presets", "",
           "--shapes", "1x32x2x16", "--ops", "linear_attn", "--rounds", "1", "--out", str(out),
           "--autotune-picks", str(picks)]
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "1x32x2x16: " in proc.stdout and "1 fla autotune picks restored" in proc.stdout
    assert (cache / "KEYA" / "k.autotune.json").exists() and not (cache / "KEYB").exists()
    assert json.loads((out / "shapes" / "1x32x2x16.json").read_text())["fla_picks_restored"] == 1
