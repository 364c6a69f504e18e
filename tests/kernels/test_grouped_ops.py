"""Grouped value heads through the generated ops (interpreter, fp32, small shapes): q, k [B, T, H, K] with
v, g, beta [B, T, HV, ...] and the state [N, HV, K, V], HV = 2·H, against the float64 derived reference.

The reference itself is checked against an independent oracle: the ungrouped reference of the same
recurrence run on q and k repeated over their groups, whose dq and dk summed over each group must be
the grouped dq and dk.

The chunked delta-rule kernels (chunk_delta.jinja: gated_delta_rule's scalar gate, and KDA's per-channel gate,
specs/kda.fla) read q and k at their key-side head themselves, and the spec's transforms run as one pass per
head count (q, k on H; beta, g on HV): with autograd and fla's switches on, no q or k is repeated to the value
heads. KDA's grouped ops are also checked against a second construction: an ungrouped build of specs/kda.fla
(every input on H heads) run on q and k repeated over their groups."""

import contextlib
import importlib
import sys

import pytest
import torch
import torch.nn.functional as F

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import emit_package
from fla_gen.ir import Heads
from fla_gen.parse import parse_spec
from fla_gen.runtime import launch, segments
from fla_gen.runtime.dispatch import forced_arch
from fla_gen.sample import relative_error, sample_inputs
from fla_gen.verify import TOLERANCE, compare_with_reference
from fla_gen.write import write_files
from tests.support import (
    REPO_ROOT,
    assert_gradients_match_reference,
    built_package,
    generated,
    grads_of,
    poisoned_allocations,
    recurrence,
    spy_on_launch,
)

H, HV, K, V = 2, 4, 16, 16
GROUPS = HV // H


def _check(result):
    assert not result.failures(), result.errors
    # every gradient was compared: q, k on H heads (summed over their groups), the rest on HV
    assert {"dq", "dk", "dv", "dg", "dbeta", "dinitial_state"} <= set(result.errors)


def _gdn_case(mode: str, B: int, T: int, cu_seqlens: list[int] | None, seed: int, op: str = "gated_delta_rule"):
    x = sample_inputs(recurrence(op), B, T, H, K, V, torch.float32, seed=seed, HV=HV)
    assert x["q"].shape[2] == H and x["v"].shape[2] == HV and x["g"].shape[:3] == (B, T, HV)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    torch.manual_seed(seed)
    inputs = {**x, "initial_state": torch.randn(N, HV, K, V)}
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    pkg = generated(op)
    return compare_with_reference(getattr(pkg, f"{mode}_{op}"), getattr(pkg, f"{op}_reference"), inputs,
                                  torch.float32, name=f"{mode}_{op}", guard=poisoned_allocations, cu_seqlens=cu)


# The chunked op gets sequences over one 64-token chunk, so states cross chunk boundaries.
@pytest.mark.parametrize(("mode", "T"), [("chunk", 70), ("fused_recurrent", 24)])
def test_gated_delta_rule_grouped(mode, T):
    _check(_gdn_case(mode, 2, T, None, seed=11))


@pytest.mark.parametrize(("mode", "cu_seqlens"), [("chunk", [0, 13, 13, 84]), ("fused_recurrent", [0, 7, 7, 26])])
def test_gated_delta_rule_grouped_varlen(mode, cu_seqlens):
    _check(_gdn_case(mode, 1, cu_seqlens[-1], cu_seqlens, seed=12))


