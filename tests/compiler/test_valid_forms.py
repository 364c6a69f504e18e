"""Forms users naturally write: each canonicalizes and lowers to the same kernel arguments as its usual
spelling (scalars on either side, a divided output scale, a transposed write, the delta rule expanded)."""

import pytest

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.lower import lower, render_expr
from fla_gen.parse import parse_spec

HEAD = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H]
input beta: [B, T, H]
state S: [K, V]
"""
SCALE = "param scale = K ** -0.5\n"

# (name, the usual spelling, another spelling of the same recurrence)
FORMS = [
    ("decay on the right", "update S = exp(g) * S + beta * outer(k, v)\n",
     "update S = S * exp(g) + beta * outer(k, v)\n"),
    ("write scale on the right", "update S = exp(g) * S + beta * outer(k, v)\n",
     "update S = exp(g) * S + outer(k, v) * beta\n"),
    ("write scale inside", "update S = exp(g) * S + beta * outer(k, v)\n",
     "update S = exp(g) * S + outer(k, beta * v)\n"),
    ("transposed write", "update S = exp(g) * S + beta * outer(k, v)\n",
     "update S = exp(g) * S + beta * outer(v, k)^T\n"),
    ("delta rule expanded", "update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n",
     "update S = exp(g) * S\nupdate S = S - beta * outer(k, S^T @ k) + beta * outer(k, v)\n"),
    ("delta rule expanded, beta on the right", "update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n",
     "update S = exp(g) * S\nupdate S = S - outer(k, S^T @ k) * beta + outer(k, v * beta)\n"),
]
OUTPUTS = [
    ("output scale on the right", "output o = scale * S^T @ q\n", "output o = S^T @ q * scale\n"),
    ("row vector read", "output o = scale * S^T @ q\n", "output o = scale * (q @ S)\n"),
]


def lowered(text: str):
    low = lower(canonicalize(check_spec(parse_spec(text, "t.fla"))))
    return (low.features, [(s.arg, s.source, render_expr(s.expr)) for s in low.slots],
            [render_expr(c) for c in low.scale])


@pytest.mark.parametrize(("usual", "other"), [f[1:] for f in FORMS], ids=[f[0] for f in FORMS])
def test_update_spellings_lower_alike(usual, other):
    out = "output o = scale * S^T @ q\n"
    assert lowered(HEAD + SCALE + other + out) == lowered(HEAD + SCALE + usual + out)


@pytest.mark.parametrize(("usual", "other"), [f[1:] for f in OUTPUTS], ids=[f[0] for f in OUTPUTS])
def test_output_spellings_lower_alike(usual, other):
    update = "update S = exp(g) * S + beta * outer(k, v)\n"
    assert lowered(HEAD + SCALE + update + other) == lowered(HEAD + SCALE + update + usual)


def test_a_divided_output_scale_is_a_call_time_factor():
    text = HEAD + "update S = exp(g) * S + beta * outer(k, v)\noutput o = S^T @ q / 8\n"
    _, slots, scale = lowered(text)
    assert scale == ["(1 / 8)"] and slots[0][2] == "q"
