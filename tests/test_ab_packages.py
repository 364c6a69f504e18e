"""benchmarks/ab_packages.py on the CPU: a copy of a generated package imported next to the checkout's runs its
own kernels, through its public op with and without autograd, while the checkout's op is unaffected. (Its
timing needs a GPU.)"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from tests.conftest import REPO_ROOT
from tests.support import generated

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import _ops  # noqa: E402
import ab_packages  # noqa: E402


@pytest.fixture
def old_tree(tmp_path):
    """A copy of generated/linear_attn as the 'old' tree; its ab_old modules are dropped afterwards."""
    (tmp_path / "generated").mkdir()
    shutil.copy(REPO_ROOT / "generated" / "__init__.py", tmp_path / "generated" / "__init__.py")
    shutil.copytree(REPO_ROOT / "generated" / "linear_attn", tmp_path / "generated" / "linear_attn")
    yield tmp_path
    for name in [m for m in sys.modules if m == "ab_old" or m.startswith("ab_old.")]:
        del sys.modules[name]


def test_old_tree_runs_its_own_kernels(old_tree, monkeypatch):
    op = _ops.OPS["linear_attn"]
    new_fn = ab_packages.public_chunk_op(generated("linear_attn"), op)
    old_pkg = ab_packages.import_old_tree(old_tree, "linear_attn")
    old_fn = ab_packages.public_chunk_op(old_pkg, op)
    assert old_fn.__module__ == "ab_old.linear_attn.chunk"

    _, args, kwargs = _ops.make_inputs(op, (1, 32, 2, 16, 16), torch.float32, "cpu", seed=3)
    do = torch.randn(1, 32, 2, 16)
    same = ab_packages.run_side(old_fn, args, kwargs, 0.25, do)
    for a, b in zip(same, ab_packages.run_side(new_fn, args, kwargs, 0.25, do), strict=True):
        torch.testing.assert_close(a, b)

    # Sabotage the old copy's launcher: the old op fails on both paths, the checkout's op still runs.
    def refuse(*_args, **_kwargs):
        raise RuntimeError("the old tree's chunk_fwd ran")

    monkeypatch.setattr(sys.modules["ab_old.linear_attn.chunk"], "chunk_fwd", refuse)
    with pytest.raises(RuntimeError, match="old tree"), torch.no_grad():
        old_fn(*args, scale=0.25, **kwargs)
    with pytest.raises(RuntimeError, match="old tree"):
        ab_packages.run_side(old_fn, args, kwargs, 0.25, do)
    ab_packages.run_side(new_fn, args, kwargs, 0.25, do)
