"""The forward as one walk that also writes the outputs (fwd_fused) in the scalar-gate family (linear_attn,
simple_gla), the channel-gate family (gla) and the delta family (delta_rule, gated_delta_rule, and the transforms
spec on its kernels): when the launcher takes it (launch.fused_walk_block_v, the planner's measured share of the
SMs), that it is the kernel that runs, and that both forwards (fwd_fused, and fwd_h + fwd_o) match the float64
reference with every gradient, dense and varlen, with initial and final states."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from fla_gen.lower import lower
from fla_gen.plan import plan_algorithm, plan_table, select_algorithms
from fla_gen.runtime import launch
from fla_gen.runtime.dispatch import forced_arch, overridden_plans
from fla_gen.sample import sample_inputs
from fla_gen.tuned import FUSED_WALK
from fla_gen.verify import compare_with_reference
from tests.support import compare_chunk_op, generated, poisoned_allocations, recurrence

UNGATED, GATED = (FUSED_WALK["sm90"][("chunk_scalar_gate", gated, 128)].min_sm_share for gated in (False, True))


@pytest.mark.parametrize(("block_v", "V", "walks", "sms", "share", "expected"), [
    # the measured cases on the H100's 132 SMs, without a gate: 4x4096x16x128 (128 programs at BV 64) ...
    (64, 128, 64, 132, UNGATED, 64),
    # ... 2x4096x16x128: 64 programs, under half the SMs, so BV 32 (128 programs) ...
    (64, 128, 32, 132, UNGATED, 32),
    # ... 1x16384x16x128: 64 programs even at BV 32: fwd_h + fwd_o
    (64, 128, 16, 132, UNGATED, 0),
    # with a gate: 4x4096x16x128 needs BV 32 for 256 programs (1.9 x 132 = 250.8); 8x2048x32x64 has them at 64
    (32, 128, 64, 132, GATED, 32),
    (64, 128, 64, 132, GATED, 32),
    (64, 64, 256, 132, GATED, 64),
    # 1x8192x32x128: 128 programs at BV 32 (measured slower fused): fwd_h + fwd_o
    (32, 128, 32, 132, GATED, 0),
    # a plan tile already below the floor stays; off CUDA (0 SMs) the plan's tile always runs
    (16, 256, 1, 132, UNGATED, 0),
    (64, 128, 1, 0, GATED, 64),
    # a target the kernel does not fit: never
    (64, 128, 1000, 0, None, 0),
])
def test_fused_walk_block_v(block_v, V, walks, sms, share, expected):
    assert launch.fused_walk_block_v(block_v, V, walks, sms, share) == expected


def _sm90_walk(op: str):
    rec = recurrence(op)
    return plan_algorithm(rec, select_algorithms(rec)[0], "sm90", "bf16", 128).config("fwd_fused")


# The packed batches measured on the H200 (h200-walk-packed), 16 heads: run.py's varlen preset (32 sequences
# of 256-8192 tokens: 2410 chunks, the longest 128), 8 sequences of 4096-16384 tokens (1284, the longest 250), and one
# of 16384 tokens with 31 of 256-1024 (565, the longest 256).
PRESET = launch.PackedWalks(2410 * 16, 128)
EIGHT_LONG = launch.PackedWalks(1284 * 16, 250)
ONE_LONG = launch.PackedWalks(565 * 16, 256)


@pytest.mark.parametrize(("op", "walks", "packed", "expected"), [
    # the measured cases on the H200's 132 SMs (fla_gen/measurements.py, h200-walk-two-per-sm), without a gate:
    # 1x16384x16x128 in 16 segments (256 walks, 512 programs at BV 64: at least 3 x 132) takes two per SM ...
    ("linear_attn", 256, None, (64, 2)),
    # ... 8x4096x16x128 (256 programs) and 4x4096x16x128 (128) keep the plan's one per SM ...
    ("linear_attn", 128, None, (64, 3)),
    ("linear_attn", 64, None, (64, 3)),
    # ... and so does every packed batch, balanced or not
    ("linear_attn", 512, PRESET, (64, 3)),
    ("linear_attn", 128, EIGHT_LONG, (64, 3)),
    # with a gate, 1x16384x16x128 in 16 segments (512 programs at BV 64) and 8x4096x16x128 (256: 1.9 x 132 = 250.8)
    # take two per SM; 4x4096x16x128 (128) keeps the plan's BV 32 (256 programs)
    ("simple_gla", 256, None, (64, 2)),
    ("simple_gla", 128, None, (64, 2)),
    ("simple_gla", 64, None, (32, 3)),
    # packed: the preset and the eight long sequences have more work per SM at BV 64 than their longest walk
    # (2 * 2410 * 16 / 132 = 584 against 128; 311 against 250) and take two per SM ...
    ("simple_gla", 512, PRESET, (64, 2)),
    ("simple_gla", 128, EIGHT_LONG, (64, 2)),
    # ... but not where the one long sequence bounds the call (137 against 256) ...
    ("simple_gla", 512, ONE_LONG, (32, 3)),
    # ... the work per SM equal to the longest walk takes it, one chunk step less does not ...
    ("simple_gla", 512, launch.PackedWalks(66 * 256, 256), (64, 2)),
    ("simple_gla", 512, launch.PackedWalks(66 * 256 - 1, 256), (32, 3)),
    # ... nor a call known only to be bounded by its longest walk (a traced one), on any grid ...
    ("simple_gla", 4096, launch.LONGEST_WALK_BOUND, (32, 3)),
    # ... and a packed grid below the share does not either (64 walks: 128 programs at BV 64)
    ("simple_gla", 64, PRESET, (32, 3)),
    # too few programs for either: fwd_h + fwd_o
    ("simple_gla", 16, None, (0, 0)),
    # the delta family has no two-per-SM launch
    ("gated_delta_rule", 512, None, (32, 2)),
    ("gated_delta_rule", 512, PRESET, (32, 2)),
])
def test_fused_walk_choice(op, walks, packed, expected):
    assert launch.fused_walk_choice(_sm90_walk(op), 128, walks, 132, packed) == expected


@pytest.mark.parametrize(("bounds", "expected"), [
    # 50 tokens: 1 chunk of 64; an empty sequence: none; 80: 2 -- 3 chunks over 2 heads, the longest 2
    ([0, 50, 50, 130], launch.PackedWalks(6, 2)),
    ([0, 64, 65], launch.PackedWalks(4, 1)),
    # no sequence at all
    ([0], launch.PackedWalks(0, 0)),
    # tracing: no values, no work known, the plan's launch (and no kernel runs)
    (None, launch.LONGEST_WALK_BOUND),
])
def test_packed_walks_of_a_call(bounds, expected):
    from fla_gen.runtime.torch_op import _packed_walks

    assert _packed_walks(None if bounds is None else torch.tensor(bounds), 64, 2) == expected


def test_fused_walk_choice_off_cuda_and_when_never_taken():
    """0 SMs (the interpreter, or a config pinned by a plan override): the plan's launch, dense or not; a config
    that is never taken stays so, two-per-SM launch or not."""
    cfg = _sm90_walk("simple_gla")
    assert launch.fused_walk_choice(cfg, 128, 4096, 0, None) == (32, 3)
    assert launch.fused_walk_choice(cfg, 128, 4096, 0, PRESET) == (32, 3)
    never = dataclasses.replace(cfg, min_sm_share=None)
    assert launch.fused_walk_choice(never, 128, 4096, 132, None) == (0, 0)


@pytest.mark.parametrize(("cu_seqlens", "sms", "expected"), [
    # dense, on one SM: every grid reaches the share
    (None, 1, (64, 2)),
    # packed on one SM: 3 chunk steps (1 + 0 + 2), two V tiles at BV 64, against a longest walk of 2 chunks
    ([0, 50, 50, 130], 1, (64, 2)),
    # packed on 3 SMs (3 walks, 6 programs at BV 64 >= 1.9 x 3): 2 x 9 chunk steps < 3 x 7, the longest walk's
    ([0, 400, 410, 420], 3, (32, 3)),
])
def test_op_takes_the_two_per_sm_launch_where_the_longest_walk_does_not_bound_the_call(monkeypatch, cu_seqlens, sms,
                                                                                      expected):
    """simple_gla at head dim 128 in fp16 under sm90's plans: the op launches the walk at the two-per-SM tile and
    stages for a dense call, and for a packed one whose work per SM at that tile is at least its longest walk, else at
    the plan's; every launch matches the float64 reference. (fp32's plans have no two-per-SM launch: two of its tiles
    do not fit one SM's shared memory.)"""
    from tests.support import spy_on_launch

    launches = spy_on_launch(monkeypatch, "fused_walk_launch")
    dims = (1 if cu_seqlens else 2, cu_seqlens[-1] if cu_seqlens else 130, 1, 128, 128)
    with forced_arch("sm90"), launch.forced_sm_count(sms):
        result = compare_chunk_op("simple_gla", dims, torch.float16, seed=3, cu_seqlens=cu_seqlens)
    assert not result.failures(), result.errors
    assert launches and set(launches) == {expected}, launches


