"""The state walk's small-grid split (launch.state_walk_tiles, and launch.whole_k_walk_block_v for the walks
that keep all of K): the tiles they pick, and the chunk ops computed with the split tiles in the
interpreter against the float64 reference."""

from __future__ import annotations

import pytest
import torch

from fla_gen.runtime import launch
from fla_gen.runtime.dispatch import overridden_plans
from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference
from tests.support import compare_chunk_op, generated, poisoned_allocations, recurrence, spy_on_launch


@pytest.mark.parametrize(("tiles", "dims", "walks", "sms", "expected"), [
    # the measured case: 1x16384x16x128 on the H100's 132 SMs, 64 programs -> 128 -> 256
    ((64, 64), (128, 128), 16, 132, (32, 32)),
    # 4x4096x16x128: 256 programs already
    ((64, 64), (128, 128), 64, 132, (64, 64)),
    # the grid stays small: the tiles stop at 32
    ((64, 64), (128, 128), 1, 132, (32, 32)),
    # the plan's tile is already below the floor (head dim 16): kept
    ((16, 16), (16, 16), 1, 132, (16, 16)),
    # V halves first on a tie, K next; off CUDA (0 SMs) nothing changes
    ((64, 64), (64, 64), 2, 4, (64, 32)),
    ((64, 64), (128, 128), 1, 0, (64, 64)),
    # a wide V tile halves before a narrower K tile
    ((32, 128), (128, 128), 4, 100, (32, 32)),
])
def test_state_walk_tiles(tiles, dims, walks, sms, expected):
    assert launch.state_walk_tiles(*tiles, *dims, walks, sms) == expected


def test_forced_sm_count_is_scoped():
    cpu = torch.device("cpu")
    assert launch.sm_count(cpu) == 0
    with launch.forced_sm_count(132):
        assert launch.sm_count(cpu) == 132
    assert launch.sm_count(cpu) == 0


@pytest.fixture
def picked_tiles(monkeypatch):
    """The (BK, BV) of every launch.state_walk_tiles call while the test runs, in order."""
    return spy_on_launch(monkeypatch, "state_walk_tiles")


def compare_on_many_sms(package: str, op: str, cu_seqlens: list[int] | None, seed: int):
    """chunk_<op> of generated/<package> against its float64 reference, forward and every gradient, launched
    as on a GPU with 1000 SMs (so the small-grid splits apply) at K = V = 64, dense or varlen."""
    dims = (1, 130, 2, 64, 64) if cu_seqlens else (2, 100, 2, 64, 64)
    with launch.forced_sm_count(1000):
        return compare_chunk_op(package, dims, torch.float32, seed=seed, cu_seqlens=cu_seqlens, op=op)


@pytest.mark.parametrize(("package", "op", "cu_seqlens"), [
    ("simple_gla", "simple_gla", None),
    ("simple_gla", "simple_gla", [0, 50, 50, 130]),
    ("gla", "gla", None),
    ("gla", "gla", [0, 50, 50, 130]),
])
def test_gated_ops_with_split_state_walk(picked_tiles, package, op, cu_seqlens):
    """As on a GPU with many SMs: fwd_h (forward, and its recomputation in the backward) runs on 32x32
    tiles instead of the plan's 64x64, and the outputs and every gradient still match the reference."""
    result = compare_on_many_sms(package, op, cu_seqlens, seed=5)
    assert not result.failures(), result.errors
    assert picked_tiles and set(picked_tiles) == {(32, 32)}, picked_tiles


def test_plan_override_pins_the_state_walk_tiles(picked_tiles):
    """A plan override is an experiment (sweep_plans.py): its fwd_h tiles run as given, not split."""
    pkg, rec = generated("simple_gla"), recurrence("simple_gla")
    x = sample_inputs(rec, 1, 64, 2, 64, 64, torch.float32, seed=6)
    with launch.forced_sm_count(1000):
        pkg.chunk_simple_gla(*x.values())
        with overridden_plans({"fwd_h": {"block_k": 64, "block_v": 64}}):
            pkg.chunk_simple_gla(*x.values())
    assert picked_tiles == [(32, 32), (64, 64)]


