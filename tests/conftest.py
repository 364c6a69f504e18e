"""Test setup: generated kernels run in Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before triton or any generated module is imported, so it is set
here, at collection time. Tests that compile for real GPU targets run in a subprocess
without it (see test_aot_matrix.py).
"""

import os
import sys
from pathlib import Path

# FLA_GEN_TEST_DEVICE=cuda runs the device-agnostic tests (validation) on a GPU with real kernels.
TEST_DEVICE = os.environ.get("FLA_GEN_TEST_DEVICE", "cpu")
if TEST_DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    import torch

    torch.set_default_device(TEST_DEVICE)

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
