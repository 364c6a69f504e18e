"""Malformed specs: every one ends in a SpecError at the exact line and column, never a traceback."""

import pytest

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.errors import SpecError
from fla_gen.parse import parse_spec

HEAD = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
param scale = K ** -0.5
"""
# Lines 1-6 are HEAD; the statement under test is on line 7.
OUT = "output o = scale * S^T @ q\n"


def compile_source(source: str):
    return canonicalize(check_spec(parse_spec(source, "t.fla")))


CASES = [
    # (id, source, line, col, words in the message)
    ("missing colon", "op t\ninput q [B, T, H, K]\n", 2, 9, "unexpected '['"),
    ("unclosed paren", HEAD + "update S = exp(k * S\n" + OUT, 7, 21, "unexpected end of line"),
    ("bad character", HEAD + "update S = S $ outer(k, v)\n" + OUT, 7, 14, "unexpected character '$'"),
    ("two operands", HEAD + "update S = S outer(k, v)\n" + OUT, 7, 14, "unexpected 'outer'"),
    ("dangling operator", HEAD + "update S = S +\n" + OUT, 7, 15, "unexpected end of line"),
    ("op without name", "op\n", 1, 3, "unexpected end of line"),
    ("unknown name", HEAD + "update S = S + outer(kk, v)\n" + OUT, 7, 22, "unknown name 'kk'"),
    ("unknown function", HEAD + "update S = expp(k) * S + outer(k, v)\n" + OUT, 7, 12, "unknown function 'expp'"),
    ("K vs V in outer", HEAD + "update S = S + outer(v, k)\n" + OUT, 7, 14, "cannot combine [K, V] with [V, K]"),
    ("matrix times matrix", HEAD + "update S = S * S\n" + OUT, 7, 14, "'*' cannot combine [K, V] with [K, V]"),
    ("output wrong dim", HEAD + "update S = S + outer(k, v)\noutput o = S @ v\n", 8, 14,
     "the output has type [K], expected [V]"),
    ("output is a key vector", HEAD + "update S = S + outer(k, v)\noutput o = S @ (S^T @ q)\n", 8, 14,
     "expected [V]"),
    ("unknown head dim", "op t\ninput q: [B, T, H, D]\nstate S: [K, V]\n", 2, 20, "unknown head dim 'D'"),
    ("bad layout", "op t\ninput q: [T, B, H, K]\nstate S: [K, V]\n", 2, 11, "must be laid out"),
    ("update of an input", HEAD + "update k = S\n" + OUT, 7, 1, "only the state 'S' can be updated"),
    ("duplicate input", "op t\ninput q: [B, T, H, K]\ninput q: [B, T, H, K]\nstate S: [K, V]\n", 3, 1,
     "declared twice"),
    ("no op line", "input q: [B, T, H, K]\nstate S: [K, V]\n", 1, 1, "no 'op NAME' line"),
    ("state not a matrix", "op t\nstate S: [K]\n", 2, 1, "must be a matrix"),
    ("not linear in S", HEAD + "update S = exp(S) + outer(k, v)\n" + OUT, 7, 12, "linear in the state"),
    ("state times state", HEAD + "update S = S + outer(k, S^T @ (S @ v))\n" + OUT, 7, 29,
     "product of the state with itself"),
    ("decay not exp", HEAD.replace("state", "input g: [B, T, H]\nstate") + "update S = g * S + outer(k, v)\n"
     + OUT, 8, 12, "exp(g) of a log-space gate"),
    ("no carry", HEAD + "update S = outer(k, v)\n" + OUT, 7, 12, "drops the previous state"),
    ("no write", HEAD.replace("input k", "input kk") + "update S = S\noutput o = scale * S^T @ q\n", 3, 1,
     "never used"),
    ("unused input", HEAD.replace("op t", "op t\ninput x: [B, T, H]") + "update S = S + outer(k, v)\n" + OUT,
     2, 1, "'x' is declared but never used"),
    ("optional before required", "op t\ninput g: [B, T, H] = 0\ninput q: [B, T, H, K]\nstate S: [K, V]\n", 3, 1,
     "follows optional input"),
    ("nonzero default", "op t\ninput g: [B, T, H] = 1\nstate S: [K, V]\n", 2, 1, "only '= 0'"),
    ("output before update", HEAD + OUT + "update S = S + outer(k, v)\n", 7, 1, "comes before the state update"),
    ("two outputs", HEAD + "update S = S + outer(k, v)\n" + OUT + OUT, 9, 1, "exactly one 'output'"),
    ("column scaling", HEAD.replace("state", "input g: [B, T, H, V]\nstate")
     + "update S = exp(g) * S + outer(k, v)\n" + OUT, 8, 19, "columns"),
    ("transposed outer arg", HEAD + "update S = S + outer(S, v)\n" + OUT, 7, 22, "outer() takes two vectors"),
    ("param from a tensor", HEAD.replace("param scale = K ** -0.5", "param scale = q") + "update S = S + outer(k, v)\n"
     + OUT, 6, 15, "must be a scalar made of numbers"),
]


@pytest.mark.parametrize(("source", "line", "col", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_spec_reports_position(source, line, col, words):
    with pytest.raises(SpecError) as info:
        compile_source(source)
    err = info.value
    assert (err.pos.line, err.pos.col) == (line, col), err.render()
    assert words in err.message, err.render()
    rendered = err.render().splitlines()
    assert rendered[0].startswith(f"t.fla:{line}:{col}: error: ")
    # The offending line, then a caret under the column.
    assert rendered[1] == "    " + source.splitlines()[line - 1]
    assert rendered[2] == "    " + " " * (col - 1) + "^"


def test_at_least_fifteen_cases():
    assert len(CASES) >= 15
