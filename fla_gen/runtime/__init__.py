"""Support code imported by generated packages: plan types, varlen indexing, input validation.

``build_cp_context`` (context parallelism, :mod:`fla_gen.runtime.context_parallel`) is exported here; it is
imported on first use, so that the compiler, which imports the plan types, never imports torch.
"""

_LAZY = {"build_cp_context", "CPContext"}


def __getattr__(name: str):
    if name in _LAZY:
        from fla_gen.runtime import context_parallel

        return getattr(context_parallel, name)
    raise AttributeError(f"module 'fla_gen.runtime' has no attribute {name!r}")
