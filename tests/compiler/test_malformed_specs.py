"""A corpus of malformed specs: each ends in exit status 2 with ``file:line:col: error:``, the line, a caret
and no traceback, through the CLI's entry point (in process) and, for a few, a real subprocess."""

import re
import subprocess
import sys

import pytest

from fla_gen.cli import main
from tests.support import REPO_ROOT

# Lines 1-8; cases replace or append lines. The line under test is named in each case.
BASE = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
param scale = K ** -0.5
update S = S + outer(k, v)
output o = scale * S^T @ q
"""
GATED = BASE.replace("state S", "input g: [B, T, H]\nstate S").replace("S = S +", "S = exp(g) * S +")


def base(**lines: str) -> str:
    """BASE with some lines replaced, keyed l1..l8 (an empty string deletes the line)."""
    out = BASE.splitlines()
    for key, text in lines.items():
        out[int(key[1:]) - 1] = text
    return "\n".join(line for line in out if line != "\0") + "\n"


def balanced_sum(leaves: int) -> str:
    """``(q + q) + (q + q)``... with ``leaves`` terms: many nodes, a shallow tree."""
    if leaves == 1:
        return "q"
    half = leaves // 2
    return f"({balanced_sum(half)} + {balanced_sum(leaves - half)})"


CASES = [
    # (id, source, line, message fragment)
    # --- syntax
    ("missing colon", base(l2="input q [B, T, H, K]"), 2, "unexpected '['"),
    ("missing bracket", base(l2="input q: [B, T, H, K"), 2, "unexpected end of line"),
    ("unclosed paren", base(l7="update S = S + outer(k, v"), 7, "unexpected end of line"),
    ("extra paren", base(l7="update S = S + outer(k, v))"), 7, "unexpected ')'"),
    ("bad character", base(l7="update S = S $ outer(k, v)"), 7, "unexpected character '$'"),
    ("NUL character", base(l7="update S = S +\0 outer(k, v)"), 7, "unexpected character"),
    ("two operands", base(l7="update S = S outer(k, v)"), 7, "unexpected 'outer'"),
    ("dangling operator", base(l7="update S = S +"), 7, "unexpected end of line"),
    ("op without name", base(l1="op"), 1, "unexpected end of line"),
    ("number with two dots", base(l6="param scale = 1.2.3"), 6, "unexpected"),
    ("unknown statement", base(l6="parameter scale = 1"), 6, "unexpected"),
    ("keyword as a value", base(l8="output o = scale * S^T @ input"), 8, "unknown name 'input'"),
    # --- names and shapes
    ("unknown name", base(l7="update S = S + outer(kk, v)"), 7, "unknown name 'kk'"),
    ("unknown function", base(l7="update S = expp(k) * S + outer(k, v)"), 7, "unknown function 'expp'"),
    ("K vs V in outer", base(l7="update S = S + outer(v, k)"), 7, "cannot combine [K, V] with [V, K]"),
    ("matrix times matrix", base(l7="update S = S * S"), 7, "cannot combine [K, V] with [K, V]"),
    ("output wrong dim", base(l8="output o = S @ v"), 8, "expected [V]"),
    ("output matrix", base(l8="output o = S"), 8, "expected [V]"),
    ("unknown head dim", base(l2="input q: [B, T, H, D]"), 2, "unknown head dim 'D'"),
    ("bad layout", base(l2="input q: [T, B, H, K]"), 2, "must be laid out"),
    ("two head dims", base(l2="input q: [B, T, H, K, V]"), 2, "more than one head dim"),
    ("update of an input", base(l7="update k = S"), 7, "only the state 'S' can be updated"),
    ("duplicate input", base(l3="input q: [B, T, H, K]"), 3, "declared twice"),
    ("no op line", base(l1="\0"), 1, "no 'op NAME' line"),
    ("second op line", base(l6="op u"), 6, "a second 'op' line"),
    ("second package line", base(l1="op t\npackage a\npackage b"), 3, "a second 'package' line"),
    ("state not a matrix", base(l5="state S: [K]"), 5, "must be a matrix"),
    ("state of layout dims", base(l5="state S: [T, V]"), 5, "layout dim"),
    ("second state", base(l5="state S: [K, V]\nstate R: [K, V]"), 6, "a second state"),
    ("no update", base(l7="\0"), 5, "never updates"),
    ("no output", base(l8="\0"), 1, "no output"),
    ("two outputs", base(l8="output o = S^T @ q\noutput p = S^T @ q"), 9, "exactly one 'output'"),
    ("output before update", base(l7="output o = S^T @ q", l8="update S = S + outer(k, v)"), 7, "before the state"),
    ("unused input", base(l1="op t\ninput x: [B, T, H]"), 2, "'x' is declared but never used"),
    ("optional before required", base(l2="input q: [B, T, H, K] = 0"), 3, "follows optional input"),
    ("input default not zero", base(l4="input v: [B, T, H, V] = 1"), 4, "only '= 0'"),
    # --- the recurrence
    ("not linear in S", base(l7="update S = exp(S) + outer(k, v)"), 7, "linear in the state"),
    ("no carry", base(l7="update S = outer(k, v)"), 7, "drops the previous state"),
    ("decay not provably positive", GATED.replace("exp(g) * S", "g * S"), 8,
     "a factor the compiler can prove positive"),
    ("l2norm in an update", base(l7="update S = S + outer(l2norm(k), v)"), 7, "per-token transform"),
    # --- param defaults and numbers, evaluated when the spec is checked
    ("param divides by zero", base(l6="param scale = 1 / 0"), 6, "divides by zero"),
    ("param divides by a dim difference", base(l6="param scale = 1 / (K - K)"), 6, "divides by zero"),
    ("param out of range", base(l6="param scale = 1e999"), 6, "out of range"),
    ("param inf", base(l6="param scale = inf"), 6, "unknown name 'inf'"),
    ("param nan", base(l6="param scale = nan"), 6, "unknown name 'nan'"),
    ("param log of zero", base(l6="param scale = log(0)"), 6, "log of a number <= 0"),
    ("param fractional power of a negative", base(l6="param scale = (-K) ** 0.5"), 6, "fractional power"),
    ("param overflows", base(l6="param scale = exp(K * 100)"), 6, "overflows"),
    ("param uses sigmoid", base(l6="param scale = sigmoid(K)"), 6, "'sigmoid' is not among them"),
    ("param reads an input", base(l6="param scale = q"), 6, "must be a scalar made of numbers"),
    ("number out of range in an update", base(l7="update S = 1e400 * S + outer(k, v)"), 7, "out of range"),
    # --- the name policy
    ("op is a keyword", base(l1="op class"), 1, "Python keyword"),
    ("op is None", base(l1="op None"), 1, "Python keyword"),
    ("op is import", base(l1="op import"), 1, "Python keyword"),
    ("op is a soft keyword", base(l1="op match"), 1, "Python keyword"),
    ("op is a dunder", base(l1="op __init__"), 1, "starts with '_'"),
    ("op names a stdlib package", base(l1="op math"), 1, "shadow the module 'math'"),
    ("package is torch", base(l1="op t\npackage torch"), 2, "shadow the module 'torch'"),
    ("package is a keyword", base(l1="op t\npackage def"), 2, "Python keyword"),
    ("input lambda", base(l1="op t\ninput lambda: [B, T, H]"), 2, "Python keyword"),
    ("input def", base(l1="op t\ninput def: [B, T, H]"), 2, "Python keyword"),
    ("input self", base(l1="op t\ninput self: [B, T, H]"), 2, "generated code uses"),
    ("input torch", base(l1="op t\ninput torch: [B, T, H]"), 2, "generated code uses"),
    ("input tl", base(l1="op t\ninput tl: [B, T, H]"), 2, "generated code uses"),
    ("input initial_state", base(l1="op t\ninput initial_state: [B, T, H]"), 2, "generated code uses"),
    ("input cu_seqlens", base(l1="op t\ninput cu_seqlens: [B, T, H]"), 2, "generated code uses"),
    ("input call", base(l1="op t\ninput call: [B, T, H]"), 2, "generated code uses"),
    ("input scale without a param", base(l1="op t\ninput scale: [B, T, H]"), 2, "only a 'param'"),
    ("input is a used builtin", base(l1="op t\ninput range: [B, T, H]"), 2, "Python builtin"),
    ("input is the reference's token local", base(l4="input v: [B, T, H, V]\ninput k_t: [B, T, H]"), 5,
     "the reference gives to input 'k'"),
    ("input named like the output", base(l8="output q = scale * S^T @ q"), 8, "already declared"),
    ("input named like a generated function", base(l1="op t\ninput chunk_t: [B, T, H]"), 2,
     "function of the generated package"),
    ("state named like a launcher local", base(l5="state plan: [K, V]").replace("S", "plan")
     .replace("plan = plan", "plan = plan"), 5, "generated code uses"),
    ("head dim named dtype", BASE.replace("K", "dtype"), 5, "generated code uses"),
    ("param named final_state", base(l6="param final_state = 1.0"), 6, "generated code uses"),
    ("param dunder", base(l6="param __class__ = 1.0"), 6, "starts with '_'"),
    # --- transforms
    ("transform of an unknown input", base(l6="transform x = l2norm(x)"), 6, "not a declared input"),
    ("transform after an update", base(l8="transform q = l2norm(q)\noutput o = S^T @ q"), 8, "after the first update"),
    ("rope option unknown", base(l6="transform q, k = rope(q, k, stile=neox)"), 6, "unknown rope option"),
    ("rope style", base(l6="transform q, k = rope(q, k, style=gptj)"), 6, "rope's style"),
    ("rope base", base(l6="transform q, k = rope(q, k, base=1)"), 6, "greater than 1"),
    ("rope odd rotary_dim", base(l6="transform q, k = rope(q, k, rotary_dim=3)"), 6, "positive even integer"),
    ("rope rotary_dim of the model dim", base(l6="transform q, k = rope(q, k, rotary_dim=2 * K)"), 6,
     "wider than the head dim"),
    ("rope rotary_dim over every head dim", base(l6="transform q, k = rope(q, k, rotary_dim=512)"), 6,
     "wider than the head dim"),
    ("rope rotary_dim divides by zero", base(l6="transform q, k = rope(q, k, rotary_dim=K / 0)"), 6,
     "divides by zero"),
    # --- input limits
    ("a sum too deep", base(l8="output o = scale * S^T @ q" + " + S^T @ q" * 100), 8, "nested more than"),
    ("a sum of three thousand terms", base(l8="output o = S^T @ q" + " + S^T @ q" * 3000), 8, "nested more than"),
    ("ten thousand minuses", base(l6="param scale = " + "-" * 10000 + "1"), 6, "nested more than"),
    ("an expression too long", base(l8=f"output o = S^T @ {balanced_sum(600)}"), 8, "longer than"),
    ("too many statements", base(l1="op t\n" + "\n".join(f"input x{i}: [H]" for i in range(300))), 257,
     "more than 256 statements"),
]


def run_cli(argv, capsys) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err + captured.out


@pytest.mark.parametrize("source, line, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_spec_exits_2_at_its_line(tmp_path, capsys, source, line, words):
    spec = tmp_path / "bad.fla"
    spec.write_text(source)
    code, out = run_cli(["build", str(spec), "-o", str(tmp_path / "out")], capsys)
    assert code == 2, out
    assert "Traceback" not in out
    first = out.splitlines()[0]
    m = re.match(rf"{re.escape(str(spec))}:(\d+):(\d+): error: (.*)", first)
    assert m, out
    assert int(m.group(1)) == line and int(m.group(2)) >= 1, out
    assert words in m.group(3), out
    assert out.splitlines()[2].strip().endswith("^"), out
    assert not (tmp_path / "out" / "t").exists()


def test_the_corpus_is_large_and_distinct():
    assert len(CASES) >= 60
    assert len({c[1] for c in CASES}) == len(CASES)


def test_spec_over_the_size_limit(tmp_path, capsys):
    spec = tmp_path / "big.fla"
    spec.write_text(BASE + "# padding\n" * 40000)
    code, out = run_cli(["build", str(spec), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and re.match(rf"{re.escape(str(spec))}:1:1: error: spec is \d+ bytes, over the limit", out), out


def test_spec_not_utf8(tmp_path, capsys):
    spec = tmp_path / "latin1.fla"
    spec.write_bytes(BASE.replace("op t", "op t  # caf\xe9").encode("latin-1"))
    code, out = run_cli(["build", str(spec), "-o", str(tmp_path / "out")], capsys)
    assert code == 2 and f"{spec}:1:12: error: spec is not UTF-8" in out, out


@pytest.mark.parametrize("case", ["param divides by zero", "op is a keyword", "a sum too deep"])
def test_malformed_spec_in_a_subprocess(tmp_path, case):
    source, line, words = next(c[1:] for c in CASES if c[0] == case)
    spec = tmp_path / "bad.fla"
    spec.write_text(source)
    proc = subprocess.run([sys.executable, "-m", "fla_gen.cli", "build", str(spec), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"{spec}:{line}:") and words in proc.stderr.splitlines()[0], proc.stderr
