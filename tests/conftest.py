"""Shared test setup: the repository root on sys.path (for ``tests.support`` and ``generated``).

Triton's interpreter is switched on only in the folders whose tests run kernels: tests/kernels and
tests/integration (their conftest.py; tests/interpreter.py says why it must happen before an import).
Tests that compile for real GPU targets (tests/aot) run the compiler in a subprocess without it.
"""

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
