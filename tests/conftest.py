"""Shared test setup: the repository root on sys.path (for ``tests.support`` and ``generated``), and Triton's
interpreter switched on before any test module imports Triton (tests/interpreter.py says why it must be this
early). Tests that compile for real GPU targets (tests/aot) run the compiler in a subprocess without it.
"""

import sys
import zlib
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.interpreter import switch_on  # noqa: E402  (needs the root on sys.path)

switch_on()

import torch  # noqa: E402  (after switch_on, like everything that may import Triton)


@pytest.fixture(autouse=True)
def _global_rng_seeded_per_test(request):
    """torch's global generator seeded from the test's id before every test, so that a failure reproduces when
    the test runs alone. The helpers draw the initial state and the output weights from it; unseeded, those
    depend on the tests its xdist worker happened to run before it, and an error that depends on the draw
    (a per-head gradient, a sum over tokens: fla_gen.verify.per_head_gradient_scales) could fail in CI and
    never alone. crc32, not hash(): str hashes are salted per process."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
