"""Per-token transforms (``transform`` lines) and RoPE, in Triton's interpreter.

The fused ops against the reference derived from the same spec, in float64 (forward, final state and
the gradient of every input, A_log and dt_bias included); the fused op against "transform in torch,
then the plain op"; the standalone rotary_embedding against fla's table formula (written out here);
and the validation of rotary dims and offsets. Sizes are small: the interpreter runs every kernel.
"""

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import emit_package
from fla_gen.parse import parse_spec
from fla_gen.runtime import launch
from fla_gen.runtime.launch import row_tile
from fla_gen.runtime.rotary import rope_reference, rotary_embedding, rotary_tables
from fla_gen.sample import relative_error, sample_inputs
from fla_gen.verify import TOLERANCE, compare_with_reference, verify_op
from fla_gen.write import write_files
from tests.support import REPO_ROOT, generated, poisoned_allocations, recurrence

OP = "gated_delta_rule_rope"


def assert_matches_reference(fn, ref_fn, inputs: dict, dtype=torch.float32, **kwargs) -> None:
    """fn on ``inputs`` cast to ``dtype`` against ref_fn in float64 (o, final state, the gradient of every
    input), within dtype's tolerance."""
    result = compare_with_reference(fn, ref_fn, {n: x.to(dtype) for n, x in inputs.items()}, dtype,
                                    name=fn.__name__, guard=poisoned_allocations, **kwargs)
    assert not result.failures(), f"over tolerance {result.failures()} (all {result.errors})"


def raw_inputs(B, T, H, K, V, seed=0) -> dict:
    """Raw (pre-transform) inputs: q, k unnormalized; beta and g any real; A_log, dt_bias per head."""
    return sample_inputs(recurrence(OP), B, T, H, K, V, torch.float32, seed=seed)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_fused_op_matches_reference(mode):
    result = verify_op(generated(OP), recurrence(OP), mode, torch.float32, B=2, T=24, H=2, K=16, V=8,
                       guard=poisoned_allocations)
    assert not result.failures(), result.errors


