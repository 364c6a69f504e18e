"""Switch Triton's interpreter on for the whole suite (tests/conftest.py calls ``switch_on``).

``@triton.jit`` decides between a compiled and an interpreted kernel when it decorates the function: when a
generated module is imported, and also when ``triton.language`` itself is imported (its library functions such
as ``tl.sum`` are ``@triton.jit`` functions). An interpreted kernel that calls a ``tl.sum`` decorated for the GPU
fails with "Cannot call @triton.jit'd outside of the scope of a kernel". So TRITON_INTERPRET must be set before
anything imports Triton, which is why the root conftest.py sets it, before pytest collects any test module
(tests/aot imports ``fla_gen.aot``, which imports Triton). Tests that compile for real GPU targets run the
compiler in a subprocess whose environment drops TRITON_INTERPRET. If Triton was imported before ``switch_on``
ran, it stops the run with a clear error rather than fail later inside a kernel.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def _kernels_decorated_for_the_gpu() -> list[str]:
    """Modules already imported with compiled (not interpreted) Triton kernels, bare or wrapped by
    runtime/cached_launch.py: Triton's own library and this repository's modules."""
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None:
        return []
    return sorted(name for name, mod in list(sys.modules.items())
                  if (name == "triton.language.standard"
                      or str(getattr(mod, "__file__", None) or "").startswith(str(REPO_ROOT)))
                  and any(isinstance(v, jit.JITFunction) or isinstance(getattr(v, "jit", None), jit.JITFunction)
                          for v in vars(mod).values()))


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
                                "set TRITON_INTERPRET=1 before the first import of Triton")
    os.environ["TRITON_INTERPRET"] = "1"