# A dense batch of two is walked as packed segments: the walks find each token's group-major w row from the
# segment's batch (bos // T), not from the program's sequence index.
@pytest.mark.parametrize("many_sms", [False, True], ids=["fused-walk", "state-walk"])
@pytest.mark.parametrize(("op", "B", "T", "cu_seqlens"), [
    ("gated_delta_rule", 2, 200, None),
    ("gated_delta_rule", 1, 300, [0, 50, 50, 300]),
    ("kda", 2, 200, None),
    ("kda", 1, 300, [0, 50, 50, 300]),
])
def test_grouped_chunk_op_over_segments(op, B, T, cu_seqlens, many_sms, monkeypatch):
    """The grouped chunk ops with their sequences split into one-chunk segments (fla_gen/runtime/segments.py)
    match the float64 reference: outputs, final state and every gradient. gated_delta_rule's forward is its fused
    walk on 0 SMs under sm90's plans (sm80's, the default, have none) and the state walk on 1000."""
    launches = spy_on_launch(monkeypatch, "fused_walk_launch")
    arch = forced_arch("sm90") if op == "gated_delta_rule" and not many_sms else contextlib.nullcontext()
    with segments.forced_segment_chunks(1), launch.forced_sm_count(1000 if many_sms else 0), arch:
        _check(_gdn_case("chunk", B, T, cu_seqlens, seed=14, op=op))
    tiles = [bv for bv, _stages in launches]
    if op == "gated_delta_rule":
        assert tiles and all((tile > 0) == (not many_sms) for tile in tiles), tiles


def test_grouped_spec_with_hv_equal_h_runs_ungrouped():
    """HV == H: the shipped grouped spec takes fla's ungrouped call unchanged."""
    x = sample_inputs(recurrence("gated_delta_rule"), 1, 20, H, K, V, torch.float32, seed=13)
    pkg = generated("gated_delta_rule")
    result = compare_with_reference(pkg.chunk_gated_delta_rule, pkg.gated_delta_rule_reference,
                                    {**x, "initial_state": torch.randn(1, H, K, V)}, torch.float32,
                                    name="chunk_gated_delta_rule", guard=poisoned_allocations)
    assert not result.failures(), result.errors


def _ungrouped_spec(op: str) -> str:
    """specs/<op>.fla with every input on the H heads (no grouping)."""
    return (REPO_ROOT / "specs" / f"{op}.fla").read_text().replace("HV", "H")


def _ungrouped_reference(op: str):
    """The reference of ``op`` derived from its spec with every input on H heads."""
    rec = canonicalize(check_spec(parse_spec(_ungrouped_spec(op), "ungrouped.fla")))
    assert not rec.spec.grouped
    source = next(f.text for f in emit_package(rec) if f.path.endswith("reference.py"))
    namespace: dict = {}
    exec(compile(source, "ungrouped_reference.py", "exec"), namespace)
    return namespace[f"{op}_reference"]


@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
@pytest.mark.parametrize("cu_seqlens", [None, [0, 5, 19]])
def test_grouped_reference_equals_ungrouped_on_repeated_qk(op, cu_seqlens):
    B, T = (2, 19) if cu_seqlens is None else (1, 19)
    x = sample_inputs(recurrence(op), B, T, H, K, V, torch.float64, seed=14, HV=HV)
    x = {n: t.double().requires_grad_(True) for n, t in x.items()}
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    h0 = torch.randn(N, HV, K, V, dtype=torch.float64, requires_grad=True)
    kw = {"cu_seqlens": None if cu_seqlens is None else torch.tensor(cu_seqlens), "output_final_state": True}
    o, ht = getattr(generated(op), f"{op}_reference")(*x.values(), initial_state=h0, **kw)
    q_rep = x["q"].detach().repeat_interleave(GROUPS, dim=2).requires_grad_(True)
    k_rep = x["k"].detach().repeat_interleave(GROUPS, dim=2).requires_grad_(True)
    o_u, ht_u = _ungrouped_reference(op)(q_rep, k_rep, x["v"], x["g"], x["beta"], initial_state=h0, **kw)
    assert o.shape == (B, T, HV, V) and ht.shape == (N, HV, K, V)
    assert relative_error(o, o_u) < 1e-12 and relative_error(ht, ht_u) < 1e-12
    do, dht = torch.randn_like(o), torch.randn_like(ht)
    dq, dk = torch.autograd.grad((o * do).sum() + (ht * dht).sum(), [x["q"], x["k"]])
    dq_rep, dk_rep = torch.autograd.grad((o_u * do).sum() + (ht_u * dht).sum(), [q_rep, k_rep])
    for grad, grad_rep in ((dq, dq_rep), (dk, dk_rep)):
        summed = grad_rep.view(B, T, H, GROUPS, K).sum(3)  # head h's gradient: the sum over its value heads
        assert relative_error(grad, summed) < 1e-12
        assert relative_error(grad, grad_rep[:, :, ::GROUPS]) > 1e-3  # a single value head's share is not it


