"""Boolean params that guard transform lines, and option lines: parse, check, the derived reference and the
emitted signatures (no kernels run)."""

import pytest
import torch

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import emit_package
from fla_gen.errors import SpecError
from fla_gen.parse import parse_spec
from fla_gen.reference import derive_transforms

BASE = """op guarded
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input beta: [B, T, H]
state S: [K, V]
{extra}
update S = S + beta * outer(k, v - S^T @ k)
output o = S^T @ q
"""


def checked(extra: str):
    return check_spec(parse_spec(BASE.format(extra=extra), "guarded.fla"))


def error_of(extra: str) -> str:
    with pytest.raises(SpecError) as e:
        checked(extra)
    return str(e.value)


def test_flags_guard_transform_lines():
    spec = checked("param norm: bool = false\nparam logits: bool = true\n"
                   "transform q = l2norm(q) if norm\ntransform beta = sigmoid(beta) if logits\n"
                   "transform k = l2norm(k)")
    assert [(f.name, f.default) for f in spec.flags] == [("norm", False), ("logits", True)]
    assert [t.guard for t in spec.transforms] == ["norm", "logits", None]
    assert derive_transforms(spec) == (
        "q = (q * torch.rsqrt((q * q).sum(-1, keepdim=True) + 1e-06)) if norm else q",
        "beta = torch.sigmoid(beta) if logits else beta",
        "k = (k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-06))",
    )


def test_options_parse_to_python_values():
    spec = checked("option state_v_first = false\noption chunk_indices = none\noption chunk_size = 64\n"
                   "option strict = true")
    assert [(o.name, o.value) for o in spec.options] == [
        ("state_v_first", False), ("chunk_indices", None), ("chunk_size", 64.0), ("strict", True)]


@pytest.mark.parametrize("extra,message", [
    ("param norm: int = false\ntransform q = l2norm(q) if norm", "the only param type is 'bool'"),
    ("param norm: bool = 0\ntransform q = l2norm(q) if norm", "unexpected"),
    ("param norm: bool = maybe\ntransform q = l2norm(q) if norm", "'true' or 'false', got 'maybe'"),
    ("transform q = l2norm(q) if norm", "guard 'norm' is not declared"),
    ("param norm: bool = false\ntransform q = l2norm(q) if nrom", "did you mean 'norm'"),
    ("param scale = 1.0\ntransform q = l2norm(q) if scale", "a param, not a boolean param"),
    ("param norm: bool = false", "'norm' is declared but guards no transform"),
    ("param norm: bool = false\ntransform q = l2norm(q) if norm\ntransform k = norm * k",
     "'norm' is a boolean param, not a value"),
    ("option initial_state = none", "an argument of every generated op"),
    ("option cp_context = none", "'cp_context' is an argument of every generated op"),
    ("option mode = fast", "an option's value is true, false, none or a number"),
    ("option head_first = false\noption head_first = false", "'head_first' is declared twice"),
    ("option q = none", "'q' is declared twice"),
    ("option strict = true\ntransform k = strict * k", "'strict' is an option, not a value"),
    ("input A_log: [H] if gate\ntransform beta = -exp(A_log) * beta", "which is not a declared boolean param"),
    ("param gate: bool = false\ninput A_log: [B, T, H] if gate\ntransform beta = beta if gate",
     "a guarded input is a per-head parameter of a transform, [H] or a vector [H, K] / [H, V]"),
    ("param gate: bool = false\ninput w: [H, K] if gate\ntransform beta = beta * exp(w) if gate",
     "the transform of 'beta', a scalar per token, reads 'w', a per-head vector [H, K]"),
    ("param gate: bool = false\ninput A_log: [H] if gate\ntransform beta = -exp(A_log) * beta",
     "only a transform guarded by 'gate' can read it"),
    ("param gate: bool = false\nparam other: bool = false\ninput A_log: [H] if gate\n"
     "transform beta = -exp(A_log) * beta if other", "only a transform guarded by 'gate' can read it"),
    ("param gate: bool = false\ninput A_log: [H] if gate\ntransform beta = beta if gate",
     "'A_log' is declared but never used"),
    ("param twice: bool = false requires logits\nparam logits: bool = false\n"
     "transform beta = sigmoid(beta) if logits\ntransform beta = 2 * beta if twice",
     "'twice' requires 'logits', which is not a boolean param declared before it"),
])
def test_bad_flags_and_options_are_spec_errors(extra, message):
    assert message in error_of(extra)


