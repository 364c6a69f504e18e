"""Launch a Triton kernel through a cache of its compiled binaries keyed by Triton's own specialization.

At B = 1 a call's GPU work is short (0.16-0.5 ms of forward at 1x16384x16x128) and split into 3-13 launches, so the
host's time per call bounds it. ``JITFunction.run`` (Triton 3.6) re-reads option defaults and knobs, formats its
cache key as a string and builds launch metadata for the (empty) launch hooks on every launch. :func:`cached_launch`
keeps Triton's binder, so every launch is specialized exactly as Triton would (dtypes, 16-byte alignment, ints
equal to 1 or divisible by 16, ``do_not_specialize``), and launches the binary compiled for that specialization
directly. On the H200's host, both paths in one process, alternating, the host time per call fell 3-15% in two
processes (linear_attn's forward 171 -> 146 and 332 -> 291 us, simple_gla's forward+backward 1182 -> 1010 and
1398 -> 1198, the gated delta rule's 1493 -> 1298 and 1885 -> 1699; bf16, 1x16384x16x128). The binder is about
half of what is left of a launch, but a key of our own computed in Python (each tensor's dtype and alignment, each
int's classes) was no cheaper: 6.4 us against the binder's 6-8 for a walk kernel's 21 arguments, on the CPU machine.

What it does not reproduce goes through ``JITFunction.run`` unchanged: the first launch of a specialization
(which compiles it), a kernel with pre-run hooks, a global the kernel read that has changed since (Triton
raises), and any launch while ``JITFunction.run`` is replaced (the ahead-of-time recorder of fla_gen/aot.py).
Launch hooks that are set (a profiler's) get the metadata Triton would build.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from triton import knobs
from triton.compiler.compiler import CompiledKernel
from triton.knobs import HookChain
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

# JITFunction.run as Triton defines it. A replaced one (fla_gen/aot.py's recorder, a profiler's patch) sees every
# launch: the cache is bypassed while it is in place.
_TRITON_RUN = JITFunction.run
# a global absent from its module's scope: unequal to any value a kernel read
_MISSING = object()


class CachedLaunchKernel:
    """A ``@triton.jit`` kernel whose ``kernel[grid](*args, **kwargs)`` reuses the binary compiled for the same
    specialization. Attributes other than the launch (``fn``, ``arg_names``, ...) are the wrapped
    JITFunction's."""

    def __init__(self, jit: JITFunction) -> None:
        self.jit = jit
        # (device, Triton's specialization, the launch options, the knobs JITFunction.run adds to them) ->
        # the binary that JITFunction.run compiled and launched for them
        self.compiled: dict[tuple, CompiledKernel] = {}

    def __getattr__(self, name: str) -> Any:
        if name == "jit":  # an instance made without __init__ (copy, pickle): no recursion through self.jit
            raise AttributeError(name)
        return getattr(self.jit, name)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Launch on ``grid`` ([X], [X, Y] or [X, Y, Z] programs, or a function of the bound arguments) on the
        current device's current stream; returns the CompiledKernel, as ``JITFunction.run`` does."""
        if not self.compiled or self.jit.pre_run_hooks or JITFunction.run is not _TRITON_RUN:
            return self.first_launch(grid, args, kwargs)
        device = driver.active.get_current_device()
        bound, key = self.specialize(device, args, kwargs)
        kernel = self.compiled.get(key)
        if kernel is None or not self.globals_unchanged():
            return self.first_launch(grid, args, kwargs, key)
        if callable(grid):
            grid = grid(dict(zip(self.jit.arg_names, bound, strict=True)))
        n = len(grid)
        stream = driver.active.get_current_stream(device)
        enter, leave = knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook
        if _idle(enter) and _idle(leave):
            enter = leave = metadata = None
        else:
            metadata = kernel.launch_metadata(grid, stream, *bound)
        kernel.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, stream, kernel.function,
                   kernel.packed_metadata, metadata, enter, leave, *bound)
        return kernel

    def first_launch(self, grid: Any, args: tuple, kwargs: dict[str, Any], key: tuple | None = None) -> Any:
        """Launch through ``JITFunction.run`` (compiling if needed) and remember the binary it launched under
        ``key``, the launch's specialization (computed here where the caller has not)."""
        kernel = self.jit[grid](*args, **kwargs)
        if isinstance(kernel, CompiledKernel) and not self.jit.pre_run_hooks:
            if key is None:
                _, key = self.specialize(driver.active.get_current_device(), args, kwargs)
            self.compiled[key] = kernel
        return kernel

    def specialize(self, device: int, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, tuple]:
        """The arguments bound in the kernel's order, and the cache key of their specialization on ``device``:
        everything ``JITFunction.run`` keys its own cache on."""
        binder = self.jit.device_caches[device][4]
        bound, specialization, options = binder(*args, **kwargs)
        key = (device, tuple(specialization), tuple(options.items()), knobs.runtime.debug,
               knobs.compilation.instrumentation_mode)
        return tuple(bound.values()), key

    def globals_unchanged(self) -> bool:
        """Whether every global the kernel read when it was compiled still has that value (``JITFunction.run``
        raises otherwise; the first launch path does)."""
        return all(scope.get(name, _MISSING) == value
                   for (name, _), (value, scope) in self.jit.used_global_vals.items())


def _idle(hook: Any) -> bool:
    """Whether a launch hook does nothing: unset, or a HookChain with no hook in it."""
    return hook is None or (isinstance(hook, HookChain) and not hook.calls)


def cached_launch(kernel: Any) -> Any:
    """Decorate a ``@triton.jit`` kernel (applied above ``@triton.jit``) so that its launches reuse compiled
    binaries through :class:`CachedLaunchKernel`. Under ``TRITON_INTERPRET=1`` the kernel is an
    InterpretedFunction and is returned unchanged."""
    return CachedLaunchKernel(kernel) if isinstance(kernel, JITFunction) else kernel