@pytest.mark.parametrize("op", ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"])
def test_planned_fused_walk_never_takes_one_stage(op):
    """One stage with a gate is miscompiled on the H100 under Triton 3.6 (fla_gen/tuned.py FUSED_WALK): every
    fwd_fused planned for a measured target has 2 or more stages and the share measured for its algorithm, gate
    and head dim; it is never taken on the other targets, where FUSED_WALK says so, or where nothing fits (fp32)."""
    rec = recurrence(op)
    chunk, _ = select_algorithms(rec)
    gated = lower(rec).features.any_decay
    plans = plan_table(rec, chunk)
    assert plans
    for p in plans:
        cfg = p.config("fwd_fused")
        walk = FUSED_WALK.get(p.arch, {}).get((chunk.name, gated, p.head_dim))
        measured = walk is not None and walk.min_sm_share is not None
        if measured and p.dtype != "fp32":
            assert cfg.num_stages >= 2 and cfg.min_sm_share == walk.min_sm_share, (p.arch, p.dtype, p.head_dim, cfg)
        elif cfg.min_sm_share is not None:
            assert measured and cfg.num_stages >= 2, (p.arch, p.dtype, cfg)
    assert any(p.config("fwd_fused").min_sm_share for p in plans)


@pytest.mark.parametrize("op", ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"])
def test_fused_walk_keeps_every_plan_row(op):
    """fwd_fused never costs a target its plan: the plan table has the same (arch, dtype, head dim) rows with and
    without the kernel (where it does not fit, it is planned as never taken)."""
    rec = recurrence(op)
    chunk, _ = select_algorithms(rec)
    split_only = dataclasses.replace(chunk, kernels=tuple(k for k in chunk.kernels if k.stage != "fwd_fused"))
    rows = {(p.arch, p.dtype, p.head_dim) for p in plan_table(rec, chunk)}
    assert rows == {(p.arch, p.dtype, p.head_dim) for p in plan_table(rec, split_only)}


def test_planned_fused_walk_tiles_on_the_h100():
    """The measured sm90 bf16 configs (fla_gen/tuned.py FUSED_WALK) come out of the planner unchanged."""
    for op, expected, two_per_sm in (("linear_attn", (64, 4, 3), (64, 2, 3.0)),
                                     ("simple_gla", (32, 4, 3), (64, 2, 1.9)),
                                     ("delta_rule", (64, 4, 3), None), ("gated_delta_rule", (32, 4, 2), None)):
        cfg = _sm90_walk(op)
        assert (cfg.block_v, cfg.num_warps, cfg.num_stages) == expected, (op, cfg)
        assert cfg.two_per_sm == two_per_sm, (op, cfg)


class KernelLog:
    """Names of the kernels a generated package's chunk module launches, once watched."""

    def __init__(self, monkeypatch):
        self.monkeypatch, self.names = monkeypatch, []

    def watch(self, package: str) -> None:
        module = generated(package).chunk
        for attr in [a for a in vars(module) if a.endswith("_kernel")]:
            self.monkeypatch.setattr(module, attr, _Recorder(getattr(module, attr), attr, self.names))

    def take(self) -> set[str]:
        """The names launched since the last take."""
        names = set(self.names)
        self.names.clear()
        return names


class _Recorder:
    def __init__(self, kernel, name: str, names: list[str]):
        self.kernel, self.name, self.names = kernel, name, names

    def __getitem__(self, grid):
        self.names.append(self.name)
        return self.kernel[grid]


@pytest.fixture
def launched(monkeypatch) -> KernelLog:
    return KernelLog(monkeypatch)


def run_forward(package: str, op: str, sms: int, overrides: dict | None = None) -> None:
    pkg, rec = generated(package), recurrence(package)
    x = sample_inputs(rec, 2, 70, 2, 32, 32, torch.float32, seed=11)
    with forced_arch("sm90"), launch.forced_sm_count(sms), overridden_plans(overrides or {}):
        getattr(pkg, f"chunk_{op}")(*x.values())


def test_sm80_plans_keep_the_split_forward(launched):
    """On a target without a FUSED_WALK table (the interpreter's default, sm80) fwd_fused never runs."""
    launched.watch("simple_gla")
    pkg, rec = generated("simple_gla"), recurrence("simple_gla")
    pkg.chunk_simple_gla(*sample_inputs(rec, 2, 70, 2, 32, 32, torch.float32, seed=12).values())
    assert "simple_gla_fwd_fused_kernel" not in launched.take()


@pytest.mark.parametrize("package", ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"])
def test_the_launcher_picks_the_forward_by_grid(launched, package):
    """With the H100's plans: off CUDA (0 SMs) the forward is fwd_fused alone; as on a GPU with 1000 SMs (a
    2-sequence, 2-head grid far below any share of them) it is fwd_h + fwd_o; a plan override pinning
    fwd_fused runs it whatever the grid, and one pinning fwd_o (an experiment on the split forward) runs the
    split forward whatever the grid."""
    launched.watch(package)
    run_forward(package, package, 0)
    fused = launched.take()
    run_forward(package, package, 1000)
    split = launched.take()
    run_forward(package, package, 1000, {"fwd_fused": {"block_v": 32}})
    pinned = launched.take()
    run_forward(package, package, 0, {"fwd_o": {"num_warps": 8}})
    split_pinned = launched.take()
    name = f"{package}_fwd_fused_kernel"
    assert name in fused and not fused & {f"{package}_fwd_h_kernel", f"{package}_fwd_o_kernel"}, fused
    assert name not in split and {f"{package}_fwd_h_kernel", f"{package}_fwd_o_kernel"} <= split, split
    assert name in pinned and f"{package}_fwd_o_kernel" not in pinned, pinned
    assert name not in split_pinned and f"{package}_fwd_o_kernel" in split_pinned, split_pinned


@pytest.mark.parametrize("sms", [0, 1000])
@pytest.mark.parametrize(("package", "cu_seqlens"), [
    ("linear_attn", None),
    ("linear_attn", [0, 50, 50, 130]),
    ("simple_gla", None),
    ("simple_gla", [0, 63, 64, 64, 130]),
    ("gla", None),
    ("gla", [0, 63, 64, 64, 130]),
    ("delta_rule", None),
    ("delta_rule", [0, 50, 50, 130]),
    ("gated_delta_rule", None),
    ("gated_delta_rule", [0, 63, 64, 64, 130]),
    ("gated_delta_rule_rope", [0, 63, 64, 64, 130]),
])
def test_both_forwards_match_the_reference(launched, package, cu_seqlens, sms):
    """With the H100's plans, fwd_fused (0 SMs) and fwd_h + fwd_o (1000 SMs) against the float64 reference:
    outputs, final states and every gradient, with an initial state, over chunk-boundary lengths and an empty
    sequence, outputs poisoned; the forward that ran is the one named."""
    launched.watch(package)
    dims = (1, 130, 2, 64, 32) if cu_seqlens else (2, 100, 2, 32, 64)
    with forced_arch("sm90"), launch.forced_sm_count(sms):
        result = compare_chunk_op(package, dims, torch.float32, seed=13, cu_seqlens=cu_seqlens)
    assert not result.failures(), result.errors
    names = launched.take()
    assert (f"{package}_fwd_fused_kernel" in names) == (sms == 0), names
    assert (f"{package}_fwd_o_kernel" in names) == (sms != 0), names


@pytest.mark.parametrize("reads_inverse", [False, True], ids=["from_w_u", "from_inverse"])
@pytest.mark.parametrize(("package", "cu_seqlens"), [
    ("delta_rule", None),
    ("delta_rule", [0, 50, 50, 130]),
    ("gated_delta_rule", None),
    ("gated_delta_rule", [0, 63, 64, 64, 130]),
])
def test_delta_walk_reads_w_u_or_the_inverse(launched, package, cu_seqlens, reads_inverse):
    """The delta family's fwd_fused either way (LaunchConfig.reads_inverse, forced by a plan override): from
    fwd_wu's W and U, or building v_new from fwd_solve's inverse, when the forward runs no fwd_wu. Against the
    float64 reference with every gradient (the backward runs fwd_wu either way), outputs poisoned."""
    launched.watch(package)
    override = {"fwd_fused": {"reads_inverse": reads_inverse}}
    run_forward(package, package, 0, override)
    forward = launched.take()
    assert f"{package}_fwd_fused_kernel" in forward
    assert (f"{package}_fwd_wu_kernel" in forward) != reads_inverse, forward
    dims = (1, 130, 2, 64, 32) if cu_seqlens else (2, 100, 2, 32, 64)
    with forced_arch("sm90"), launch.forced_sm_count(0), overridden_plans(override):
        result = compare_chunk_op(package, dims, torch.float32, seed=19, cu_seqlens=cu_seqlens)
    assert not result.failures(), result.errors


def test_planned_walk_reads_the_inverse_where_measured():
    """sm90's delta plans build v_new from the inverse in the walk at head dim 64, where it measured faster at
    every group size; the gated delta rule's at head dim 128 too, but only with grouped value heads (HV >= 2H),
    where it measured faster and W and U slower; W and U otherwise (fla_gen/tuned.py FUSED_WALK, measurements
    h200-delta-walk-inverse and h200-gated-delta-walk-inverse-128)."""
    expected = {"delta_rule": {64: 1, 128: None, 256: None}, "gated_delta_rule": {64: 1, 128: 2, 256: None}}
    for op, by_head_dim in expected.items():
        rec = recurrence(op)
        chunk = select_algorithms(rec)[0]
        for hd, min_group in by_head_dim.items():
            cfg = plan_algorithm(rec, chunk, "sm90", "bf16", hd).config("fwd_fused")
            reads = [group for group in (1, 2, 4) if launch.walk_reads_inverse(cfg, group)]
            assert reads == ([] if min_group is None else [g for g in (1, 2, 4) if g >= min_group]), (op, hd, reads)


@pytest.mark.parametrize("HV", [2, 4], ids=["ungrouped", "grouped"])
def test_walk_at_head_dim_128_reads_the_inverse_with_grouped_heads(launched, HV):
    """The gated delta rule's own sm90 plan at head dim 128, the walk always taken (0 SMs): with one value head
    per key head the forward runs fwd_wu and the walk reads W and U; with two, fwd_wu does not run in the forward
    and the walk reads the inverse. Both against the float64 reference with every gradient, outputs poisoned."""
    H, K, V = 2, 128, 128
    package = "gated_delta_rule"
    launched.watch(package)
    pkg, rec = generated(package), recurrence(package)
    x = sample_inputs(rec, 1, 80, H, K, V, torch.float32, seed=23, HV=HV)
    with forced_arch("sm90"), launch.forced_sm_count(0):
        pkg.chunk_gated_delta_rule(*x.values())
        forward = launched.take()
        result = compare_with_reference(pkg.chunk_gated_delta_rule, pkg.gated_delta_rule_reference,
                                        {**x, "initial_state": torch.randn(1, HV, K, V)}, torch.float32,
                                        name="chunk_gated_delta_rule", guard=poisoned_allocations)
    assert f"{package}_fwd_fused_kernel" in forward, forward
    assert (f"{package}_fwd_wu_kernel" in forward) == (HV == H), forward
    assert not result.failures(), result.errors


@pytest.mark.parametrize("package", ["simple_gla", "gla", "gated_delta_rule"])
def test_fused_forward_in_fp16(launched, package):
    """fwd_fused in fp16 (the state and v_new rounded to the input dtype before their dots, as fwd_h stores
    them) against the float64 reference, with the H100's plans, outputs poisoned."""
    launched.watch(package)
    with forced_arch("sm90"), launch.forced_sm_count(0):
        result = compare_chunk_op(package, (2, 100, 2, 32, 64), torch.float16, seed=17)
    assert not result.failures(), result.errors
    assert f"{package}_fwd_fused_kernel" in launched.take()


def test_gla_walk_with_strong_gates(launched):
    """gla's walk (sm90's plan at head dim 64, 0 SMs: always taken) with per-channel log gates from
    logsigmoid(N(0, 1)) / 4 down to x 40, so a chunk's gate sums reach ~ -2000: its exponents G and G_L - G
    stay <= 0 however strong the gates. Against the float64 reference with every gradient, varlen with empty
    sequences, outputs poisoned."""
    launched.watch("gla")
    pkg, rec = generated("gla"), recurrence("gla")
    B, T, H, K, V = 1, 150, 2, 64, 40
    cu_seqlens = [0, 0, 70, 70, 150]
    x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=21)
    strength = torch.logspace(math.log10(0.25), math.log10(40.0), K)
    x["g"] = F.logsigmoid(torch.randn(B, T, H, K, generator=torch.Generator().manual_seed(22))) * strength
    state = torch.randn(len(cu_seqlens) - 1, H, K, V)
    with forced_arch("sm90"), launch.forced_sm_count(0):
        result = compare_with_reference(pkg.chunk_gla, pkg.gla_reference, {**x, "initial_state": state},
                                        torch.float32, name="chunk_gla", guard=poisoned_allocations,
                                        cu_seqlens=torch.tensor(cu_seqlens, dtype=torch.int32))
    assert not result.failures(), result.errors
    assert "gla_fwd_fused_kernel" in launched.take()