def test_varlen_per_sequence_offsets_match_reference():
    pkg = generated(OP)
    cu = torch.tensor([0, 7, 7, 30], dtype=torch.int32)
    offsets = torch.tensor([3, 0, 11])
    assert_matches_reference(pkg.chunk_gated_delta_rule_rope, pkg.gated_delta_rule_rope_reference,
                             raw_inputs(1, 30, 2, 16, 8), cu_seqlens=cu, seqlen_offsets=offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_partial_last_tile_and_padded_head_dim(dtype):
    """The transform kernels hold BR flat (token, head) rows per program: B * T * H = 39 rows make two
    tiles, the second partial, and K = 48 (full rotary) is padded to 64 channels."""
    B, T, H, K, V = 1, 13, 3, 48, 8
    for direction in ("fwd", "bwd"):
        BR, _ = row_tile(B * T * H, 64, direction)
        assert B * T * H > BR and B * T * H % BR
    pkg = generated(OP)
    assert_matches_reference(pkg.fused_recurrent_gated_delta_rule_rope, pkg.gated_delta_rule_rope_reference,
                             raw_inputs(B, T, H, K, V, seed=3), dtype=dtype, seqlen_offsets=3)


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_tile_of_one_token_shares_rotary_angles(mode, monkeypatch):
    """When H % BR == 0 a tile's rows are the heads of one token and its rotary angles are computed once
    per channel (SAME_TOKEN); varlen with per-sequence offsets, so neighbouring tiles differ in position."""
    monkeypatch.setattr(launch, "ROW_TILE_ELEMENTS", {"fwd": 64, "bwd": 64})
    B, T, H, K, V = 1, 30, 4, 16, 8
    for direction in ("fwd", "bwd"):
        BR, _ = row_tile(B * T * H, K, direction)
        assert BR == 2 * 2 and H % BR == 0
    pkg = generated(OP)
    assert_matches_reference(getattr(pkg, f"{mode}_gated_delta_rule_rope"), pkg.gated_delta_rule_rope_reference,
                             raw_inputs(B, T, H, K, V, seed=5), cu_seqlens=torch.tensor([0, 11, 30], dtype=torch.int32),
                             seqlen_offsets=torch.tensor([5, 17]))


def test_int_offset_matches_reference():
    pkg = generated(OP)
    assert_matches_reference(pkg.fused_recurrent_gated_delta_rule_rope, pkg.gated_delta_rule_rope_reference,
                             raw_inputs(2, 12, 2, 16, 8), seqlen_offsets=40)


def test_decode_path_applies_transforms_on_load(monkeypatch):
    """Without autograd, fused_recurrent runs the transforms inside its kernel (the transform kernels must
    not run), with per-sequence offsets under cu_seqlens and an initial state, as a decode step does."""
    pkg = generated(OP)
    module = importlib.import_module(f"generated.{OP}.fused_recurrent")

    def refuse(*args, **kwargs):
        raise AssertionError("the transform kernels ran on the no-autograd path")

    monkeypatch.setattr(module, f"{OP}_transforms", refuse)
    x = raw_inputs(1, 20, 2, 16, 8)
    kw = {"cu_seqlens": torch.tensor([0, 8, 20], dtype=torch.int32), "seqlen_offsets": torch.tensor([4, 9])}
    h0 = torch.randn(2, 2, 16, 8)
    with torch.no_grad(), poisoned_allocations():
        o, ht = pkg.fused_recurrent_gated_delta_rule_rope(*x.values(), initial_state=h0, output_final_state=True, **kw)
    ro, rht = pkg.gated_delta_rule_rope_reference(*[t.double() for t in x.values()], initial_state=h0.double(),
                                                  output_final_state=True, **kw)
    assert relative_error(o, ro) < 1e-5 and relative_error(ht, rht) < 1e-5


def test_fp16_inputs_with_fp32_gate_parameters():
    """Models keep g, A_log and dt_bias in float32 next to 16-bit q, k, v, beta: accepted, and right."""
    x = raw_inputs(1, 10, 2, 16, 8)
    half = {n: t if n in ("g", "A_log", "dt_bias") else t.half() for n, t in x.items()}
    with torch.no_grad(), poisoned_allocations():
        o, _ = generated(OP).fused_recurrent_gated_delta_rule_rope(*half.values())
    ro, _ = generated(OP).gated_delta_rule_rope_reference(*[t.double() for t in half.values()])
    assert o.dtype == torch.float16 and relative_error(o, ro) < TOLERANCE[torch.float16][0]


def test_fused_equals_torch_transforms_then_plain_op():
    """chunk_gated_delta_rule_rope == torch rope / l2norm / sigmoid / gate, then chunk_gated_delta_rule."""
    x = raw_inputs(2, 20, 2, 16, 8)
    fused_leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    plain_leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    o1, h1 = generated(OP).chunk_gated_delta_rule_rope(*fused_leaves.values(), output_final_state=True,
                                                       seqlen_offsets=5)
    q, k, v, g, beta, A_log, dt_bias = plain_leaves.values()
    pos = torch.arange(20)[None, :].expand(2, 20) + 5
    q, k = (F.normalize(rope_reference(t, pos, 16, 10000.0, False), dim=-1, eps=0) for t in (q, k))
    g = -A_log.exp() * F.softplus(g + dt_bias)
    o2, h2 = generated("gated_delta_rule").chunk_gated_delta_rule(q, k, v, g, beta.sigmoid(), output_final_state=True)
    do, dh = torch.randn_like(o1), torch.randn_like(h1)
    g1 = torch.autograd.grad((o1 * do).sum() + (h1 * dh).sum(), list(fused_leaves.values()))
    g2 = torch.autograd.grad((o2 * do).sum() + (h2 * dh).sum(), list(plain_leaves.values()))
    assert relative_error(o1, o2) < 1e-4 and relative_error(h1, h2) < 1e-4
    for name, a, b in zip(x, g1, g2, strict=True):
        assert relative_error(a, b) < 1e-4, name


ORDER_SPEC = """op order_probe
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
state S: [K, V]
transform q, k = rope(q, k, style=neox, rotary_dim=K, base=10000)
{between}
transform q = l2norm(q)
transform k = {k_norm}
update S = S + outer(k, v)
output o = S^T @ q
"""


@pytest.mark.parametrize(("between", "k_norm", "order"), [
    # both norms move ahead of the rope they follow (l2norm(rope(x)) = rope(l2norm(x)))
    ("", "l2norm(k)", ["l2norm q", "l2norm k", "rope q,k"]),
    # a line touching q between the rope and q's norm keeps q's norm in place; k's norm still moves
    ("transform q = q * 2.0", "l2norm(k)", ["l2norm k", "rope q,k", "map q", "l2norm q"]),
    # the norm of a feature map of k is not a norm of k itself: it stays
    ("", "l2norm(elu(k) + 1)", ["l2norm q", "rope q,k", "map k"]),
])
def test_norms_move_ahead_of_rotations_only_when_exact(between, k_norm, order):
    from fla_gen.transforms import _own_l2norm, norms_before_rotations

    rec = canonicalize(check_spec(parse_spec(ORDER_SPEC.format(between=between, k_norm=k_norm), "order_probe.fla")))
    lowered = norms_before_rotations(rec.spec.transforms)
    assert [("l2norm " if _own_l2norm(t) else f"{t.kind} ") + ",".join(t.targets) for t in lowered] == order


def test_norm_after_partial_interleaved_rope_matches_reference(tmp_path):
    """The backward lowers l2norm ahead of the rope it follows; with a partial interleaved rotary (the tail
    passes through) that is still exact: gradients against the reference, which keeps the spec's order."""
    text = ORDER_SPEC.replace("style=neox, rotary_dim=K", "style=interleaved, rotary_dim=K / 2")
    rec = canonicalize(check_spec(parse_spec(text.format(between="", k_norm="l2norm(k)"), "order_probe.fla")))
    write_files(emit_package(rec), tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        pkg = importlib.import_module("order_probe")
        x = sample_inputs(rec, 1, 21, 2, 24, 8, torch.float32, seed=4)
        kw = {"cu_seqlens": torch.tensor([0, 9, 21], dtype=torch.int32), "seqlen_offsets": torch.tensor([3, 30])}
        for mode in ("chunk", "fused_recurrent"):
            assert_matches_reference(getattr(pkg, f"{mode}_order_probe"), pkg.order_probe_reference, x, **kw)
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("order_probe")]:
            del sys.modules[name]


# A spec of another family (gated, no rank-1 term) with interleaved partial rotary, a feature map and a
# parameterised gate: the transforms are the DSL's, not one spec's.
VARIANT = """op rope_variant
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H]
input dt_bias: [H]
state S: [K, V]
param scale = K ** -0.5
transform q, k = rope(q, k, style=interleaved, rotary_dim=K / 2, base=500)
transform k = elu(k) + 1
transform q = silu(q)
transform g = -softplus(g + dt_bias)
update S = exp(g) * S + outer(k, v)
output o = scale * S^T @ q
"""


@pytest.fixture(scope="module")
def variant(tmp_path_factory):
    rec = canonicalize(check_spec(parse_spec(VARIANT, "rope_variant.fla")))
    root = tmp_path_factory.mktemp("variant")
    write_files(emit_package(rec), root)
    sys.path.insert(0, str(root))
    try:
        yield rec, importlib.import_module("rope_variant")
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m.startswith("rope_variant")]:
            del sys.modules[name]