# Another family (gated, per-channel decay) declared grouped, with a transform of an H-head input: the
# host-side fallback repeats q and k before the transform pass.
GROUPED_GLA = """op grouped_gla
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, HV, V]
input g: [B, T, HV, K]
state S: [K, V]
param scale = K ** -0.5
transform k = l2norm(k)
update S = exp(g) * S + outer(k, v)
output o = scale * S^T @ q
"""


@pytest.fixture(scope="module")
def grouped_gla(tmp_path_factory):
    rec = canonicalize(check_spec(parse_spec(GROUPED_GLA, "grouped_gla.fla")))
    root = tmp_path_factory.mktemp("grouped_gla")
    write_files(emit_package(rec), root)
    sys.path.insert(0, str(root))
    try:
        yield rec, importlib.import_module("grouped_gla")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("grouped_gla")]:
            del sys.modules[name]


def test_grouped_gla_chunk(grouped_gla):
    rec, pkg = grouped_gla
    x = sample_inputs(rec, 1, 30, H, K, V, torch.float32, seed=15, HV=HV)
    result = compare_with_reference(pkg.chunk_grouped_gla, pkg.grouped_gla_reference,
                                    {**x, "initial_state": torch.randn(2, HV, K, V)}, torch.float32,
                                    name="chunk_grouped_gla", guard=poisoned_allocations,
                                    cu_seqlens=torch.tensor([0, 11, 30], dtype=torch.int32))
    assert not result.failures(), result.errors


def test_grouped_gla_decode_path(grouped_gla):
    """Without autograd the fused_recurrent kernel applies the transform on load, on the repeated q, k."""
    rec, pkg = grouped_gla
    x = sample_inputs(rec, 2, 9, H, K, V, torch.float32, seed=16, HV=HV)
    h0 = torch.randn(2, HV, K, V)
    with torch.no_grad(), poisoned_allocations():
        o, ht = pkg.fused_recurrent_grouped_gla(*x.values(), initial_state=h0, output_final_state=True)
    ref_o, ref_ht = pkg.grouped_gla_reference(*(t.double() for t in x.values()), initial_state=h0.double(),
                                              output_final_state=True)
    tol = TOLERANCE[torch.float32][0]
    assert o.shape == (2, 9, HV, V)
    assert relative_error(o, ref_o) < tol and relative_error(ht, ref_ht) < tol


def _raw_grouped_inputs(B: int, T: int, N: int, dims: tuple[int, int], seed: int, channel_gate: bool,
                        gate_in_kernel: bool) -> dict:
    """q, k unnormalized on H heads (use_qk_l2norm_in_kernel normalizes them), beta as logits, v and g on HV
    value heads: g raw for use_gate_in_kernel, else a log decay logsigmoid(N(0, 1)) (per key channel with a
    per-channel gate); the initial state [N, HV, K, V]."""
    Kd, Vd = dims
    gen = torch.Generator().manual_seed(seed)
    g_shape = (B, T, HV, Kd) if channel_gate else (B, T, HV)
    g = torch.randn(g_shape, generator=gen)
    return {"q": torch.randn(B, T, H, Kd, generator=gen), "k": torch.randn(B, T, H, Kd, generator=gen),
            "v": torch.randn(B, T, HV, Vd, generator=gen), "g": g if gate_in_kernel else F.logsigmoid(g),
            "beta": torch.randn(B, T, HV, generator=gen), "initial_state": torch.randn(N, HV, Kd, Vd, generator=gen)}


def _gdn_flag_case(B: int, T: int, cu_seqlens: list[int] | None, dims: tuple[int, int], gate_in_kernel: bool,
                   seed: int) -> tuple[dict, tuple, dict]:
    """Inputs, keyword inputs and flags of a grouped chunk_gated_delta_rule call with fla's switches on."""
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    x = _raw_grouped_inputs(B, T, N, dims, seed, channel_gate=False, gate_in_kernel=gate_in_kernel)
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "use_gate_in_kernel": gate_in_kernel,
             "cu_seqlens": None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)}
    if not gate_in_kernel:
        return x, (), flags
    gen = torch.Generator().manual_seed(seed + 1)
    x["A_log"] = torch.empty(HV).uniform_(-3.0, 0.0, generator=gen)  # Qwen3-Next's range: decays in (0.2, 1)
    x["dt_bias"] = torch.randn(HV, generator=gen)
    return x, ("A_log", "dt_bias"), flags


