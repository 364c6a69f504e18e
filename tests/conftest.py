"""Shared test setup: the repository root on sys.path (for ``tests.support`` and ``generated``), and Triton's
interpreter switched on before any test module imports Triton (tests/interpreter.py says why it must be this
early). Tests that compile for real GPU targets (tests/aot) run the compiler in a subprocess without it.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from tests.interpreter import switch_on  # noqa: E402  (needs the root on sys.path)

switch_on()
