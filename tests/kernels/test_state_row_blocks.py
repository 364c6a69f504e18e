"""The delta family's backward state walk (bwd_dh) holds the [BK, BV] state gradient as up to four row blocks
of launch.state_row_block(BK) rows: the block size it picks, and the ops' gradients against the float64
reference at head dims that use one, two and four blocks, a partly masked last block among them."""

from __future__ import annotations

import pytest
import torch

from fla_gen.runtime import launch
from tests.support import compare_chunk_op, spy_on_launch


@pytest.mark.parametrize(("block_k", "expected"), [(16, 16), (32, 32), (64, 64), (128, 64), (256, 64)])
def test_state_row_block(block_k, expected):
    assert launch.state_row_block(block_k) == expected


def test_state_row_block_refuses_more_than_four_blocks():
    with pytest.raises(ValueError, match="does not fit 4 row blocks"):
        launch.state_row_block(512)


# Head dim 256 has plans for 16-bit inputs only (fp32 tiles do not fit shared memory): fp16 there.
@pytest.mark.parametrize(("package", "op", "K", "blocks", "dtype"), [
    ("delta_rule", "delta_rule", 32, 1, torch.float32),  # one block narrower than 64
    ("delta_rule", "delta_rule", 96, 2, torch.float32),  # BK 128: the second block half masked
    ("gated_delta_rule", "gated_delta_rule", 128, 2, torch.float32),
    ("delta_rule", "delta_rule", 200, 4, torch.float16),  # BK 256: the fourth block mostly masked
    ("gated_delta_rule", "gated_delta_rule", 256, 4, torch.float16),
])
def test_backward_walk_on_row_blocks(monkeypatch, package, op, K, blocks, dtype):
    """Forward, every gradient (dht and the initial state's included) against the float64 reference, with
    the state gradient split into ``blocks`` row blocks."""
    picked = spy_on_launch(monkeypatch, "state_row_block")
    result = compare_chunk_op(package, (2, 70, 1, K, 16), dtype, seed=K, op=op)
    assert not result.failures(), result.errors
    assert picked, "bwd_dh did not ask for its row block"
    assert {launch.cdiv(launch.whole_dim_tile(K), rb) for rb in picked} == {blocks}
