"""Shared test helpers: compile a shipped spec, import its generated package, poison allocations."""

from __future__ import annotations

import contextlib
import importlib
from functools import cache
from pathlib import Path

import torch

from fla_gen.canonical import Recurrence, canonicalize
from fla_gen.check import check_spec
from fla_gen.parse import read_spec

REPO_ROOT = Path(__file__).resolve().parent.parent
SPECS = sorted((REPO_ROOT / "specs").glob("*.fla"))


@cache
def recurrence(op: str) -> Recurrence:
    return canonicalize(check_spec(read_spec(REPO_ROOT / "specs" / f"{op}.fla")))


def generated(op: str):
    return importlib.import_module(f"generated.{op}")


@contextlib.contextmanager
def poisoned_allocations():
    """Make torch.empty & co. return NaN-filled floating tensors, so an element a kernel
    forgets to write shows up as NaN in the result instead of passing by luck."""
    originals = (torch.empty, torch.empty_like, torch.Tensor.new_empty)

    def poison(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    def empty(*args, **kwargs):
        return poison(originals[0](*args, **kwargs))

    def empty_like(*args, **kwargs):
        return poison(originals[1](*args, **kwargs))

    def new_empty(self, *args, **kwargs):
        return poison(originals[2](self, *args, **kwargs))

    torch.empty, torch.empty_like, torch.Tensor.new_empty = empty, empty_like, new_empty
    try:
        yield
    finally:
        torch.empty, torch.empty_like, torch.Tensor.new_empty = originals