def test_generated_signature_has_flags_and_options_and_reference_applies_the_guard():
    spec = checked("param norm: bool = false\ntransform q = l2norm(q) if norm\ntransform k = l2norm(k) if norm\n"
                   "option state_v_first = false\noption chunk_indices = none")
    files = {f.path: f.text for f in emit_package(canonicalize(spec))}
    chunk = files["guarded/chunk.py"]
    assert "    norm: bool = False,\n    state_v_first: bool = False,\n    chunk_indices: object = None,\n" in chunk
    assert '("state_v_first", state_v_first, False),' in chunk
    # every transform is guarded: with the flag off the op runs no transform pass
    assert ("    if norm:\n        _q, _k = guarded_transforms(q, k, call=call, cu_seqlens=cu_seqlens, flags=(norm,))\n"
            "    else:\n        _q, _k = q.contiguous(), k.contiguous()" in chunk)
    namespace = {}
    exec(compile(files["guarded/reference.py"], "reference.py", "exec"), namespace)
    ref = namespace["guarded_reference"]
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64), torch.randn(1, 3, 1, 4, generator=gen,
                                                                                     dtype=torch.float64)
    v, beta = torch.randn(1, 3, 1, 4, generator=gen, dtype=torch.float64), torch.rand(1, 3, 1, generator=gen,
                                                                                      dtype=torch.float64)
    unit = torch.nn.functional.normalize
    o_on, _ = ref(q, k, v, beta, norm=True)
    o_off, _ = ref(unit(q, dim=-1), unit(k, dim=-1), v, beta)
    assert torch.allclose(o_on, o_off, rtol=1e-5)  # eps 1e-6 inside the root: equal to 1e-6 relative
    o_raw, _ = ref(q, k, v, beta)
    assert not torch.allclose(o_on, o_raw)


def test_inputs_that_only_switchable_lines_rebind_pass_through_the_pass():
    from fla_gen.lower import lower
    from fla_gen.transforms import pass_outputs, switched_sources

    def switched(extra: str) -> dict:
        spec = checked(extra)
        return switched_sources(spec, spec.transforms, pass_outputs(lower(canonicalize(spec))))

    assert switched("param norm: bool = false\nparam logits: bool = false\ntransform q = l2norm(q) if norm\n"
                    "transform k = l2norm(k)\ntransform beta = sigmoid(beta) if logits\n"
                    "transform beta = 2 * beta if norm") == {"q": ("norm",), "beta": ("norm", "logits")}
    # every line guarded: the op skips the pass with all flags off, so an input whose lines carry all of them needs
    # no switch of its own
    assert switched("param norm: bool = false\ntransform q = l2norm(q) if norm\ntransform k = l2norm(k) if norm") == {}
    assert switched("param norm: bool = false\nparam logits: bool = false\ntransform q = l2norm(q) if norm\n"
                    "transform beta = sigmoid(beta) if logits") == {"q": ("norm",), "beta": ("logits",)}


def test_guarded_inputs_are_keywords_after_the_flags():
    spec = checked("param gate: bool = false\ninput A_log: [H] if gate\ninput dt_bias: [H] = 0 if gate\n"
                   "transform beta = sigmoid(beta * exp(A_log) + dt_bias) if gate")
    assert [i.name for i in spec.inputs] == ["q", "k", "v", "beta"]
    assert [(i.name, i.guard, i.optional) for i in spec.guarded_inputs] == [("A_log", "gate", False),
                                                                            ("dt_bias", "gate", True)]
    chunk = {f.path: f.text for f in emit_package(canonicalize(spec))}["guarded/chunk.py"]
    assert ("    gate: bool = False,\n    A_log: torch.Tensor | None = None,\n"
            "    dt_bias: torch.Tensor | None = None,\n") in chunk
    assert '("A_log", A_log, "gate", gate, False),' in chunk


