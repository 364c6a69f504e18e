"""An op whose names are unusual but allowed builds and runs: builtins the generated code never calls as
inputs, a capitalized op, head dims named D and E with a default scale of them, an input ending in _t."""

import math

import pytest
import torch

from fla_gen.cli import _import_package, compile_spec, main
from fla_gen.verify import verify_op
from tests.support import poisoned_allocations

SPEC = """# unusual names, all allowed
op Class
package my_ops2
input input: [B, T, H, D]
input print: [B, T, H, D]
input format: [B, T, H, E]
input decay_t: [B, T, H]
state State: [D, E]
param scale = D ** -0.5
update State = exp(decay_t) * State + outer(print, format)
output out = scale * State^T @ input
"""


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    root = tmp_path_factory.mktemp("unusual")
    spec = root / "unusual.fla"
    spec.write_text(SPEC)
    assert main(["build", str(spec), "-o", str(root / "out")]) == 0
    rec, _ = compile_spec(spec)
    return rec, _import_package(root / "out", "my_ops2")


@pytest.mark.parametrize("mode, T", [("chunk", 70), ("fused_recurrent", 6)])
def test_unusual_names_run_against_their_reference(package, mode, T):
    rec, pkg = package
    r = verify_op(pkg, rec, mode, torch.float32, B=1, T=T, H=1, K=16, V=32, guard=poisoned_allocations)
    assert not r.failures(), r.errors


def test_the_default_scale_reads_the_key_dim(package):
    """scale = D ** -0.5 with D the state's rows: 16 ** -0.5 by default, and an explicit scale is used."""
    rec, pkg = package
    g = torch.Generator().manual_seed(0)
    x = {n: torch.randn(1, 3, 1, d, generator=g) for n, d in (("input", 16), ("print", 16), ("format", 32))}
    decay = torch.zeros(1, 3, 1)
    o_default, _ = pkg.fused_recurrent_Class(x["input"], x["print"], x["format"], decay)
    o_explicit, _ = pkg.fused_recurrent_Class(x["input"], x["print"], x["format"], decay, scale=2.0)
    ratio = (o_explicit / o_default)[o_default.abs() > 1e-3]
    assert torch.allclose(ratio, torch.full_like(ratio, 2.0 / (16 ** -0.5)), rtol=1e-4)
    assert math.isclose(o_default.norm().item(), (o_explicit * 16 ** -0.5 / 2.0).norm().item(), rel_tol=1e-5)