# T = 70: a partial second chunk; the varlen case has an empty sequence and one over a chunk boundary.
@pytest.mark.parametrize(("gate_in_kernel", "cu_seqlens", "dims"), [
    (False, None, (16, 16)), (True, None, (32, 16)), (True, [0, 13, 13, 84], (16, 32))])
def test_gated_delta_rule_grouped_chunk_with_switches(gate_in_kernel, cu_seqlens, dims):
    B, T = (2, 70) if cu_seqlens is None else (1, cu_seqlens[-1])
    x, keywords, flags = _gdn_flag_case(B, T, cu_seqlens, dims, gate_in_kernel, seed=31)
    pkg = generated("gated_delta_rule")
    assert_gradients_match_reference(pkg.chunk_gated_delta_rule, pkg.gated_delta_rule_reference, x, keywords, **flags)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_gate_parameters_on_the_key_heads_repeat_with_them(mode, tmp_path):
    """Gated DeltaNet with its keyword inputs A_log and dt_bias declared on the query/key heads H while g is on HV:
    the gate line reads both head counts, so the autograd path repeats the H-head inputs to HV on the host, the
    keyword inputs with them (its kernels would read past their [H] otherwise), and so does the reference."""
    text = (REPO_ROOT / "specs" / "gated_delta_rule.fla").read_text().replace("op gated_delta_rule", "op key_gate")
    for line in ("input A_log: [HV] if", "input dt_bias: [HV] = 0 if"):
        assert line in text
        text = text.replace(line, line.replace("[HV]", "[H]"))
    x, keywords, flags = _gdn_flag_case(1, 30, None, (16, 32), gate_in_kernel=True, seed=41)
    x["A_log"], x["dt_bias"] = x["A_log"][:H], x["dt_bias"][:H]
    with built_package(text, tmp_path, "key_gate") as (rec, pkg):
        assert rec.spec.input("A_log").heads is Heads.H
        assert_gradients_match_reference(getattr(pkg, f"{mode}_key_gate"), pkg.key_gate_reference, x, keywords,
                                         **flags)


@pytest.mark.parametrize("sms", [0, 1000])
@pytest.mark.parametrize("cu_seqlens", [None, [0, 63, 64, 64, 130]])
def test_gated_delta_rule_grouped_fused_and_split_forwards(sms, cu_seqlens, monkeypatch):
    """With the H100's plans the forward is fwd_fused off CUDA (0 SMs) and fwd_h + fwd_o as on a GPU with 1000
    SMs (launch.fused_walk_launch): both with grouped heads (w stored group-major, read with the q and k tiles'
    offsets) against the float64 reference, every gradient, over chunk boundaries and an empty sequence."""
    B, T = (2, 100) if cu_seqlens is None else (1, cu_seqlens[-1])
    x, keywords, flags = _gdn_flag_case(B, T, cu_seqlens, (32, 64) if cu_seqlens is None else (64, 32),
                                        gate_in_kernel=True, seed=37)
    launches = spy_on_launch(monkeypatch, "fused_walk_launch")
    pkg = generated("gated_delta_rule")
    with forced_arch("sm90"), launch.forced_sm_count(sms):
        assert_gradients_match_reference(pkg.chunk_gated_delta_rule, pkg.gated_delta_rule_reference, x, keywords,
                                         **flags)
    tiles = [bv for bv, _stages in launches]
    assert tiles and all((tile > 0) == (sms == 0) for tile in tiles), tiles