# KDA's gate on a toy spec: a per-head scalar and an optional per-head vector over K, read by the guarded
# transform of a per-channel gate.
VECTOR_GATE = """op vgate
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H, K]
input beta: [B, T, H]
state S: [K, V]
param gate: bool = false
input A_log: [H] if gate
input dt_bias: [H, K] = 0 if gate
transform g = -exp(A_log) * softplus(g + dt_bias) if gate
update S = exp(g) * S
update S = S + beta * outer(k, v - S^T @ k)
output o = S^T @ q
"""


def test_a_guarded_per_head_vector_is_a_keyword_of_the_ops_and_the_reference():
    spec = check_spec(parse_spec(VECTOR_GATE, "vgate.fla"))
    assert [(i.name, i.dims, i.vec_dim, i.optional) for i in spec.guarded_inputs] == [
        ("A_log", ("H",), None, False), ("dt_bias", ("H", "K"), "K", True)]
    files = {f.path: f.text for f in emit_package(canonicalize(spec))}
    chunk = files["vgate/chunk.py"]
    # validated as [H, K] or flat [H * K] (fla passes dt_bias flat); zeros of that shape where it is absent
    assert 'TensorArg("dt_bias", "HK", optional=True, gate=True, flat=True),' in chunk
    assert "dt_bias = torch.zeros(call.H, call.K, dtype=torch.float32" in chunk
    assert "dt_bias: [H, K] (or flat [H * K]) per-head parameter of the transform of g" in chunk
    namespace = {}
    exec(compile(files["vgate/reference.py"], "reference.py", "exec"), namespace)
    ref = namespace["vgate_reference"]
    gen = torch.Generator().manual_seed(0)
    B, T, H, K, V = 1, 5, 2, 4, 3
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v, g = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64), torch.randn(B, T, H, K, generator=gen,
                                                                                     dtype=torch.float64)
    beta = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    A_log, dt_bias = torch.rand(H, generator=gen, dtype=torch.float64), torch.randn(H, K, generator=gen,
                                                                                   dtype=torch.float64)
    gate = -A_log.exp()[:, None] * torch.nn.functional.softplus(g + dt_bias)  # the gate written out by hand
    o_given, _ = ref(q, k, v, gate, beta)
    o_2d, _ = ref(q, k, v, g, beta, gate=True, A_log=A_log, dt_bias=dt_bias)
    o_flat, _ = ref(q, k, v, g, beta, gate=True, A_log=A_log, dt_bias=dt_bias.flatten())
    o_no_bias, _ = ref(q, k, v, g, beta, gate=True, A_log=A_log)
    o_zero_bias, _ = ref(q, k, v, -A_log.exp()[:, None] * torch.nn.functional.softplus(g), beta)
    assert torch.allclose(o_2d, o_given) and torch.allclose(o_flat, o_given)
    assert torch.allclose(o_no_bias, o_zero_bias) and not torch.allclose(o_no_bias, o_given)


def test_a_guarded_per_head_vector_is_loaded_per_head_and_its_gradient_kept_per_channel():
    """The pass loads the D channels of the row's head (masked like the row's own vector) and stores a [rows, D]
    partial gradient under the input's flag; the decode kernel loads the same channels."""
    files = {f.path: f.text for f in emit_package(canonicalize(check_spec(parse_spec(VECTOR_GATE, "vgate.fla"))))}
    load = "tl.load(p_dt_bias + i_h * K + o_K, mask=m_K, other=0.0).to(tl.float32)"
    assert files["vgate/transforms.py"].count(load) == 2  # the forward kernel and the backward's recomputation
    assert load in files["vgate/fused_recurrent.py"]
    assert "    if flag_gate:\n        tl.store(dp_A_log + row, " in files["vgate/transforms.py"]
    assert "        tl.store(dp_dt_bias + row * K + o_K, " in files["vgate/transforms.py"]
