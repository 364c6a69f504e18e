"""Whether host code runs for shapes only: inside a generated op's fake implementation (torch.compile, export),
where tensors carry no values and no kernel may launch. A leaf module, so that both the op registration
(``torch_op``) and the launchers of the runtime's own kernels (``launch.sum_groups``) can read it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_SHAPES_ONLY: contextvars.ContextVar[bool] = contextvars.ContextVar("fla_gen_shapes_only", default=False)


def shapes_only() -> bool:
    """True while a fake implementation runs: host code must not read tensor values or launch kernels."""
    return _SHAPES_ONLY.get()


@contextlib.contextmanager
def shapes_only_scope() -> Iterator[None]:
    """Run the enclosed host code for shapes only (``shapes_only()`` is True inside)."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)
