"""The variant corpus (tests/variants/*.fla) through the compiler, no kernels run: every variant parses,
checks, canonicalizes, lowers and plans; forms that are equal by algebra lower to the same kernel arguments;
decays the compiler cannot prove positive are refused with a diagnostic that points at the spot and says how
to write it.
"""

from __future__ import annotations

import dataclasses
import enum

import pytest

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import emit_package
from fla_gen.errors import SpecError
from fla_gen.lower import SlotSource, lower
from fla_gen.parse import parse_spec, read_spec
from tests.support import AWAITING_LOWERING, VARIANTS, VARIANTS_DIR

HEADER = """op eq
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
param scale = K ** -0.5
"""


def _structure(x):
    """A value with source positions and the spec's text left out, for comparing normal forms of two sources."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x).__name__, tuple((f.name, _structure(getattr(x, f.name))) for f in dataclasses.fields(x)
                                        if f.name not in ("pos", "spec")))
    if isinstance(x, (tuple, list)):
        return tuple(_structure(v) for v in x)
    if isinstance(x, dict):
        return tuple(sorted((k, _structure(v)) for k, v in x.items()))
    if isinstance(x, enum.Enum):
        return x.value
    return x


def _lowered(body: str, inputs: str = ""):
    """What the kernels are given for HEADER + ``inputs`` + ``body``: the kernel features, each kernel argument's
    expression and source, and the output's scale factors (the lowering's notes and the source left out)."""
    lowered = lower(canonicalize(check_spec(parse_spec(HEADER + inputs + body, "<equal-forms>"))))
    return _structure((lowered.features, lowered.slots, lowered.scale))


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_parses_and_checks(variant):
    spec = check_spec(read_spec(VARIANTS_DIR / f"{variant}.fla"))
    assert spec.op == variant  # one op per file, named as the file, so tests can find it


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v not in AWAITING_LOWERING])
def test_variant_compiles(variant):
    """canonicalize, lower, plan and emit: a chunk and a fused_recurrent module and a reference."""
    rec = canonicalize(check_spec(read_spec(VARIANTS_DIR / f"{variant}.fla")))
    lowered = lower(rec)
    assert [s.arg for s in lowered.slots] == list(lowered.features.kernel_args)
    declared = {i.name for i in rec.spec.inputs}
    for slot in lowered.slots:  # an INPUT slot reads a declared input; the others hold an expression
        assert slot.source is not SlotSource.INPUT or slot.input in declared, (variant, slot)
    paths = {f.path for f in emit_package(rec)}
    assert {f"{variant}/chunk.py", f"{variant}/fused_recurrent.py", f"{variant}/reference.py"} <= paths, paths


# (id, extra inputs, one form, an algebraically equal form)
EQUAL_FORMS = [
    ("two_update_lines", "input g: [B, T, H]\n",
     "update S = exp(g) * S + outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g) * S\nupdate S = S + outer(k, v)\noutput o = scale * S^T @ q\n"),
    ("output_scale_on_the_query", "input g: [B, T, H]\n",
     "update S = exp(g) * S + outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g) * S + outer(k, v)\noutput o = S^T @ (scale * q)\n"),
    ("constant_write_factor_on_the_value", "input g: [B, T, H]\n",
     "update S = exp(g) * S + 0.5 * outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g) * S + outer(k, 0.5 * v)\noutput o = scale * S^T @ q\n"),
    ("constant_write_factor_on_the_key", "input g: [B, T, H]\n",
     "update S = exp(g) * S + 0.5 * outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g) * S + outer(0.5 * k, v)\noutput o = scale * S^T @ q\n"),
    ("scalar_write_factor", "input g: [B, T, H]\ninput beta: [B, T, H]\n",
     "update S = exp(g) * S + outer(k, beta * v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g) * S + beta * outer(k, v)\noutput o = scale * S^T @ q\n"),
    ("product_of_decays", "input g: [B, T, H]\ninput h: [B, T, H]\n",
     "update S = exp(g) * exp(h) * S + outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = exp(g + h) * S + outer(k, v)\noutput o = scale * S^T @ q\n"),
    ("decay_on_the_right", "input g: [B, T, H]\n",
     "update S = exp(g) * S + outer(k, v)\noutput o = scale * S^T @ q\n",
     "update S = S * exp(g) + outer(k, v)\noutput o = scale * S^T @ q\n"),
    ("delta_rule_expanded", "input beta: [B, T, H]\n",
     "update S = S + beta * outer(k, v - S^T @ k)\noutput o = scale * S^T @ q\n",
     "update S = S + outer(beta * k, v) - beta * outer(k, S^T @ k)\noutput o = scale * S^T @ q\n"),
]
@pytest.mark.parametrize(("inputs", "one", "other"), [pytest.param(i, a, b, id=n) for n, i, a, b in EQUAL_FORMS])
def test_equal_forms_lower_alike(inputs, one, other):
    assert _lowered(one, inputs) == _lowered(other, inputs)


def test_equal_forms_differ_where_they_should():
    """The comparison can fail: a different write factor or decay gives a different normal form."""
    G = "input g: [B, T, H]\n"
    base = _lowered("update S = exp(g) * S + outer(k, v)\noutput o = scale * S^T @ q\n", G)
    assert base != _lowered("update S = exp(h) * S + outer(k, v)\noutput o = scale * S^T @ q\n",
                                "input h: [B, T, H]\n")
    assert base != _lowered("update S = exp(g) * S + outer(q, v)\noutput o = scale * S^T @ k\n", G)


# Decays with no proof of positivity: a raw input, a negative constant, a call-time param, the log of an input.
UNPROVABLE_DECAYS = [
    ("raw_input", "input g: [B, T, H]\n", "update S = g * S + outer(k, v)"),
    ("negative_constant", "", "update S = -0.5 * S + outer(k, v)"),
    ("param", "param gamma = 0.9\n", "update S = gamma * S + outer(k, v)"),
    ("log_of_input", "input g: [B, T, H]\n", "update S = log(g) * S + outer(k, v)"),
]


@pytest.mark.parametrize(("decls", "update"), [pytest.param(d, u, id=n) for n, d, u in UNPROVABLE_DECAYS])
def test_unprovable_decay_is_refused_with_a_hint(decls, update):
    source = HEADER + decls + update + "\noutput o = scale * S^T @ q\n"
    with pytest.raises(SpecError) as info:
        emit_package(canonicalize(check_spec(parse_spec(source, "<decay>"))))
    err = info.value
    assert err.pos.line == (HEADER + decls).count("\n") + 1, err.render()
    assert "decay" in err.message and "exp(" in err.hint, err.render()
