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
# For transform lines: HEAD plus a per-token gate g and a per-head A (lines 1-8); the line under test is line 9.
THEAD = HEAD.replace("state", "input g: [B, T, H]\ninput A: [H]\nstate")
UPD = "update S = exp(g) * S + outer(k, v)\n" + OUT
# For per-head vectors: HEAD plus a per-channel gate g, beta and a per-head vector w over K (lines 1-9); the line
# under test is line 10.
VHEAD = HEAD.replace("state", "input g: [B, T, H, K]\ninput beta: [B, T, H]\ninput w: [H, K]\nstate")
VUPD = "update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n" + OUT


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
    ("decay not provably positive",
     HEAD.replace("state", "input g: [B, T, H]\nstate") + "update S = g * S + outer(k, v)\n" + OUT, 8, 12,
     "a factor the compiler can prove positive"),
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
    # transform lines
    ("transform after update", THEAD + UPD.replace(OUT, "") + "transform q = l2norm(q)\n" + OUT, 10, 1,
     "after the first update"),
    ("transform of an unknown input", THEAD + "transform x = l2norm(x)\n" + UPD, 9, 11, "not a declared input"),
    ("transform of a per-head input", THEAD + "transform A = exp(A)\n" + UPD, 9, 11, "per-head input"),
    ("transform reads another input", THEAD + "transform q = q * g\n" + UPD, 9, 19, "reads only its own input"),
    ("transform changes the shape", THEAD + "transform q = sigmoid(q) @ q\n" + UPD, 9, 26,
     "has type scalar, expected [K]"),
    ("l2norm outside a transform", THEAD + "update S = exp(g) * S + outer(l2norm(k), v)\n" + OUT, 9, 31,
     "per-token transform"),
    ("l2norm of a scalar", THEAD + "transform g = l2norm(g)\n" + UPD, 9, 15, "normalizes a vector"),
    ("rope arguments not the targets", THEAD + "transform q, k = rope(k, q)\n" + UPD, 9, 23,
     "must be the transform's targets"),
    ("rope unknown option", THEAD + "transform q, k = rope(q, k, stlye=neox)\n" + UPD, 9, 29,
     "unknown rope option 'stlye'"),
    ("rope unknown style", THEAD + "transform q, k = rope(q, k, style=gptj)\n" + UPD, 9, 35, "'neox'"),
    ("rope odd rotary dim", THEAD + "transform q, k = rope(q, k, rotary_dim=7)\n" + UPD, 9, 40,
     "positive even integer"),
    ("rope of a scalar", THEAD + "transform g = rope(g)\n" + UPD, 9, 11, "rope rotates vectors"),
    ("rope inside an expression", THEAD + "transform q = 2 * rope(q)\n" + UPD, 9, 19, "is a transform"),
    ("several targets without rope", THEAD + "transform q, k = l2norm(q)\n" + UPD, 9, 14, "only rope(...)"),
    ("keyword to a plain function", THEAD + "transform q = l2norm(q, eps=1)\n" + UPD, 9, 25, "no keyword arguments"),
    ("positional after keyword", THEAD + "transform q, k = rope(q, style=neox, k)\n" + UPD, 9, 38,
     "positional argument after"),
    ("rope twice", THEAD + "transform q, k = rope(q, k)\ntransform q = rope(q)\n" + UPD, 10, 11, "rotated twice"),
    ("transformed but never read", HEAD.replace("state", "input g: [B, T, H]\nstate")
     + "transform g = sigmoid(g)\nupdate S = S + outer(k, v)\n" + OUT, 8, 1, "recurrence never reads"),
    ("transform without targets", THEAD + "transform = l2norm(q)\n" + UPD, 9, 11, "unexpected '='"),
    ("transform of an optional input", THEAD.replace("input g: [B, T, H]\ninput A: [H]", "input g: [B, T, H] = 0")
     + "transform g = sigmoid(g)\n" + UPD, 8, 11, "is optional"),
    ("transform reads an optional per-head input", THEAD.replace("input A: [H]", "input A: [H] = 0")
     + "transform g = g + A\n" + UPD, 9, 19, "is optional"),
    ("a scalar's transform reads a per-head vector", VHEAD + "transform beta = beta + w\n" + VUPD, 10, 25,
     "'beta', a scalar per token, reads 'w', a per-head vector [H, K]"),
    ("a transform over V reads a per-head vector over K", VHEAD + "transform v = v * w\n" + VUPD, 10, 19,
     "'v', a vector over V per token, reads 'w', a per-head vector over K"),
    ("a guarded per-token input", VHEAD + "param on: bool = false\ninput x: [B, T, H, K] if on\n"
     "transform g = g + x if on\n" + VUPD, 11, 1, "a guarded input is a per-head parameter of a transform"),
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
