"""Every generated op, in Triton's interpreter, against its derived reference in float64.

Forward output, final state and the gradients of every input and of initial_state, by
relative norm error, on fresh random inputs with realistic gates; T is not a multiple of
the chunk size, K != V, H > 1; allocations are poisoned with NaN so unwritten elements fail.
"""

import pytest
import torch

from fla_gen.verify import verify_op
from tests.support import generated, poisoned_allocations, recurrence

OPS = ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"]
MODES = ["chunk", "fused_recurrent"]


def check(op, mode, dtype, **sizes):
    result = verify_op(generated(op), recurrence(op), mode, dtype, guard=poisoned_allocations, **sizes)
    assert not result.failures(), f"{result.name} {dtype}: over tolerance {result.failures()} (all {result.errors})"


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_matches_reference(op, mode, dtype):
    check(op, mode, dtype, B=2, T=100, H=2, K=32, V=48, with_h0=dtype == torch.float32)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("mode", MODES)
def test_varlen_matches_reference(op, mode):
    check(op, mode, torch.float32, B=1, T=100, H=2, K=20, V=32, cu_seqlens=[0, 17, 17, 90, 100])
