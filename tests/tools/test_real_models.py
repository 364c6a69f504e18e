"""benchmarks/real_models.py without a GPU: a bad argument is a usage error naming it, before any CUDA call."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "real_models.py"


@pytest.mark.parametrize(("args", "named"), [
    (["--batches", "x"], "--batches"),
    (["--batches", "0,4"], "--batches"),
    (["--check-libs", "ours,torch"], "--check-libs"),
    (["--check-libs", ""], "--check-libs"),
    (["--only", "gdn,mamba"], "--only"),
])
def test_bad_arguments_are_usage_errors(args, named):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {named}" in proc.stderr
    assert "CUDA" not in proc.stderr
