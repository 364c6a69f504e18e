"""Switch Triton's interpreter on for the folders whose tests run generated kernels (tests/kernels,
tests/integration: their conftest.py calls ``switch_on``).

``@triton.jit`` decides between a compiled and an interpreted kernel when it decorates the function, i.e. when
a generated module is imported, so TRITON_INTERPRET must be set before that. pytest imports a folder's
conftest.py when it starts collecting that folder; a whole-suite run collects tests/aot, tests/compiler and
tests/golden first, which import no kernel module. If one did, ``switch_on`` would find its kernels decorated
for the GPU and stop the run with a clear error rather than fail later on a CPU tensor.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _kernels_decorated_for_the_gpu() -> list[str]:
    """Modules of this repository already imported with compiled (not interpreted) Triton kernels."""
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None:
        return []
    return sorted(name for name, mod in list(sys.modules.items())
                  if str(getattr(mod, "__file__", None) or "").startswith(str(REPO_ROOT))
                  and any(isinstance(v, jit.JITFunction) for v in vars(mod).values()))


def switch_on() -> None:
    """TRITON_INTERPRET=1 unless already set; with FLA_GEN_TEST_DEVICE=cuda (the device-agnostic tests on a
    GPU) real kernels instead, on that default device."""
    device = os.environ.get("FLA_GEN_TEST_DEVICE", "cpu")
    if device != "cpu":
        import torch

        torch.set_default_device(device)
        return
    if "TRITON_INTERPRET" in os.environ:
        return
    if stale := _kernels_decorated_for_the_gpu():
        raise pytest.UsageError(f"{', '.join(stale)} imported Triton kernels before TRITON_INTERPRET was set: "
                                "import generated kernels only from tests/kernels or tests/integration")
    os.environ["TRITON_INTERPRET"] = "1"
