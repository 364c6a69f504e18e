"""Test setup: generated kernels run in Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before triton or any generated module is imported, so it is set
here, at collection time. Tests that compile for real GPU targets run in a subprocess
without it (see test_aot_matrix.py).
"""

import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