@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
def test_interleaved_partial_rotary_other_family(variant, mode):
    rec, pkg = variant
    # K = 24: the head dim padded to 32, rotary_dim 12
    x = sample_inputs(rec, 1, 21, 2, 24, 8, torch.float32)
    kw = {"cu_seqlens": torch.tensor([0, 9, 21], dtype=torch.int32), "seqlen_offsets": torch.tensor([2, 7])}
    assert_matches_reference(getattr(pkg, f"{mode}_rope_variant"), pkg.rope_variant_reference, x, **kw)


def test_variant_decode_path_applies_transforms_on_load(variant, monkeypatch):
    """The gated family's fused_recurrent inlines the transforms too (no autograd)."""
    rec, pkg = variant
    monkeypatch.setattr(sys.modules["rope_variant.fused_recurrent"], "rope_variant_transforms", None)
    x = sample_inputs(rec, 2, 9, 2, 16, 8, torch.float32)
    h0 = torch.randn(2, 2, 16, 8)
    with torch.no_grad(), poisoned_allocations():
        o, ht = pkg.fused_recurrent_rope_variant(*x.values(), initial_state=h0, output_final_state=True,
                                                 seqlen_offsets=6)
    ro, rht = pkg.rope_variant_reference(*[t.double() for t in x.values()], initial_state=h0.double(),
                                         output_final_state=True, seqlen_offsets=6)
    assert relative_error(o, ro) < 1e-5 and relative_error(ht, rht) < 1e-5


