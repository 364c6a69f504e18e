"""launch.sum_groups: the gradient of a key-side input as the sum of its per-value-head partials, one kernel
(interpreter), against a float64 sum of the partials; its output poisoned first."""

import pytest
import torch

from fla_gen.runtime import launch
from tests.support import poisoned_allocations


@pytest.mark.parametrize(("shape", "key_heads"), [((2, 5, 4, 64), 2), ((1, 7, 12, 100), 3), ((1, 3, 8, 16), 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sum_groups_adds_each_groups_partials(shape, key_heads, dtype):
    """Key head i gets the sum of value heads i * G .. (i + 1) * G - 1, in the requested dtype; a head dim that is
    not a power of two is masked, and rows past the last are never written."""
    gen = torch.Generator().manual_seed(sum(shape) + key_heads)
    B, T, H, K = shape
    partials = torch.randn(B, T, H, K, generator=gen)
    with poisoned_allocations():
        out = launch.sum_groups(partials, key_heads, dtype)
    expected = partials.double().view(B, T, key_heads, H // key_heads, K).sum(3)
    assert out.shape == (B, T, key_heads, K) and out.dtype == dtype
    assert torch.isfinite(out).all()
    bound = 1e-6 if dtype == torch.float32 else 1e-3
    assert ((out.double() - expected).norm() / expected.norm()).item() < bound


def test_sum_groups_without_groups_returns_the_partials():
    """H == HK: the kernels wrote the gradient itself (in the input's dtype), nothing to add."""
    partials = torch.randn(1, 4, 3, 16, dtype=torch.float16)
    assert launch.sum_groups(partials, 3, torch.float16) is partials


@pytest.mark.parametrize(("partials", "key_heads", "named"), [
    (torch.randn(1, 4, 6, 16), 4, "do not split"),
    (torch.randn(1, 4, 16, 4).transpose(2, 3), 2, "contiguous"),
])
def test_sum_groups_refuses_what_it_cannot_add(partials, key_heads, named):
    with pytest.raises(ValueError, match=named):
        launch.sum_groups(partials, key_heads, torch.float32)


def test_sum_groups_launches_nothing_while_tracing_shapes():
    """Inside a fake implementation (torch.compile) the partials are fake tensors: the sum's shape and dtype come
    back and no kernel runs (a launch would read a fake tensor's data pointer)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fla_gen.runtime.tracing import shapes_only_scope

    with FakeTensorMode(), shapes_only_scope():
        out = launch.sum_groups(torch.empty(1, 4, 4, 16), 2, torch.float16)
    assert out.shape == (1, 4, 2, 16) and out.dtype == torch.float16