def _forbid_repeats(monkeypatch) -> None:
    """Make repeat_interleave of a float32 tensor fail: the ops under test run in fp32, while their float64
    reference repeats q and k over the groups itself (reference.py) and may."""
    tensor_repeat, repeat = torch.Tensor.repeat_interleave, torch.repeat_interleave

    def checked(real):
        def call(x, *args, **kwargs):
            if x.dtype == torch.float32:
                raise AssertionError("q or k was repeated to the value heads")
            return real(x, *args, **kwargs)
        return call

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", checked(tensor_repeat))
    monkeypatch.setattr(torch, "repeat_interleave", checked(repeat))


@pytest.mark.parametrize("cu_seqlens", [None, [0, 9, 40]])
def test_grouped_chunk_with_autograd_repeats_no_heads(cu_seqlens, monkeypatch):
    """Forward and backward of a grouped chunk_gated_delta_rule with every switch on: no repeat_interleave,
    both parts of the pass run (q, k on H heads; g, beta on HV), the kernels' per-value-head dq and dk are
    summed over the groups (launch.sum_groups), and the gradients still match the reference."""
    B, T = (2, 40) if cu_seqlens is None else (1, cu_seqlens[-1])
    x, keywords, flags = _gdn_flag_case(B, T, cu_seqlens, (16, 16), gate_in_kernel=True, seed=33)
    pkg = generated("gated_delta_rule")
    transforms = pkg.transforms
    ran = []
    for part in ("GatedDeltaRuleTransformsH", "GatedDeltaRuleTransformsHV"):
        real = getattr(transforms, part).apply
        monkeypatch.setattr(getattr(transforms, part), "apply",
                            lambda *a, real=real, part=part: (ran.append((part, a[4].shape)), real(*a))[1])
    summed = spy_on_launch(monkeypatch, "sum_groups")
    _forbid_repeats(monkeypatch)
    assert_gradients_match_reference(pkg.chunk_gated_delta_rule, pkg.gated_delta_rule_reference, x, keywords, **flags)
    assert ("GatedDeltaRuleTransformsH", x["q"].shape) in ran and ("GatedDeltaRuleTransformsHV", x["g"].shape) in ran
    assert [t.shape for t in summed] == [x["q"].shape, x["k"].shape]


