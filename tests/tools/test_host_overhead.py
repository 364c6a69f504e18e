"""benchmarks/host_overhead.py: every shipped op in every mode runs with its kernels stubbed, grouped value heads and
call-time flags included (the tool raised KeyError on the grouped layout letter G before it took --group); with
--launches, through cached_launch's cache of binaries."""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import host_overhead  # noqa: E402

from tests.support import generated  # noqa: E402

# (op, value heads per q/k head, flags): the two real-model specs as Qwen3-Next and Kimi Linear call them, and KDA
# with grouped value heads
CASES = [(op, 1, ()) for op in host_overhead.OPS] + [
    ("gated_delta_rule", 2, ("use_qk_l2norm_in_kernel",)),
    ("kda", 1, ("use_qk_l2norm_in_kernel",)),
    ("kda", 2, ("use_qk_l2norm_in_kernel",)),
]


@pytest.mark.parametrize("op,group,flags", CASES)
def test_every_mode_measures(monkeypatch, op, group, flags):
    # the tool stubs kernels for good; here only for this test, so later tests in the process launch real ones
    def stub(module):
        for name in dir(module):
            if name.endswith("_kernel"):
                monkeypatch.setattr(module, name, host_overhead._Stub())

    monkeypatch.setattr(host_overhead, "_stub_kernels", stub)
    for mode in host_overhead.MODES:
        us = host_overhead.measure(op, mode, iters=2, repeats=1, group=group, flags=flags, shape=(1, 16, 2, 16))
        assert math.isfinite(us) and us > 0, (op, mode, us)
    # the stubs are gone after the test: a kernel of the package is Triton's again
    monkeypatch.undo()
    chunk = generated(op).chunk
    assert not any(isinstance(getattr(chunk, n), host_overhead._Stub) for n in dir(chunk) if n.endswith("_kernel"))
    assert not isinstance(host_overhead.launch.sum_groups_kernel, host_overhead._Stub)


def test_sms_plans_the_segment_walks_of_a_long_call(monkeypatch, capsys):
    launched = []

    class Counting(host_overhead._Stub):
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            launched.append(self.name)
            return super().__getitem__(grid)

    def stub(module):
        for name in dir(module):
            if name.endswith("_kernel"):
                monkeypatch.setattr(module, name, Counting(name))

    monkeypatch.setattr(host_overhead, "_stub_kernels", stub)
    argv = ["host_overhead.py", "gated_delta_rule", "--modes", "fwd", "--shape", "1x16384x2x16", "--iters", "1",
            "--repeats", "1"]
    for sms in ("0", "132"):
        launched.clear()
        monkeypatch.setattr(sys, "argv", [*argv, "--sms", sms])
        assert host_overhead.main() == 0
        scans = [n for n in launched if "segment_scan" in n]
        # 2 heads on 132 SMs: the 16384 tokens split into segments; the CPU's plans never split
        assert bool(scans) == (sms == "132"), (sms, sorted(set(launched)))
    assert "gated_delta_rule" in capsys.readouterr().out


# In a process without TRITON_INTERPRET (the kernels are JITFunctions wrapped by cached_launch): simple_gla's forward
# at 1x2048x2x16 on sm90's plans and 132 SMs, its 8 segments walked from zero, scanned and walked again, routed by
# --launches. Every call launches each kernel through cached_launch's cache; only the first call of a specialization
# goes to the stand-in compile.
_LAUNCH_PROBE = """
import sys
sys.path.insert(0, "benchmarks")
import host_overhead
from fla_gen.runtime import launch
from fla_gen.runtime.dispatch import forced_arch

compiles, launches = [], []


class Counted(host_overhead._StandInBinary):
    def __init__(self):
        super().__init__()
        compiles.append(self)

    def run(self, *launch):
        launches.append(launch)


host_overhead._StandInBinary = Counted
with forced_arch("sm90"), launch.forced_sm_count(132):
    call = host_overhead._callable("simple_gla", "fwd", shape=(1, 2048, 2, 16), launches=True)
    call()
    first_compiles, first_launches = len(compiles), len(launches)
    for _ in range(3):
        call()
print(first_compiles, first_launches, len(compiles), len(launches))
"""


def test_launches_go_through_the_cache_of_binaries():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _LAUNCH_PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    first_compiles, first_launches, compiles, launches = map(int, proc.stdout.split())
    # the first call compiles each of its kernels' specializations and launches nothing through the cache ...
    assert first_compiles >= 3 and first_launches == 0, proc.stdout
    # ... every later call launches all of them from it, compiling nothing
    assert compiles == first_compiles and launches == 3 * first_compiles, proc.stdout


def test_launches_refused_under_the_interpreter():
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "host_overhead.py"), "simple_gla", "--launches"],
                          cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "unset TRITON_INTERPRET" in proc.stderr and "Traceback" not in proc.stderr
