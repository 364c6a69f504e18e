"""A non-contiguous initial_state (a view into a larger tensor, as a cache slice is) gives the same result as
its contiguous copy: the kernels index the state as a dense [N, H, K, V] array, so the ops make it one."""

import pytest
import torch

from fla_gen.sample import relative_error, sample_inputs
from tests.support import SPECS, generated, poisoned_allocations, recurrence

PACKAGES = [p.stem for p in SPECS]


def _public(pkg, prefix: str):
    return getattr(pkg, next(n for n in pkg.__all__ if n.startswith(prefix)))


@pytest.mark.parametrize("mode", ["chunk_", "fused_recurrent_"])
@pytest.mark.parametrize("package", PACKAGES)
def test_strided_initial_state_matches_reference(package, mode):
    pkg = generated(package)
    x = sample_inputs(recurrence(package), 1, 20, 2, 16, 16, torch.float32, seed=11)
    wide = torch.randn(1, 2, 16, 40)
    h0 = wide[..., 8:24]  # [1, 2, 16, 16] with a row stride of 40
    assert not h0.is_contiguous()
    with poisoned_allocations():
        o, ht = _public(pkg, mode)(**x, initial_state=h0, output_final_state=True)
    ref = getattr(pkg, next(n for n in pkg.__all__ if n.endswith("_reference")))
    o_ref, ht_ref = ref(**{n: t.double() for n, t in x.items()}, initial_state=h0.double(), output_final_state=True)
    assert relative_error(o, o_ref) < 1e-4
    assert relative_error(ht, ht_ref) < 1e-4
