"""benchmarks/segment_sweep.py without a GPU: a bad argument is a usage error naming it, before any CUDA call, and
the op's own segment length is read from its generated package alone (the GPU machine has no spec parser)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import assert_usage_error_before_cuda

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "segment_sweep.py"


@pytest.mark.parametrize(("args", "named"), [
    (["--chunks", "0,-8"], "--chunks"),
    (["--chunks", "x"], "--chunks"),
    (["--rounds", "0"], "--rounds"),
    (["--shapes", "1x16384"], "--shapes"),
])
def test_bad_arguments_are_usage_errors(args, named):
    assert_usage_error_before_cuda(SCRIPT, args, named)


def test_rule_chunks_come_from_the_generated_package_without_the_compiler():
    """The length the ops' rules pick on 132 SMs of sm90, with the spec parser (lark) unimportable: the delta family's
    TRANSITION_SPLIT (8 segments of 32 chunks at 1x16384x16x128), the diagonal families' DIAGONAL_SPLIT (16 of 16),
    and DPLR's DPLR_SPLIT (16 of 64 of its 16-token chunks)."""
    code = (
        "import sys; sys.modules['lark'] = None; sys.path.insert(0, sys.argv[1])\n"
        "from unittest import mock\n"
        "import torch\n"
        "import segment_sweep\n"
        "from fla_gen.runtime.dispatch import forced_arch\n"
        "with mock.patch('fla_gen.runtime.launch.sm_count', return_value=132), forced_arch('sm90'):\n"
        "    print([segment_sweep._rule_chunks(op, (1, 16384, 16, 128, 128), torch.bfloat16)\n"
        "           for op in ('gated_delta_rule', 'kda', 'simple_gla', 'dplr_delta_rule')])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(BENCHMARKS)], capture_output=True, text=True, timeout=300,
                          cwd=BENCHMARKS.parent)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[32, 32, 16, 64]"
