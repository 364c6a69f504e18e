"""Grouped value heads in the DSL: q, k on H heads, v / gates / beta / state on HV = r·H heads.

Checks with positions, the layouts the emitter gives the runtime, CheckedSpec.grouped, the kernels that read
the key-side heads themselves, the pass split by heads, and the host-side fallback the generated functions
carry otherwise (no kernel runs here)."""

import pytest

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import emit_package
from fla_gen.errors import SpecError
from fla_gen.ir import Heads
from fla_gen.lower import lower
from fla_gen.parse import parse_spec
from fla_gen.plan import select_algorithms

GROUPED = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, HV, V]
input g: [B, T, HV]
input beta: [B, T, HV]
state S: [K, V]
param scale = K ** -0.5
update S = exp(g) * S
update S = S + beta * outer(k, v - S^T @ k)
output o = scale * S^T @ q
"""


def checked(source: str):
    return check_spec(parse_spec(source, "t.fla"))


def test_inputs_record_their_heads_and_the_spec_is_grouped():
    spec = checked(GROUPED)
    assert [i.heads for i in spec.inputs] == [Heads.H, Heads.H, Heads.HV, Heads.HV, Heads.HV]
    assert spec.input("v").per_token and spec.input("v").vec_dim == "V"
    assert spec.grouped


def test_a_spec_on_h_heads_only_is_not_grouped():
    spec = checked(GROUPED.replace("HV", "H"))
    assert all(i.heads is Heads.H for i in spec.inputs)
    assert not spec.grouped


def test_per_head_inputs_may_live_on_either_heads():
    source = GROUPED.replace("input beta: [B, T, HV]\n", "input beta: [B, T, HV]\ninput a: [H]\ninput c: [HV] = 0\n")
    source = source.replace("update S = exp(g) * S", "update S = exp(g + a + c) * S")
    spec = checked(source)
    assert (spec.input("a").heads, spec.input("a").per_token) == (Heads.H, False)
    assert (spec.input("c").heads, spec.input("c").per_token) == (Heads.HV, False)


def _error(source: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        canonicalize(checked(source))
    return info.value


ERRORS = [
    # (id, source, line, col, words in the message)
    ("value vectors on H in a grouped spec", GROUPED.replace("input v: [B, T, HV, V]", "input v: [B, T, H, V]"),
     4, 17, "so the state lives on HV heads"),
    ("HV names an input", GROUPED.replace("input beta: [B, T, HV]", "input HV: [B, T, HV]"), 6, 1,
     "'HV' is a layout dim and cannot name an input"),
    ("HV as a state dim", GROUPED.replace("state S: [K, V]", "state S: [HV, V]"), 7, 11,
     "'HV' is a layout dim (B, T, H, HV)"),
    ("a third kind of heads", GROUPED.replace("input g: [B, T, HV]", "input g: [B, T, HG]"), 5, 17,
     "must be laid out [B, T, H, ...] / [B, T, HV, ...]"),
    ("per-head on unknown heads", GROUPED.replace("input beta: [B, T, HV]", "input beta: [G]"), 6, 14,
     "or [H, ...] / [HV, ...] (per head)"),
    ("a transform of an H input reads an HV per-head input",
     GROUPED.replace("state S", "input w: [HV]\nstate S").replace("param scale = K ** -0.5\n",
                                                                  "param scale = K ** -0.5\ntransform q = q * w\n"),
     10, 19, "reads 'w' on the value heads HV"),
    ("a transform of an H input reads an HV per-head vector",
     GROUPED.replace("state S", "input w: [HV, K]\nstate S").replace("param scale = K ** -0.5\n",
                                                                     "param scale = K ** -0.5\ntransform q = q * w\n"),
     10, 19, "reads 'w' on the value heads HV"),
]


@pytest.mark.parametrize(("source", "line", "col", "words"), [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_grouped_spec_errors_have_positions(source, line, col, words):
    err = _error(source)
    assert (err.pos.line, err.pos.col) == (line, col), err.render()
    assert words in err.message, err.render()


def test_a_transform_of_an_hv_input_may_read_an_h_per_head_input():
    source = GROUPED.replace("state S", "input A_log: [H]\nstate S").replace(
        "param scale = K ** -0.5\n", "param scale = K ** -0.5\ntransform g = -exp(A_log) * softplus(g)\n")
    assert checked(source).grouped


def _files(source: str) -> dict[str, str]:
    rec = canonicalize(checked(source))
    return {f.path: f.text for f in emit_package(rec)}


def test_grouped_layouts_and_the_kernels_that_group_are_emitted():
    files = _files(GROUPED)
    chunk = files["t/chunk.py"]
    for arg, layout in (("q", "BTHK"), ("k", "BTHK"), ("v", "BTGV"), ("g", "BTG"), ("beta", "BTG")):
        assert f'TensorArg("{arg}", "{layout}"' in chunk
        assert f"({arg!r}, {layout!r}," in files["t/__init__.py"]
    # both the chunked delta-rule kernels and the fused recurrent ones read head hv // (HV / H): no host repeat
    assert "repeat_interleave" not in chunk and "repeat_interleave" not in files["t/fused_recurrent.py"]
    assert "row_k = (bos + t) * H + i_hk" in files["t/fused_recurrent.py"]
    assert "i_hk = i_h // (H // HK)" in chunk and "k_c = k + t0 * HK * K + i_hk * K" in chunk
    # dq and dk: per value head, summed over each group by the launcher
    assert "dq, dk = launch.sum_groups(dq, HK, q.dtype), launch.sum_groups(dk, HK, k.dtype)" in chunk
    assert "v: [B, T, HV, V] values" in chunk
    assert "final_state: [N, HV, K, V]" in chunk
    ref = files["t/reference.py"]
    assert "k = k.repeat_interleave(groups, dim=2)" in ref and "torch.zeros(batch, HV, K, V" in ref


def test_per_head_h_inputs_repeat_along_their_only_head_dim():
    source = """op t
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, HV, V]
input g: [B, T, HV] = 0
input g_gamma: [H] = 0
state S: [K, V]
update S = exp(g + g_gamma) * S + outer(k, v)
output o = S^T @ q
"""
    files = _files(source)
    assert "g_gamma = None if g_gamma is None else g_gamma.repeat_interleave(groups, dim=0)" in files["t/chunk.py"]
    assert "g = g.repeat_interleave" not in files["t/chunk.py"]
    assert "g_gamma = g_gamma.repeat_interleave(groups, dim=0)" in files["t/reference.py"]


def test_an_ungrouped_spec_has_no_fallback():
    files = _files(GROUPED.replace("HV", "H"))
    assert "call.HV" not in files["t/chunk.py"] and "repeat_interleave" not in files["t/reference.py"]
    assert "[N, H, K, V]" in files["t/chunk.py"]


def test_templates_that_group_heads_get_the_tensors_as_they_are(monkeypatch):
    """A kernel template listed in GROUPING_TEMPLATES reads q/k head hv // r itself (features.grouped):
    its op skips the host-side repeat, the other op of the spec keeps it."""
    import fla_gen.emit as emit

    # a gated linear attention: the scalar-gate chunk template, which does not group heads
    rec = canonicalize(checked(GROUPED.replace("input beta: [B, T, HV]\n", "").replace(
        "update S = S + beta * outer(k, v - S^T @ k)", "update S = S + outer(k, v)")))
    chunk_algo, _ = select_algorithms(rec)
    assert "repeat_interleave" in {f.path: f.text for f in emit.emit_package(rec)}["t/chunk.py"]
    assert not emit.kernel_groups_heads(lower(rec), chunk_algo)
    monkeypatch.setattr(emit, "GROUPING_TEMPLATES", frozenset({chunk_algo.template}))
    assert emit.kernel_groups_heads(lower(rec), chunk_algo)
    files = {f.path: f.text for f in emit.emit_package(rec)}
    assert "repeat_interleave" not in files["t/chunk.py"]
    assert "if call.HV != call.H:" in files["t/fused_recurrent.py"]


def test_transforms_over_both_kinds_of_heads_run_as_one_pass_per_head_count():
    """Lines on H (q) and on HV (beta) run as two kernel pairs, each over the rows of its own inputs: the
    grouping kernels then take q and k as given, with no host repeat."""
    import fla_gen.emit as emit
    from fla_gen.transforms import transform_parts

    source = GROUPED.replace("param scale = K ** -0.5\n",
                             "param scale = K ** -0.5\ntransform q = l2norm(q)\ntransform beta = sigmoid(beta)\n")
    rec = canonicalize(checked(source))
    parts = transform_parts(lower(rec))
    assert [(p.heads, [n for n, _ in p.kernel.sources]) for p in parts] == [(Heads.H, ["q"]), (Heads.HV, ["beta"])]
    files = {f.path: f.text for f in emit.emit_package(rec)}
    for algo in select_algorithms(rec):
        assert emit.kernel_groups_heads(lower(rec), algo) and not emit.host_repeats_heads(lower(rec), algo)
    assert "repeat_interleave" not in files["t/chunk.py"] + files["t/fused_recurrent.py"]
    # each pair through its runner: the autograd.Function (TTransformsH / TTransformsHV) where autograd records
    assert "_q, = _run_h(" in files["t/transforms.py"] and "return TTransformsH.apply(" in files["t/transforms.py"]
    assert "_beta, = _run_hv(" in files["t/transforms.py"] and "return TTransformsHV.apply(" in files["t/transforms.py"]


def test_a_transform_line_over_both_kinds_of_heads_keeps_the_host_fallback():
    """A line of an HV input that reads an H per-head input cannot run on either head count alone: the autograd
    path repeats the H-head inputs on the host (the grouping kernels then run with H = HV), while the decode
    path without autograd launches the grouping kernel on the raw inputs, before that repeat."""
    import fla_gen.emit as emit
    from fla_gen.transforms import transform_parts

    source = GROUPED.replace("state S", "input A_log: [H]\nstate S").replace(
        "param scale = K ** -0.5\n", "param scale = K ** -0.5\ntransform q = l2norm(q)\n"
        "transform g = -exp(A_log) * softplus(g)\n")
    rec = canonicalize(checked(source))
    assert transform_parts(lower(rec)) is None
    chunk_algo, _ = select_algorithms(rec)
    assert emit.kernel_groups_heads(lower(rec), chunk_algo) and emit.host_repeats_heads(lower(rec), chunk_algo)
    files = {f.path: f.text for f in emit.emit_package(rec)}
    assert "q = q.repeat_interleave(groups, dim=2)" in files["t/chunk.py"]
    assert "A_log = A_log.repeat_interleave(groups, dim=0)" in files["t/chunk.py"]
    recurrent = files["t/fused_recurrent.py"]
    assert recurrent.index("transform_args=(") < recurrent.index("if call.HV != call.H:")