@pytest.mark.parametrize(("block_v", "V", "walks", "sms", "expected"), [
    # the measured case: 1x16384x16x128 on 132 SMs, 64 programs -> 128
    (32, 128, 16, 132, 16),
    # 2x8192x8x256: 128 programs, more than half the SMs: kept (halving measured slower)
    (32, 256, 16, 132, 32),
    # 4x4096x16x128: 256 programs
    (32, 128, 64, 132, 32),
    # never below 16; off CUDA (0 SMs) nothing changes
    (64, 64, 1, 1000, 16),
    (32, 128, 16, 0, 32),
    # a 16-wide V on its 32-wide tile (launch.dot_tile): halving would add no program, so it stays
    (32, 16, 16, 132, 32),
    (32, 16, 1, 1000, 32),
])
def test_whole_k_walk_block_v(block_v, V, walks, sms, expected):
    assert launch.whole_k_walk_block_v(block_v, V, walks, sms) == expected


@pytest.mark.parametrize(("block", "dim", "expected"), [
    # head dims narrower than HEAD_DIM_MIN_TILE take it whatever the plan's block
    (16, 16, 32), (64, 16, 32), (128, 8, 32),
    # wider dims keep the plan's tile, 16 included (the head-dim-256 plans), capped at the padded dim
    (16, 256, 16), (128, 32, 32), (128, 48, 64), (64, 128, 64),
])
def test_dot_tile_never_narrower_than_a_narrow_head_dim_needs(block, dim, expected):
    assert launch.dot_tile(block, dim) == expected


@pytest.mark.parametrize("dim", [8, 16])
def test_whole_dim_tile_of_a_narrow_head_dim(dim):
    assert launch.whole_dim_tile(dim) == launch.HEAD_DIM_MIN_TILE == 32


@pytest.fixture
def picked_block_v(monkeypatch):
    """The BV of every launch.whole_k_walk_block_v call while the test runs, in order."""
    return spy_on_launch(monkeypatch, "whole_k_walk_block_v")


@pytest.mark.parametrize(("op", "cu_seqlens"), [
    ("delta_rule", None),
    ("gated_delta_rule", None),
    ("gated_delta_rule", [0, 50, 50, 130]),
])
def test_delta_ops_with_split_state_walk(picked_block_v, op, cu_seqlens):
    """As on a GPU with many SMs: the delta family's fwd_h (forward, and its recomputation in the backward)
    runs on 16-wide V tiles instead of the plan's 64, and the outputs and every gradient match the reference."""
    result = compare_on_many_sms(op, op, cu_seqlens, seed=8)
    assert not result.failures(), result.errors
    assert picked_block_v and set(picked_block_v) == {16}, picked_block_v


@pytest.mark.parametrize("absent", ["g", "g_gamma"])
def test_simple_gla_walks_with_one_gate_absent(absent):
    """The walks read the cumulative gate from the cumsum pass whichever gate it sums: with g or g_gamma
    omitted (absent means 0), the outputs and gradients equal those with that gate passed as zeros, which
    the reference checks."""
    pkg, rec = generated("simple_gla"), recurrence("simple_gla")
    x = sample_inputs(rec, 2, 100, 2, 32, 32, torch.float32, seed=9)
    x[absent] = torch.zeros_like(x[absent])
    h0 = torch.randn(2, 2, 32, 32)
    result = compare_with_reference(pkg.chunk_simple_gla, pkg.simple_gla_reference, {**x, "initial_state": h0},
                                    torch.float32, name="chunk_simple_gla", guard=poisoned_allocations)
    assert not result.failures(), result.errors

    def run(inputs):
        leaves = {n: t.clone().requires_grad_(True) for n, t in inputs.items() if t is not None}
        o, ht = pkg.chunk_simple_gla(**{n: leaves.get(n) for n in inputs}, initial_state=h0,
                                     output_final_state=True)
        (o.square().sum() + ht.sum()).backward()
        return o, ht, {n: t.grad for n, t in leaves.items() if n != absent}

    with poisoned_allocations():  # the omitted-gate path too: an element it leaves unwritten is NaN
        zeros, omitted = run(x), run({**x, absent: None})
    torch.testing.assert_close(omitted[0], zeros[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(omitted[1], zeros[1], rtol=1e-5, atol=1e-5)
    for name, grad in zeros[2].items():
        torch.testing.assert_close(omitted[2][name], grad, rtol=1e-5, atol=1e-5)
