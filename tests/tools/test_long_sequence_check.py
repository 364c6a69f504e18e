"""benchmarks/long_sequence_check.py without a GPU: the lengths it picks straddle 2^31 elements, its comparisons pass
for a generated op in the interpreter and fail for an op that loses the state at the cut, writes wrong outputs past it
or leaves them unwritten, and a bad argument is a usage error naming it before any CUDA call."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.support import assert_usage_error_before_cuda

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPT = BENCHMARKS / "long_sequence_check.py"
sys.path.insert(0, str(BENCHMARKS))

import _ops  # noqa: E402
import long_sequence_check  # noqa: E402


@pytest.mark.parametrize(("H", "D"), [(16, 128), (32, 64), (8, 256), (3, 100)])
def test_lengths_straddle_two_to_the_31_elements(H, D):
    T, cut = long_sequence_check.plan_lengths(H, D)
    assert T * H * D >= 2**31 + long_sequence_check.MARGIN_TOKENS * H * D - H * D
    assert cut * H * D < 2**31 and cut % long_sequence_check.CHUNK_TOKENS == 0
    assert long_sequence_check.plan_lengths(16, 128) == (2**20 + 2**16, 2**20 - 2**16)


def _inputs(op: str, T: int = 320, H: int = 2, D: int = 32):
    # weak gates: the head's state still matters after the cut
    names, args, _ = _ops.make_inputs(_ops.OPS[op], (1, T, H, D, D), torch.float32, "cpu", seed=5,
                                      requires_grad=False, gate_scale=0.01)
    return _ops.resolve_ours(_ops.OPS[op], "chunk"), names, args


@pytest.mark.parametrize("op", ["simple_gla", "gated_delta_rule"])
def test_a_generated_op_passes_in_the_interpreter(op):
    fn, names, args = _inputs(op)
    errors = long_sequence_check.split_errors(fn, names, args, cut=192, grads=True)
    assert {"o after the cut", "final state", "dq after the cut", "packed: o of sequence 1"} <= set(errors)
    assert all(e <= 1e-4 for e in errors.values()), errors


def test_an_op_that_drops_the_state_at_the_cut_fails():
    fn, names, args = _inputs("simple_gla")

    def forgetful(*a, initial_state=None, **kw):
        return fn(*a, **kw)

    errors = long_sequence_check.split_errors(forgetful, names, args, cut=192, grads=False)
    assert errors["o after the cut"] > 1e-2 and errors["final state"] > 1e-2, errors


def test_outputs_wrong_past_the_cut_fail():
    """What an offset past 2^31 in 32-bit integers would do: outputs past a token wrong in the full call only."""
    fn, names, args = _inputs("simple_gla")
    T = args[0].shape[1]

    def wraps(*a, **kw):
        o, ht = fn(*a, **kw)
        if a[0].shape[1] == T:
            o = torch.cat([o[:, :256], o[:, :T - 256]], dim=1)
        return o, ht

    errors = long_sequence_check.split_errors(wraps, names, args, cut=192, grads=False)
    assert errors["o after the cut"] > 1e-2 and errors["packed: o of sequence 1"] > 1e-2, errors
    assert errors["o before the cut"] <= 1e-6


@pytest.mark.parametrize(("args", "named"), [
    (["--ops", "gla2"], "--ops"),
    (["--modes", "bwd"], "--modes"),
    (["--tokens", "320"], "--tokens"),
    (["--tokens", "320", "--cut", "400"], "--tokens"),
    (["--heads", "0"], "--heads"),
])
def test_bad_arguments_are_usage_errors(args, named):
    assert_usage_error_before_cuda(SCRIPT, args, named)


def test_outputs_never_written_fail():
    """An output past a token that no kernel writes reads NaN (every allocation is poisoned), whatever the memory
    last held."""
    fn, names, args = _inputs("simple_gla")
    T = args[0].shape[1]

    def skips(*a, **kw):
        o, ht = fn(*a, **kw)
        if a[0].shape[1] != T:
            return o, ht
        partial = torch.empty_like(o)
        partial[:, :256] = o[:, :256]
        return partial, ht

    errors = long_sequence_check.split_errors(skips, names, args, cut=192, grads=False)
    assert not errors["o after the cut"] <= 1e-2 and not errors["packed: o of sequence 1"] <= 1e-2, errors
