"""runtime/cached_launch.py: a launch reuses the binary compiled for its specialization, and anything else goes
through JITFunction.run.

The CPU has no GPU to compile for, so the kernel here is a real JITFunction whose binder is Triton's own, built for
sm90 as on an H100, while its compile-and-launch (``JITFunction.run``) and the binary it returns are stand-ins that
record what they were given. On the GPU every generated op launches through it (benchmarks/gpu_check.py).
"""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import triton.language as tl
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.nvidia.compiler import CUDABackend
from triton.compiler.compiler import CompiledKernel
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction, create_function_from_signature

from fla_gen.runtime import cached_launch
from fla_gen.runtime.cached_launch import CachedLaunchKernel

STREAM = 1234


def scale_kernel(x, y, n, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr = False):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + i, tl.load(x + i, mask=i < n) * scale, mask=i < n)


class Binary(CompiledKernel):
    """A compiled kernel whose launcher records its launches."""

    def __init__(self, function: str, launches: list[tuple]) -> None:  # no binary to load
        self.function, self.packed_metadata, self.launches = function, "meta", launches

    def run(self, *launch):  # Triton's is a property that loads the launcher
        self.launches.append((self.function, *launch))

    def launch_metadata(self, grid, stream, *args):
        return ("launch metadata", grid, stream)


class Recorder:
    """Stands in for JITFunction.run: each call compiles (returns a fresh Binary)."""

    def __init__(self) -> None:
        self.compiles: list[tuple] = []
        self.launches: list[tuple] = []

    def jit_run(self, *args, grid, warmup, **kwargs):
        self.compiles.append((grid, args, kwargs))
        return Binary(f"binary{len(self.compiles)}", self.launches)


@pytest.fixture
def kernel(monkeypatch):
    """A CachedLaunchKernel around a JITFunction specialized for sm90, on device 0 and stream STREAM."""
    jit = JITFunction(scale_kernel)
    backend = CUDABackend(GPUTarget("cuda", 90, 32))
    jit.device_caches[0] = ({}, {}, None, backend, create_function_from_signature(jit.signature, jit.params, backend))
    recorder = Recorder()
    monkeypatch.setattr(jit, "run", recorder.jit_run)  # the instance's: JITFunction.run itself stays Triton's
    monkeypatch.setattr(cached_launch, "driver", SimpleNamespace(active=SimpleNamespace(
        get_current_device=lambda: 0, get_current_stream=lambda device: STREAM)))
    wrapped = CachedLaunchKernel(jit)
    wrapped.recorder = recorder
    return wrapped


def aligned(n: int) -> torch.Tensor:
    x = torch.empty(n + 64)
    offset = (-x.data_ptr() % 16) // x.element_size()
    return x[offset:offset + n]


def test_a_second_launch_of_a_specialization_skips_triton(kernel):
    x, y = aligned(256), aligned(256)
    first = kernel[(4,)](x, y, 256, 2.0, BLOCK=64, num_warps=4)
    assert len(kernel.recorder.compiles) == 1 and kernel.recorder.launches == []
    second = kernel[(4,)](x, y, 256, 2.0, BLOCK=64, num_warps=4)
    assert second is first and len(kernel.recorder.compiles) == 1
    # every argument in the kernel's order, the constexprs and defaults included, as JITFunction.run passes them
    assert kernel.recorder.launches == [("binary1", 4, 1, 1, STREAM, "binary1", "meta", None, None, None,
                                         x, y, 256, 2.0, 64, False)]


@pytest.mark.parametrize("change", ["misaligned pointer", "int divisible by 16", "int equal to 1", "constexpr",
                                    "default constexpr given", "dtype", "num_warps"])
def test_another_specialization_compiles_through_triton(kernel, change):
    x, y = aligned(256), aligned(256)
    args, kwargs = [x, y, 250, 2.0], {"BLOCK": 64, "num_warps": 4}
    kernel[(4,)](*args, **kwargs)
    kernel[(4,)](*args, **kwargs)
    if change == "misaligned pointer":
        args[0] = aligned(257)[1:]
    elif change == "int divisible by 16":
        args[2] = 256
    elif change == "int equal to 1":
        args[2] = 1
    elif change == "constexpr":
        kwargs["BLOCK"] = 128
    elif change == "default constexpr given":
        kwargs["EVEN"] = True
    elif change == "dtype":
        args[0] = aligned(256).half()
    else:
        kwargs["num_warps"] = 8
    kernel[(4,)](*args, **kwargs)
    assert len(kernel.recorder.compiles) == 2, change
    kernel[(4,)](*args, **kwargs)
    assert len(kernel.recorder.compiles) == 2 and len(kernel.recorder.launches) == 2, change


def test_a_grid_function_gets_the_bound_arguments(kernel):
    x, y = aligned(256), aligned(256)
    grid = lambda meta: (meta["n"] // meta["BLOCK"], 2)  # noqa: E731
    kernel[grid](x, y, 256, 2.0, BLOCK=64)
    kernel[grid](x, y, 256, 2.0, BLOCK=64)
    assert kernel.recorder.launches[0][1:4] == (4, 2, 1)


def test_set_launch_hooks_get_their_metadata(kernel, monkeypatch):
    x, y = aligned(256), aligned(256)
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    hook = knobs.HookChain()
    hook.add(lambda metadata: None)
    monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    launch = kernel.recorder.launches[0]
    assert launch[7] == ("launch metadata", (4,), STREAM) and launch[8] is hook


def test_a_replaced_jit_run_sees_every_launch(kernel, monkeypatch):
    x, y = aligned(256), aligned(256)
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: None)  # as fla_gen/aot.py's recorder does
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    assert len(kernel.recorder.compiles) == 2 and kernel.recorder.launches == []


def test_a_changed_global_goes_back_through_triton(kernel):
    x, y = aligned(256), aligned(256)
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    scope = {"LIMIT": 1}
    kernel.jit.used_global_vals[("LIMIT", id(scope))] = (1, scope)
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    scope["LIMIT"] = 2
    kernel[(4,)](x, y, 256, 2.0, BLOCK=64)
    assert len(kernel.recorder.compiles) == 2 and len(kernel.recorder.launches) == 1


def test_the_interpreter_keeps_its_kernels():
    interpreted = InterpretedFunction(scale_kernel)
    assert cached_launch.cached_launch(interpreted) is interpreted
    assert isinstance(cached_launch.cached_launch(JITFunction(scale_kernel)), CachedLaunchKernel)


def test_a_copy_reads_the_same_kernel(kernel):
    assert copy.copy(kernel).fn is scale_kernel
