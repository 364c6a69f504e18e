"""benchmarks/host_overhead.py: every shipped op in every mode runs with its kernels stubbed, grouped value heads and
call-time flags included (the tool raised KeyError on the grouped layout letter G before it took --group)."""

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

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
