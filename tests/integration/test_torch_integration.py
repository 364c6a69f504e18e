"""Generated ops as PyTorch citizens: custom ops under torch.compile, and the layers around them.

torch.compile tests trace with fullgraph=True and count graph breaks through torch._dynamo's counters.
The sweep over every op uses backend="aot_eager": it runs the same Dynamo capture and AOTAutograd
trace (the custom ops' fake implementations, the backward op) as inductor, but without inductor's
C++ compile of the surrounding code, which costs ~20 s per graph on the 2-core CI box. One test
compiles a layer with inductor to prove that path too.
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from fla_gen.layers import DeltaLayer, DPLRLayer, GatedLayer, LayerState, layer_for
from fla_gen.runtime import torch_op
from fla_gen.runtime.dispatch import forced_arch
from fla_gen.sample import relative_error, sample_inputs
from tests.support import generated, recurrence

OPS = ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "rwkv7"]


def _compiled(fn, backend="aot_eager"):
    torch._dynamo.reset()
    counters.clear()
    return torch.compile(fn, fullgraph=True, backend=backend)


def _graph_breaks() -> int:
    return sum(counters["graph_break"].values())


def _grads(loss, leaves):
    return torch.autograd.grad(loss, leaves, allow_unused=True)


@pytest.mark.parametrize("op", OPS)
def test_compile_fullgraph_equals_eager(op):
    """chunk_<op> then fused_recurrent_<op> (continuing from its state), in one compiled function."""
    rec, pkg = recurrence(op), generated(op)
    B, T, H, K, V = 1, 20, 1, 16, 8  # tiny: every call runs in the interpreter, twice
    x = sample_inputs(rec, B, T, H, K, V, torch.float32)
    h0 = torch.randn(B, H, K, V)
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    names = [i.name for i in rec.spec.inputs]
    chunk, recurrent = getattr(pkg, f"chunk_{op}"), getattr(pkg, f"fused_recurrent_{op}")
    do = torch.randn(B, T, H, V)

    def f(*args):
        *inputs, h = args
        o, ht = chunk(*inputs, initial_state=h, output_final_state=True)
        o2, ht2 = recurrent(*inputs, initial_state=ht, output_final_state=True)
        o3, none = chunk(*inputs, scale=0.5)  # no state in or out: the placeholder path
        assert none is None
        return ((o + o2 - o3) * do).sum() + ht2.square().sum()

    eager = f(*leaves)
    eager_grads = _grads(eager, leaves)
    cf = _compiled(f)
    got = cf(*leaves)
    got_grads = _grads(got, leaves)
    assert _graph_breaks() == 0, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1
    assert relative_error(got, eager) < 1e-6
    for name, g, e in zip([*names, "initial_state"], got_grads, eager_grads, strict=True):
        if e is None:
            assert g is None, name
        else:
            assert relative_error(g, e) < 1e-6, name


def test_compile_varlen_checks_offsets_inside_the_op():
    """Under torch.compile the wrapper cannot read cu_seqlens; the op checks the values when it runs."""
    op = "gated_delta_rule"
    rec, pkg = recurrence(op), generated(op)
    x = sample_inputs(rec, 1, 20, 1, 16, 16, torch.float32)
    leaves = list(x.values())
    for t in leaves:
        t.requires_grad_(True)

    def f(cu, cu_cpu, *inputs):
        o, ht = pkg.chunk_gated_delta_rule(*inputs, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)
        o2, _ = pkg.fused_recurrent_gated_delta_rule(*inputs, initial_state=ht, cu_seqlens=cu)
        return o.sum() + o2.square().sum()

    cu = torch.tensor([0, 7, 7, 20], dtype=torch.int32)
    cf = _compiled(f)
    for cu_cpu in (cu.clone(), None):
        got, eager = cf(cu, cu_cpu, *leaves), f(cu, cu_cpu, *leaves)
        assert relative_error(got, eager) < 1e-6
        for g, e in zip(_grads(got, leaves), _grads(eager, leaves), strict=True):
            assert relative_error(g, e) < 1e-6
    assert _graph_breaks() == 0, dict(counters["graph_break"])
    bad = torch.tensor([0, 9, 7, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match="chunk_gated_delta_rule: cu_seqlens must be non-decreasing"):
        cf(bad, bad.clone(), *leaves)


def test_compile_refuses_bad_shapes_at_trace_time():
    pkg = generated("gla")
    q = torch.randn(1, 8, 2, 16)

    def f(q, k, v, g):
        return pkg.chunk_gla(q, k, v, g)[0]

    with pytest.raises(Exception, match="chunk_gla: v has H = 3"):
        _compiled(f)(q, q, torch.randn(1, 8, 3, 16), q)


@pytest.mark.parametrize(("op", "mode"), [("simple_gla", "fused_recurrent"), ("linear_attn", "chunk")])
def test_opcheck(op, mode):
    """torch.library.opcheck: schema, fake implementation against the real one (dynamic shapes too),
    autograd registration and AOT dispatch, on the custom op behind the public function."""
    rec = recurrence(op)
    module = getattr(generated(op), mode)
    custom_op = getattr(module, f"_{mode}_{op}_op")
    x = sample_inputs(rec, 1, 20, 1, 16, 8, torch.float32)
    for t in x.values():
        t.requires_grad_(True)
    cu = torch.tensor([0, 5, 20])
    h0 = torch.randn(2, 1, 16, 8, requires_grad=True)
    result = torch.library.opcheck(custom_op, (*x.values(), 0.25, h0, True, cu, cu.clone(), None))
    assert set(result.values()) == {"SUCCESS"}, result


def test_opcheck_with_a_gate_lower_bound():
    """The bounded-gate plan of chunk_rwkv7 (a second plan table, its pairwise kernels without the run-time
    check) behind the same op."""
    rec = recurrence("rwkv7")
    custom_op = generated("rwkv7").chunk._chunk_rwkv7_op
    x = sample_inputs(rec, 1, 40, 1, 16, 8, torch.float32)
    x["w"] = -0.5 * torch.rand_like(x["w"])
    for t in x.values():
        t.requires_grad_(True)
    h0 = torch.randn(1, 1, 16, 8, requires_grad=True)
    # the launch order of the op: q, k, v, g, a, b
    args = [x[n] for n in ("r", "k", "v", "w", "a", "b")]
    with forced_arch("sm90"):  # a target whose bounded table has fp32 rows at this head dim
        result = torch.library.opcheck(custom_op, (*args, 1.0, h0, True, None, None, -0.6))
    assert set(result.values()) == {"SUCCESS"}, result


# ----------------------------------------------------------------------------- layers

def _decode_matches_prefill(layer, B=2, T=13, n=3, D=32):
    """Prefill T tokens with chunk_<op>, decode n one at a time with fused_recurrent_<op>: the outputs
    and the final cache equal one prefill of T + n tokens."""
    x = torch.randn(B, T + n, D)
    calls = []

    def spy(fn, tag):
        def wrapped(*args, **kwargs):
            calls.append(tag)
            return fn(*args, **kwargs)
        return wrapped

    layer.ops = dataclasses.replace(layer.ops, chunk=spy(layer.ops.chunk, "chunk"),
                                    fused_recurrent=spy(layer.ops.fused_recurrent, "recurrent"))
    y_full, s_full = layer(x, use_cache=True)
    y, state = layer(x[:, :T], use_cache=True)
    ys = [y]
    for i in range(T, T + n):
        y, state = layer(x[:, i:i + 1], past_state=state, use_cache=True)
        ys.append(y)
    assert calls == ["chunk", "chunk"] + ["recurrent"] * n
    assert relative_error(torch.cat(ys, 1), y_full) < 1e-5
    assert relative_error(state.recurrent, s_full.recurrent) < 1e-5
    if state.conv is not None:
        assert relative_error(state.conv, s_full.conv) < 1e-6


@pytest.mark.parametrize(("op", "cls"), [("gla", GatedLayer), ("simple_gla", GatedLayer),
                                         ("gated_delta_rule", DeltaLayer), ("rwkv7", DPLRLayer)])
def test_layer_prefill_then_decode_equals_one_prefill(op, cls):
    torch.manual_seed(0)
    layer = cls(generated(op), hidden_size=32, num_heads=2, head_k_dim=16, head_v_dim=8, decode_max_tokens=1)
    _decode_matches_prefill(layer)


def test_layer_without_convolution():
    layer = layer_for(generated("delta_rule"), 32, 2, 16, conv_size=0, decode_max_tokens=1)
    assert isinstance(layer, DeltaLayer) and layer.conv is None
    _decode_matches_prefill(layer)


def test_layer_varlen_equals_separate_sequences():
    """Packed sequences (cu_seqlens) never see each other: not in the op, not in the convolution."""
    layer = layer_for(generated("gated_delta_rule"), 32, 1, 16)
    x = torch.randn(1, 20, 32)
    cu = torch.tensor([0, 2, 11, 20], dtype=torch.int32)
    y, state = layer(x, cu_seqlens=cu, use_cache=True)
    parts = [layer(x[:, a:b], use_cache=True) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True)]
    assert relative_error(y, torch.cat([p[0] for p in parts], 1)) < 1e-5
    assert relative_error(state.recurrent, torch.cat([p[1].recurrent for p in parts])) < 1e-5
    assert relative_error(state.conv, torch.cat([p[1].conv for p in parts])) < 1e-6
    # Decoding one token per sequence from the packed cache equals decoding each sequence alone.
    step = torch.randn(1, 3, 32)
    y2, _ = layer(step, cu_seqlens=torch.arange(4, dtype=torch.int32), past_state=state)
    alone = [layer(step[:, i:i + 1], past_state=LayerState(p[1].recurrent, p[1].conv))[0] for i, p in enumerate(parts)]
    assert relative_error(y2, torch.cat(alone, 1)) < 1e-5


def test_layer_refuses_the_wrong_family():
    with pytest.raises(TypeError, match="GatedLayer needs an op whose rank-1 part is none, got delta; use DeltaLayer"):
        GatedLayer(generated("delta_rule"), 32, 2, 16)
    with pytest.raises(TypeError, match="not a package generated by this fla-gen"):
        GatedLayer(torch, 32, 2, 16)


def test_layer_compiles_with_inductor():
    """A layer (projections, convolution, the custom op) under inductor: one graph, forward and
    backward equal to eager."""
    torch.manual_seed(0)
    layer = layer_for(generated("simple_gla"), 32, 1, 16)
    x = torch.randn(1, 20, 32, requires_grad=True)
    params = [x, *layer.parameters()]
    eager = layer(x)[0].square().sum()
    eager_grads = _grads(eager, params)
    got = _compiled(lambda x: layer(x)[0], backend="inductor")(x).square().sum()
    got_grads = _grads(got, params)
    assert _graph_breaks() == 0, dict(counters["graph_break"])
    assert relative_error(got, eager) < 1e-5
    for g, e in zip(got_grads, eager_grads, strict=True):
        assert relative_error(g, e) < 1e-4


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_eager_calls_bypass_the_dispatcher_with_the_same_result(mode, monkeypatch):
    """Without tracing the public function runs the op's body directly (no dispatcher overhead): under
    no_grad, and with gradients through an autograd.Function with the op's own backward. Outputs and
    gradients equal those of the custom op, which runs while anything may be tracing."""
    op = "simple_gla"
    rec, module = recurrence(op), getattr(generated(op), mode)
    x = sample_inputs(rec, 2, 10, 1, 16, 16, torch.float32)
    h0 = torch.randn(2, 1, 16, 16, requires_grad=True)
    fn = getattr(module, f"{mode}_{op}")
    calls = []
    real = getattr(module, f"_{mode}_{op}_op")
    with monkeypatch.context() as patch, torch.no_grad():
        patch.setattr(module, f"_{mode}_{op}_op", lambda *a: calls.append(1) or real(*a))
        o0, ht0 = fn(*x.values(), initial_state=h0, output_final_state=True)
    assert calls == []
    leaves = [*(t.requires_grad_(True) for t in x.values()), h0]
    do = torch.randn_like(o0)

    def run():
        o, ht = fn(*leaves[:-1], initial_state=h0, output_final_state=True)
        return o, ht, _grads((o * do).sum() + ht.square().sum(), leaves)

    o1, ht1, grads1 = run()
    assert type(o1.grad_fn).__name__.startswith(f"{mode}_{op}_eager")
    monkeypatch.setattr(torch_op, "_may_be_traced", lambda: True)
    o2, ht2, grads2 = run()
    assert "fla_gen" in type(o2.grad_fn).__name__  # the custom op's autograd
    assert torch.equal(o0, o1.detach()) and torch.equal(ht0, ht1.detach())
    assert torch.equal(o1, o2) and torch.equal(ht1, ht2)
    for g1, g2 in zip(grads1, grads2, strict=True):
        assert (g1 is None and g2 is None) or torch.equal(g1, g2)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("eager", [True, False], ids=["eager", "custom_op"])
def test_an_unused_output_gets_no_zero_gradient(mode, eager, monkeypatch):
    """The backward receives None, not a materialized zero tensor, for an output the loss does not use
    (the saved tensors, final_state or o): each zero would cost a memset as large as the output. The
    gradients equal those of an explicit zero gradient."""
    op = "gla"  # its chunked forward returns saved tensors
    rec, module = recurrence(op), getattr(generated(op), mode)
    if not eager:
        monkeypatch.setattr(torch_op, "_may_be_traced", lambda: True)
    x = sample_inputs(rec, 2, 10, 1, 16, 16, torch.float32)
    h0 = torch.randn(2, 1, 16, 16, requires_grad=True)
    leaves = [*(t.requires_grad_(True) for t in x.values()), h0]
    fn = getattr(module, f"{mode}_{op}")
    backward_dht = []  # the final state's gradient as each backward op receives it
    real_call_op = torch_op.call_op

    def spy(op_, body, *args):
        if body.__name__ == "_op_backward":
            backward_dht.append(args[-2])
        return real_call_op(op_, body, *args)

    monkeypatch.setattr(torch_op, "call_op", spy)

    def grads(o_weight, ht_weight):
        o, ht = fn(*leaves[:-1], initial_state=h0, output_final_state=True)
        loss = [(o * o_weight).sum() if o_weight is not None else None,
                (ht * ht_weight).sum() if ht_weight is not None else None]
        return _grads(sum(t for t in loss if t is not None), leaves)

    do, dht = torch.randn(2, 10, 1, 16), torch.randn(2, 1, 16, 16)
    for only, zeros in (((do, None), (do, torch.zeros_like(dht))), ((None, dht), (torch.zeros_like(do), dht))):
        backward_dht.clear()
        only_grads = grads(*only)
        # final_state unused: its backward gets None (no zero tensor made for it); used: the gradient itself
        assert len(backward_dht) == 1 and (backward_dht[0] is None) == (only[1] is None), backward_dht
        for g1, g2 in zip(only_grads, grads(*zeros), strict=True):
            assert relative_error(g1, g2) < 1e-6


@pytest.mark.parametrize(("op", "varlen"), [("simple_gla", False), ("gla", True), ("gated_delta_rule", True)])
def test_compile_over_sequence_segments_equals_eager(op, varlen):
    """With the sequences split into segments (fla_gen/runtime/segments.py), the compiled call traces the
    segment tables from shapes alone (fake tensors carry no values, and nothing fake is cached) and equals
    the eager call, outputs and gradients."""
    from fla_gen.runtime.segments import forced_segment_chunks

    rec, pkg = recurrence(op), generated(op)
    B, T, H, K, V = (1, 150, 1, 16, 16) if varlen else (2, 150, 1, 16, 16)
    x = sample_inputs(rec, B, T, H, K, V, torch.float32)
    cu = torch.tensor([0, 30, 150]) if varlen else None
    h0 = torch.randn(2, H, K, V)
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    chunk = getattr(pkg, f"chunk_{op}")

    def f(*args):
        *inputs, h = args
        o, ht = chunk(*inputs, initial_state=h, output_final_state=True, cu_seqlens=cu)
        return o.square().sum() + ht.square().sum()

    with forced_segment_chunks(1):
        eager = f(*leaves)
        eager_grads = _grads(eager, leaves)
        got = _compiled(f)(*leaves)
        got_grads = _grads(got, leaves)
    assert _graph_breaks() == 0, dict(counters["graph_break"])
    assert relative_error(got, eager) < 1e-6
    for g, e in zip(got_grads, eager_grads, strict=True):
        assert relative_error(g, e) < 1e-6


def _import_copy(src: Path, root: Path, name: str, edit=None):
    """generated/<src> copied to root/name (``edit`` rewrites its chunk.py) and imported as ``name``."""
    shutil.copytree(src, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    if edit is not None:
        chunk = root / name / "chunk.py"
        chunk.write_text(edit(chunk.read_text()))
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(root))


def test_two_builds_of_one_spec_each_run_their_own_code(tmp_path):
    # A package from the same spec but another build (here: its forward doubles o) is an A/B of a compiler
    # change in one process; it must not run the first-imported build's op, which had the same spec hash.
    src = Path(__file__).resolve().parents[2] / "generated" / "linear_attn"
    same = _import_copy(src, tmp_path, "linear_attn_same_build")
    other = _import_copy(src, tmp_path, "linear_attn_other_build", lambda text: text.replace(
        "def _op_forward(", "def _op_forward(*args):\n    o, *rest = _op_forward_shipped(*args)\n"
        "    return (2 * o, *rest)\n\n\ndef _op_forward_shipped(", 1))
    # inputs that take gradients: the call goes through the registered op's autograd (no grad: each module's
    # own forward, whatever is registered)
    q, k, v = (torch.randn(1, 32, 2, 16, requires_grad=True) for _ in range(3))
    o = generated("linear_attn").chunk_linear_attn(q, k, v)[0]
    assert same.chunk._chunk_linear_attn_op is generated("linear_attn").chunk._chunk_linear_attn_op
    assert torch.equal(same.chunk_linear_attn(q, k, v)[0], o)
    assert relative_error(other.chunk_linear_attn(q, k, v)[0], 2 * o) < 1e-6