@pytest.mark.parametrize(("l2norm", "cu_seqlens"), [(True, None), (False, [0, 13, 13, 84])])
def test_grouped_kda_chunk(l2norm, cu_seqlens, monkeypatch):
    """The per-channel rendering with grouped heads, q and k L2-normalized by the switch (or given unit-norm):
    outputs and every gradient against the float64 reference, with no repeat of q or k."""
    B, T = (2, 70) if cu_seqlens is None else (1, cu_seqlens[-1])
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    x = _raw_grouped_inputs(B, T, N, (16, 32), seed=35, channel_gate=True, gate_in_kernel=False)
    if not l2norm:
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    flags = {"use_qk_l2norm_in_kernel": l2norm, "use_beta_sigmoid_in_kernel": True,
             "cu_seqlens": None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)}
    _forbid_repeats(monkeypatch)
    kda = generated("kda")
    assert_gradients_match_reference(kda.chunk_kda, kda.kda_reference, x, (), **flags)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_grouped_kda_gate_in_kernel(mode, monkeypatch):
    """The gate computed in the kernel on the value heads: A_log [HV] and a flat dt_bias [HV * K] (fla's grouped
    layout) read by the pass's value-head kernels, q and k normalized by its key-head ones, no repeat: outputs and
    every gradient against the float64 reference."""
    x = _raw_grouped_inputs(1, 40, 1, (16, 32), seed=38, channel_gate=True, gate_in_kernel=True)
    gen = torch.Generator().manual_seed(39)
    x["A_log"] = torch.empty(HV).uniform_(1.0, 16.0, generator=gen).log()
    x["dt_bias"] = 0.5 * torch.randn(HV * 16, generator=gen) - 3.0
    flags = {"use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True, "use_beta_sigmoid_in_kernel": True}
    _forbid_repeats(monkeypatch)
    kda = generated("kda")
    assert_gradients_match_reference(getattr(kda, f"{mode}_kda"), kda.kda_reference, x, ("A_log", "dt_bias"), **flags)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_grouped_kda_gate_parameters_on_the_key_heads(mode, tmp_path):
    """A_log [H] and a flat dt_bias [H * K] on the query/key heads while g is on HV: the autograd path repeats them
    (dt_bias viewed as [H, K] first) with q and k to the value heads; every gradient takes the shape given."""
    text = (REPO_ROOT / "specs" / "kda.fla").read_text().replace("op kda", "op key_kda", 1)
    text = text.replace("input A_log: [HV] if", "input A_log: [H] if").replace("input dt_bias: [HV, K] = 0 if",
                                                                               "input dt_bias: [H, K] = 0 if")
    x = _raw_grouped_inputs(1, 30, 1, (16, 32), seed=42, channel_gate=True, gate_in_kernel=True)
    gen = torch.Generator().manual_seed(43)
    x["A_log"] = torch.empty(H).uniform_(1.0, 16.0, generator=gen).log()
    x["dt_bias"] = 0.5 * torch.randn(H * 16, generator=gen) - 3.0
    flags = {"use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True}
    with built_package(text, tmp_path, "key_kda") as (rec, pkg):
        assert rec.spec.input("dt_bias").heads is Heads.H
        assert_gradients_match_reference(getattr(pkg, f"{mode}_key_kda"), pkg.key_kda_reference, x,
                                         ("A_log", "dt_bias"), **flags)


def test_grouped_kda_chunk_strong_gates(monkeypatch):
    """Per-channel log gates down to -5 per token, whose span inside a 16-token sub-chunk passes fp32's DIAG_SPAN
    (30): fwd_A and bwd_dqk_intra rebuild their diagonal sub-chunks entry by entry, reading q and k at the
    key-side head (the logsigmoid(N(0, 1)) gates of test_grouped_kda_chunk never take that path)."""
    B, T = 1, 40
    x = _raw_grouped_inputs(B, T, B, (16, 32), seed=36, channel_gate=True, gate_in_kernel=False)
    x["g"] = -5.0 * torch.rand(x["g"].shape, generator=torch.Generator().manual_seed(37))
    flags = {"use_qk_l2norm_in_kernel": True, "use_beta_sigmoid_in_kernel": True, "cu_seqlens": None}
    _forbid_repeats(monkeypatch)
    kda = generated("kda")
    assert_gradients_match_reference(kda.chunk_kda, kda.kda_reference, x, (), **flags)


def _kda_flags(cu_seqlens: list[int] | None, l2norm: bool = True) -> dict:
    """fla's switches as a grouped KDA model would pass them (q and k normalized in the kernel, beta as logits)."""
    return {"use_qk_l2norm_in_kernel": l2norm, "use_beta_sigmoid_in_kernel": True,
            "cu_seqlens": None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)}


# T = 24 dense, and a varlen batch with an empty sequence: the backward's checkpoint segments (BT = 32 at these
# lengths) hold several sequences' states.
@pytest.mark.parametrize(("l2norm", "cu_seqlens"), [(True, None), (False, [0, 7, 7, 26])])
def test_grouped_kda_fused_recurrent(l2norm, cu_seqlens, monkeypatch):
    """fused_recurrent_kda with grouped heads under autograd (the transform pass, then the recurrent kernels):
    outputs and every gradient (dq, dk summed over each group) against the float64 reference, with no repeat
    of q or k."""
    B, T = (2, 24) if cu_seqlens is None else (1, cu_seqlens[-1])
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    x = _raw_grouped_inputs(B, T, N, (16, 32), seed=38, channel_gate=True, gate_in_kernel=False)
    if not l2norm:
        x["q"], x["k"] = F.normalize(x["q"], dim=-1), F.normalize(x["k"], dim=-1)
    _forbid_repeats(monkeypatch)
    kda = generated("kda")
    assert_gradients_match_reference(kda.fused_recurrent_kda, kda.kda_reference, x, (),
                                     **_kda_flags(cu_seqlens, l2norm))


@pytest.mark.parametrize(("B", "T", "cu_seqlens"), [(3, 1, None), (2, 5, None), (1, 7, [0, 1, 3, 3, 7])])
def test_grouped_kda_decode(B, T, cu_seqlens, monkeypatch):
    """fused_recurrent_kda without autograd, as a model decodes: from an initial state [N, HV, K, V], one token
    a sequence (T = 1) or a few, fla's switches applied inside the recurrent kernel where it loads q and k at
    their key-side head (the transform pass does not run); o and the final state against the float64 reference."""
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    x = _raw_grouped_inputs(B, T, N, (16, 32), seed=39, channel_gate=True, gate_in_kernel=False)
    flags = _kda_flags(cu_seqlens)
    kda = generated("kda")

    def no_pass(*args, **kwargs):
        raise AssertionError("the decode path ran the transform pass")

    monkeypatch.setattr(kda.fused_recurrent, "kda_transforms", no_pass)
    _forbid_repeats(monkeypatch)
    h0 = x.pop("initial_state")
    with torch.no_grad(), poisoned_allocations():
        o, ht = kda.fused_recurrent_kda(*x.values(), initial_state=h0, output_final_state=True, **flags)
    ref_o, ref_ht = kda.kda_reference(*(t.double() for t in x.values()), initial_state=h0.double(),
                                      output_final_state=True, **flags)
    assert o.shape == (B, T, HV, 32) and ht.shape == (N, HV, 16, 32)
    tol = TOLERANCE[torch.float32][0]
    assert relative_error(o, ref_o) < tol and relative_error(ht, ref_ht) < tol


@pytest.fixture(scope="module")
def ungrouped_kda(tmp_path_factory):
    """specs/kda.fla built with v, g, beta and the state on the H heads: the ungrouped kernels (no HK, no group
    offsets), as generated.kda was before it grouped value heads."""
    text = _ungrouped_spec("kda").replace("op kda", "op ungrouped_kda")
    with built_package(text, tmp_path_factory.mktemp("ungrouped_kda"), "ungrouped_kda") as (rec, pkg):
        assert not rec.spec.grouped
        yield pkg


@pytest.mark.parametrize(("mode", "cu_seqlens"), [("chunk", None), ("chunk", [0, 13, 13, 84]),
                                                  ("fused_recurrent", None), ("fused_recurrent", [0, 7, 7, 26])])
def test_grouped_kda_equals_ungrouped_op_on_repeated_qk(ungrouped_kda, mode, cu_seqlens):
    """The grouped op against a construction that shares none of its group addressing: the ungrouped build run on
    q and k repeated over their groups (value head hv on q/k head hv // (HV / H)), fla's switches on. o, the final
    state and the value-side gradients agree; dq and dk are the repeated inputs' gradients summed over each group
    (and not one value head's share)."""
    B, T = (2, 70 if mode == "chunk" else 24) if cu_seqlens is None else (1, cu_seqlens[-1])
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    x = _raw_grouped_inputs(B, T, N, (16, 32), seed=40, channel_gate=True, gate_in_kernel=False)
    flags = _kda_flags(cu_seqlens)
    with poisoned_allocations():
        o, ht, grads = grads_of(getattr(generated("kda"), f"{mode}_kda"),
                                {n: t.clone().requires_grad_(True) for n, t in x.items()}, (), **flags)
    repeated = {n: t.repeat_interleave(GROUPS, dim=2) if n in ("q", "k") else t.clone() for n, t in x.items()}
    with poisoned_allocations():
        o_u, ht_u, grads_u = grads_of(getattr(ungrouped_kda, f"{mode}_ungrouped_kda"),
                                      {n: t.requires_grad_(True) for n, t in repeated.items()}, (), **flags)
    assert o.shape == o_u.shape == (B, T, HV, 32)
    tol = 1e-5  # the same fp32 arithmetic in both, up to the order of a few sums
    errors = {"o": relative_error(o, o_u), "final_state": relative_error(ht, ht_u)}
    errors.update({f"d{n}": relative_error(grads[n], grads_u[n]) for n in ("v", "g", "beta", "initial_state")})
    for n in ("q", "k"):
        assert grads[n].shape == x[n].shape
        errors[f"d{n}"] = relative_error(grads[n], grads_u[n].view(B, T, H, GROUPS, -1).sum(3))
        assert relative_error(grads[n], grads_u[n][:, :, ::GROUPS]) > 1e-3
    assert all(e < tol for e in errors.values()), errors