VARIANT_AOT_CALL = """
import torch
from fla_gen.runtime.dispatch import forced_arch
from rope_variant import fused_recurrent_rope_variant
from rope_variant.transforms import RopeVariantTransforms


def launches():
    B, T, H, K = 2, 64, 2, 128
    q, k = (torch.randn(B, T, H, K, dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    v = torch.randn(B, T, H, K, dtype=torch.bfloat16)
    g, dt_bias = torch.randn(B, T, H, requires_grad=True), torch.randn(H, requires_grad=True)
    outs = RopeVariantTransforms.apply(torch.arange(B * T, dtype=torch.int32), (K // 2,), (K, K), q, k, g, dt_bias)
    torch.autograd.grad(sum(o.float().sum() for o in outs), [q, k, g, dt_bias])
    with torch.no_grad(), forced_arch("sm90"):  # the decode path: transforms inline in the recurrent kernel
        fused_recurrent_rope_variant(q, k, v, g, dt_bias)
"""


def test_variant_transform_kernels_compile_ahead_of_time(variant, tmp_path):
    """The interleaved rope (partner o ^ 1 via tl.gather) and the feature maps, in the transform kernels
    and inlined in the recurrent forward, compile for every target; the transform kernels do not spill.
    (The specs' own ops, gated_delta_rule_rope included, are in tests/aot/test_aot_matrix.py.)"""
    (tmp_path / "variant_aot_call.py").write_text(textwrap.dedent(VARIANT_AOT_CALL))
    out = tmp_path / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(variant[1].__file__).parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root), str(REPO_ROOT), env.get("PYTHONPATH", "")])
    env["TRITON_CACHE_DIR"] = str(tmp_path / "triton-cache")
    proc = subprocess.run(
        [sys.executable, "-m", "fla_gen.aot", "--call", "variant_aot_call:launches", "--json", str(out), "--jobs", "2"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    console = proc.stdout + proc.stderr
    assert proc.returncode == 0 and out.exists(), console
    reports = json.loads(out.read_text())["reports"]
    stages = ("transform_fwd", "transform_bwd", "recurrent_fwd")
    assert {(r["kernel"], r["cap"]) for r in reports} == {
        (f"rope_variant_{s}_kernel", c) for s in stages for c in (80, 89, 90, 100)}, console
    for r in reports:
        assert r["error"] is None and not r["problems"], r
        if "transform" in r["kernel"]:
            assert r["spill_stores"] in (0, None) and r["spill_loads"] in (0, None), console
    print(console)


def test_variant_odd_rotary_dim_is_refused(variant):
    _, pkg = variant
    # rotary_dim = K / 2 = 5 for K = 10: odd.
    x = sample_inputs(variant[0], 1, 4, 1, 10, 4, torch.float32)
    with pytest.raises(ValueError, match="rotary_dim = 5 must be even"):
        pkg.chunk_rope_variant(*x.values())


# ----------------------------------------------------------------------------- validation


def test_odd_head_dim_for_full_rotary_is_refused():
    x = raw_inputs(1, 4, 1, 15, 4)
    with pytest.raises(ValueError, match="rotary_dim = 15 must be even"):
        generated(OP).chunk_gated_delta_rule_rope(*x.values())


@pytest.mark.parametrize(("offsets", "error", "words"), [
    (2**24, ValueError, "past 2\\*\\*24 positions"),
    (-1, ValueError, "must be >= 0"),
    (torch.tensor([1, 2, 3]), ValueError, "one per sequence"),
    (torch.tensor([1.0, 2.0]), TypeError, "int32 or int64"),
    (1.5, TypeError, "seqlen_offsets must be an int"),
])
def test_bad_offsets_are_refused(offsets, error, words):
    x = raw_inputs(2, 4, 1, 8, 4)
    with pytest.raises(error, match=words):
        generated(OP).fused_recurrent_gated_delta_rule_rope(*x.values(), seqlen_offsets=offsets)


# ----------------------------------------------------------------------------- standalone rotary_embedding


def table_rope(x, cos, sin, interleaved, positions):
    """fla's formula: x * cos + rotate_half(x) * sin on the first R channels, tables gathered by position."""
    R = cos.shape[-1] * 2
    c, s = cos[positions][:, :, None], sin[positions][:, :, None]  # [B, T, 1, R/2]
    if interleaved:
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        x1, x2 = x[..., :R:2], x[..., 1:R:2]
        rot = torch.stack((-x2, x1), -1).flatten(-2)
    else:
        c, s = torch.cat((c, c), -1), torch.cat((s, s), -1)
        x1, x2 = x[..., : R // 2], x[..., R // 2:R]
        rot = torch.cat((-x2, x1), -1)
    return torch.cat((x[..., :R] * c + rot * s, x[..., R:]), -1)


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "interleaved"])
def test_rotary_embedding_matches_table_formula(interleaved):
    B, T, H, D, R = 2, 9, 3, 24, 16
    cos, sin = rotary_tables(R, 64, head_dim=D, dtype=torch.float64)
    x = torch.randn(B, T, H, D, dtype=torch.float64)
    offsets = torch.tensor([0, 30])
    pos = torch.arange(T)[None, :] + offsets[:, None]
    xf = x.float().requires_grad_(True)
    with poisoned_allocations():
        y = rotary_embedding(xf, cos.float(), sin.float(), interleaved=interleaved, seqlen_offsets=offsets)
    xr = x.clone().requires_grad_(True)
    yr = table_rope(xr, cos, sin, interleaved, pos)
    dy = torch.randn_like(yr)
    (dx,) = torch.autograd.grad(y, xf, dy.float())
    (dxr,) = torch.autograd.grad(yr, xr, dy)
    assert relative_error(y, yr) < 1e-6 and relative_error(dx, dxr) < 1e-6
    # The derived reference (angles from positions, no table) agrees with the table formula.
    assert relative_error(rope_reference(x, pos, R, 10000.0, interleaved), yr) < 1e-12


def test_rotary_embedding_varlen_restarts_positions():
    cu = torch.tensor([0, 5, 5, 12])
    cos, sin = rotary_tables(8, 32)
    x = torch.randn(1, 12, 2, 8)
    with poisoned_allocations():  # an element the kernel leaves unwritten is NaN
        y = rotary_embedding(x, cos, sin, seqlen_offsets=3, cu_seqlens=cu)
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None, :] + 3
    assert relative_error(y, table_rope(x, cos, sin, False, pos)) < 1e-6


