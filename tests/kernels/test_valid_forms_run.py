"""The other spellings of tests/compiler/test_valid_forms.py, built and run: each chunk op matches the reference
derived from its own spec text (an oracle independent of the canonicalizer) on a tiny call."""

import pytest
import torch

from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference
from tests.compiler.test_valid_forms import FORMS, HEAD, OUTPUTS, SCALE
from tests.support import built_package, poisoned_allocations

CASES = [(name, HEAD + SCALE + other + "output o = scale * S^T @ q\n") for name, _, other in FORMS] + [
    (name, HEAD + SCALE + "update S = exp(g) * S + beta * outer(k, v)\n" + other) for name, _, other in OUTPUTS]


@pytest.mark.parametrize("text", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_spelling_runs_against_its_reference(text, tmp_path):
    with built_package(text.replace("op t\n", "op spelled\n"), tmp_path, "spelled") as (rec, pkg):
        B, T, H, K, V = 1, 20, 1, 16, 16
        x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=7)
        x["initial_state"] = torch.randn(B, H, K, V)
        r = compare_with_reference(pkg.chunk_spelled, pkg.spelled_reference, x, torch.float32, name="chunk",
                                   guard=poisoned_allocations)
        assert not r.failures(), r.errors
