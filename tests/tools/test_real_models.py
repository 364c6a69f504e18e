"""benchmarks/real_models.py without a GPU: a bad argument is a usage error naming it, before any CUDA call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import assert_usage_error_before_cuda

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_models.py"


@pytest.mark.parametrize(("args", "named"), [
    (["--batches", "x"], "--batches"),
    (["--batches", "0,4"], "--batches"),
    (["--check-libs", "ours,torch"], "--check-libs"),
    (["--check-libs", ""], "--check-libs"),
    (["--only", "gdn,mamba"], "--only"),
])
def test_bad_arguments_are_usage_errors(args, named):
    assert_usage_error_before_cuda(SCRIPT, args, named)