def test_rotary_embedding_validation():
    x = torch.randn(1, 8, 2, 64)
    cos, sin = rotary_tables(128, 16)  # built from a model dim of 128, not the head dim 64
    with pytest.raises(ValueError, match="larger than the head dim"):
        rotary_embedding(x, cos, sin)
    with pytest.raises(ValueError, match="larger than head_dim"):
        rotary_tables(128, 16, head_dim=64)
    with pytest.raises(ValueError, match="must be even"):
        rotary_tables(7, 16)
    cos, sin = rotary_tables(64, 16)
    with pytest.raises(ValueError, match="past the cos/sin table"):
        rotary_embedding(x, cos, sin, seqlen_offsets=9)
    with pytest.raises(ValueError, match="past the cos/sin table"):
        rotary_embedding(torch.randn(1, 8, 2, 64), cos, sin, seqlen_offsets=torch.tensor([0, 12]),
                         cu_seqlens=torch.tensor([0, 3, 8]))
    with pytest.raises(ValueError, match="one shape"):
        rotary_embedding(x, cos, sin[:, :4])


# A per-head vector [H, K] read by an unguarded transform of a per-channel gate, in a gated spec without a rank-1
# term: the pass loads the K channels of each row's head (K = 12, padded to 16: the load is masked like the row's).
CHANNEL_BIAS = """op channel_bias
input q: [B, T, H, K]
input k: [B, T, H, K]
input v: [B, T, H, V]
input g: [B, T, H, K]
input bias: [H, K]
state S: [K, V]
transform k = l2norm(k)
transform g = -softplus(g + bias)
update S = exp(g) * S + outer(k, v)
output o = S^T @ q
"""


def test_per_head_vector_of_an_unguarded_transform_matches_reference(tmp_path, monkeypatch):
    """Both ops (autograd: the pass, bias's gradient from its [rows, K] partials) and the decode path without
    autograd (the recurrent kernel loads bias's channels itself) against the float64 reference."""
    from tests.support import built_package

    with built_package(CHANNEL_BIAS, tmp_path, "channel_bias") as (rec, pkg):
        for mode in ("chunk", "fused_recurrent"):
            result = verify_op(pkg, rec, mode, torch.float32, B=2, T=21, H=2, K=12, V=8, guard=poisoned_allocations)
            assert not result.failures(), (mode, result.errors)
        monkeypatch.setattr(pkg.fused_recurrent, "channel_bias_transforms",
                            lambda *a, **k: pytest.fail("the pass ran on the decode path"))
        x = sample_inputs(rec, 2, 9, 2, 12, 8, torch.float32, seed=3)
        with torch.no_grad(), poisoned_allocations():
            o, _ = pkg.fused_recurrent_channel_bias(*x.values())
        o_ref, _ = pkg.channel_bias_reference(*(t.double() for t in x.values()))
        assert relative_error(o, o_ref) <= TOLERANCE[torch.float32][0]
