"""benchmarks/real_models.py without a GPU: a bad argument is a usage error naming it, before any CUDA call; the
speed cells' rounds of alternating slices (do_bench and the profiler stood in for)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.support import assert_usage_error_before_cuda

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_models.py"


@pytest.mark.parametrize(("args", "named"), [
    (["--batches", "x"], "--batches"),
    (["--batches", "0,4"], "--batches"),
    (["--check-libs", "ours,torch"], "--check-libs"),
    (["--check-libs", ""], "--check-libs"),
    (["--only", "gdn,mamba"], "--only"),
    (["--slices", "0"], "--slices"),
    (["--rounds", "0"], "--rounds"),
])
def test_bad_arguments_are_usage_errors(args, named):
    assert_usage_error_before_cuda(SCRIPT, args, named)


def test_speed_rounds_are_medians_of_alternating_slices(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import real_models
    import triton.testing

    ran = []

    def library(name):
        def fn(**kwargs):
            ran.append(name)
            return (kwargs["v"] * 1.0,)
        return fn

    timed = []
    times = {"ours": iter([0.3, 0.1, 0.2, 9.0, 9.0, 9.0]), "fla": iter([0.5, 0.4, 0.6, 9.0, 9.0, 9.0])}

    def do_bench(run, **kwargs):
        ran.clear()
        run()
        timed.append(ran[0])
        return next(times[ran[0]])

    monkeypatch.setattr(triton.testing, "do_bench", do_bench)
    monkeypatch.setattr(real_models, "ours_and_fla", lambda kind: (library("ours"), None, None, library("fla"), None))
    monkeypatch.setattr(real_models, "kernel_breakdown", lambda run, grads: {"k": 1.0})
    monkeypatch.setattr(real_models, "peak_mb", lambda run, grads: 0.0)
    x = {"v": torch.randn(1, 4, 2, 8)}
    result = real_models.speed("gdn", x, rounds=1, quick=True, slices=3)
    assert timed[:6] == ["ours", "fla", "fla", "ours", "ours", "fla"]
    assert result["fwd_ours_ms"] == 0.2 and result["fwd_fla_ms"] == 0.5
    assert result["fwd_fla_over_ours_worst"] == pytest.approx(2.5)
