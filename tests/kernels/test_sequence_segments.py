"""Sequence segments (fla_gen/runtime/segments.py): the rule that picks the segment length, the tables the
segment-mode walks index, and the chunk ops computed over segments in the interpreter against the float64
reference (outputs, final state and every gradient, the initial state's included)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools

import pytest
import torch

from fla_gen.plan import DIAGONAL_SPLIT, DPLR_SPLIT, TRANSITION_SPLIT
from fla_gen.runtime import launch, segments
from fla_gen.runtime.dispatch import forced_arch
from fla_gen.sample import relative_error, sample_inputs
from tests.support import compare_chunk_op, generated, poisoned_allocations, recurrence


@pytest.mark.parametrize(("total", "longest", "walks", "heads", "V", "sms", "expected"), [
    # 1x16384x16x128 on the H100: 16 walks of at most 4 programs (V / 32) is 64 < 66 (half the SMs);
    # at most 264 (segment, head) walks -> 16 segments of 16 chunks
    (256, 256, 16, 16, 128, 132, 16),
    # 1x131072: the same 16 segments, longer ones
    (2048, 2048, 16, 16, 128, 132, 128),
    # 4x4096x16x128: 64 walks make 256 programs: no split
    (256, 64, 64, 16, 128, 132, 0),
    # 2x8192x8x256: 16 walks of 8 programs, 128 >= 66: no split
    (256, 128, 16, 8, 256, 132, 0),
    # short sequences: segments of 4 chunks at least, and only if the longest has two of them
    (8, 8, 1, 1, 64, 132, 4),
    (4, 4, 1, 1, 64, 132, 0),
    # on the CPU (0 SMs): never
    (256, 256, 16, 16, 128, 0, 0),
])
def test_plan_segment_chunks(total, longest, walks, heads, V, sms, expected):
    assert segments.plan_segment_chunks(total, longest, walks, heads, V, V, sms, DIAGONAL_SPLIT) == expected


def test_forced_segment_chunks_is_scoped():
    with segments.forced_segment_chunks(2):
        assert segments.plan_segment_chunks(10, 10, 1, 1, 64, 64, 0, DIAGONAL_SPLIT) == 2
        # a sequence of at most 2 chunks is not split
        assert segments.plan_segment_chunks(2, 2, 1, 1, 64, 64, 0, DIAGONAL_SPLIT) == 0
    assert segments.plan_segment_chunks(10, 10, 1, 1, 64, 64, 0, DIAGONAL_SPLIT) == 0
    with pytest.raises(ValueError, match="chunks must be >= 0"), segments.forced_segment_chunks(-1):
        pass


def _as_lists(t: segments.SegmentTables) -> tuple[list[int], list[int], list[int], list[int], int, int, int]:
    return (t.cu_seqlens.tolist(), t.chunk_offsets.tolist(), t.first_segment.tolist(), t.sequence.tolist(), t.count,
            t.most_segments, t.least_segments)


def test_dense_segment_tables():
    """B = 2, T = 200 at 64-token chunks (4 per sequence, the last one partial), 2 chunks per segment."""
    with segments.forced_segment_chunks(2):
        t = segments.segment_tables(2, 200, 3, 32, 32, 64, None, None, torch.device("cpu"), DIAGONAL_SPLIT)
    # chunk_offsets: the segments' first chunks, then the walk order (equal segments: as they come)
    assert _as_lists(t) == ([0, 128, 200, 328, 400], [0, 2, 4, 6, 8, 0, 1, 2, 3], [0, 2, 4], [0, 0, 1, 1], 4, 2, 2)
    assert launch.folds_segment_scan(t.least_segments, t.most_segments)


def test_varlen_segment_tables():
    """Sequences of 50, 0 and 250 tokens: one segment, none, and two (chunks 1-2 and 3-4 of the batch)."""
    with segments.forced_segment_chunks(2):
        t = segments.segment_tables(1, 300, 3, 32, 32, 64, 3, torch.tensor([0, 50, 50, 300]), torch.device("cpu"),
                                    DIAGONAL_SPLIT)
    # the walk order: the two 2-chunk segments first, then the 1-chunk one
    assert _as_lists(t) == ([0, 50, 178, 300], [0, 1, 3, 5, 1, 2, 0], [0, 1, 1, 3], [0, 2, 2], 3, 2, 0)
    # the empty sequence has no segment whose walk would store its final state: the scan runs on its own
    assert not launch.folds_segment_scan(t.least_segments, t.most_segments)


class _CountingKernel:
    """Stands in for a generated kernel: counts the launches and runs the real one."""

    def __init__(self, kernel):
        self.kernel, self.launches = kernel, 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.mark.parametrize(("total", "walks", "K", "sms", "expected"), [
    # 1x16384x16x128 on 132 SMs: 64 programs < 66; at most one (segment, head) walk per SM -> 8 segments of 32 chunks
    (256, 16, 128, 132, 32),
    # 1x65536: 8 segments of 128 chunks
    (1024, 16, 128, 132, 128),
    # 1x8192: 8 segments would have 16 chunks, fewer than 32: whole
    (128, 16, 128, 132, 0),
    # 2x16384x16: 32 walks make 128 programs >= 66: whole
    (512, 32, 128, 132, 0),
    # head dim 256: the scan's [K, K] transition does not fit: whole
    (256, 16, 256, 132, 0),
])
def test_transition_split_rule(total, walks, K, sms, expected):
    """The delta family's rule (fla_gen/plan.py TRANSITION_SPLIT): at most one (segment, head) walk per SM, 8
    segments of 32 chunks at least or none, and never above head dim 128, not even forced."""
    longest = total // (walks // 16)
    assert segments.plan_segment_chunks(total, longest, walks, 16, K, K, sms, TRANSITION_SPLIT) == expected
    with segments.forced_segment_chunks(2):
        assert segments.plan_segment_chunks(total, longest, walks, 16, 256, 256, sms, TRANSITION_SPLIT) == 0
        assert "key head dim 256 > 128" in segments.describe_segment_split(total, longest, walks, 16, 256, 256, sms,
                                                                           TRANSITION_SPLIT)


@pytest.mark.parametrize(("total", "walks", "K", "sms", "expected"), [
    # DPLR's 16-token chunks, B = 1, H = 16 on 132 SMs: 64 programs < 66; two walks per SM -> 16 segments
    (4096, 16, 128, 132, 256),  # 1x65536
    (1024, 16, 128, 132, 64),  # 1x16384
    (256, 16, 128, 132, 16),  # 1x4096: 16-chunk segments, the shortest the rule makes
    (128, 16, 128, 132, 16),  # 1x2048: 8 segments of 16 chunks
    (64, 16, 128, 132, 0),  # 1x1024: 4 segments of 16 chunks are too few
    (1024, 64, 128, 132, 0),  # 4x4096: 64 walks make 256 programs, where the split measured slower
    (4096, 16, 256, 132, 0),  # the scan holds [K, K]: K <= 128
])
def test_dplr_split_rule(total, walks, K, sms, expected):
    assert segments.plan_segment_chunks(total, total // (walks // 16), walks, 16, K, K, sms, DPLR_SPLIT) == expected


def test_rule_with_no_sm_share_splits_only_when_forced():
    """A rule whose below_sm_share is 0 (an algorithm whose split is built but not yet measured) never splits a
    call by itself, and says so; forced, it splits as asked."""
    rule = dataclasses.replace(DPLR_SPLIT, below_sm_share=0.0, source="unmeasured")
    assert segments.plan_segment_chunks(8192, 8192, 4, 4, 128, 128, 132, rule) == 0
    assert "never splits a call by itself" in segments.describe_segment_split(8192, 8192, 4, 4, 128, 128, 132, rule)
    with segments.forced_segment_chunks(64):
        assert segments.plan_segment_chunks(8192, 8192, 4, 4, 128, 128, 132, rule) == 64


# Every family's backward scans the state gradients once. Its recompute of the states starts from the segments'
# entering states that the forward kept (launch.saved_segment_states); a packed batch keeps none, so its backward
# scans the states again first.
@pytest.mark.parametrize("many_sms", [False, True], ids=["fused-walk", "state-walk"])
@pytest.mark.parametrize(("package", "cu_seqlens", "chunks"), [
    ("linear_attn", None, 1),
    ("linear_attn", [0, 50, 50, 300], 2),
    ("simple_gla", None, 2),
    ("simple_gla", [0, 50, 50, 300], 1),
    ("gla", None, 2),
    ("gla", [0, 50, 50, 300], 1),
    ("delta_rule", None, 1),
    ("delta_rule", [0, 50, 50, 300], 2),
    ("gated_delta_rule", None, 2),
    ("gated_delta_rule", [0, 50, 50, 300], 1),
    ("kda", None, 1),
    ("kda", [0, 50, 50, 300], 2),
    ("gated_delta_rule_rope", None, 2),
    ("dplr", None, 2),
    ("dplr", [0, 50, 50, 300], 1),
    ("rwkv7", None, 1),
    ("rwkv7", [0, 50, 50, 300], 3),
])
def test_chunk_op_over_segments(monkeypatch, package, cu_seqlens, chunks, many_sms):
    """The op with its sequences split into segments matches the float64 reference, forward (as one fused
    walk on 0 SMs, as the state walk and the output kernel on 1000) and backward; the scan ran for the states in
    the forward, their gradients in the backward, and for a packed batch the states again there."""
    module = generated(package).chunk
    # the op's name, not the package's (generated/dplr: dplr_delta_rule)
    name = next(n for n in dir(module) if n.endswith("_segment_scan_kernel"))
    scan = _CountingKernel(getattr(module, name))
    monkeypatch.setattr(module, name, scan)
    # the families with a fused forward walk take it on 0 SMs under sm90's plans (sm80's, the default, never do);
    # the state walk runs on the default plans
    fused = None
    fused_name = name.replace("_segment_scan_kernel", "_fwd_fused_kernel")
    if hasattr(module, fused_name):  # the package's chunk op has a fused forward walk
        fused = _CountingKernel(getattr(module, fused_name))
        monkeypatch.setattr(module, fused_name, fused)
    dims = (1, 300, 2, 32, 32) if cu_seqlens else (2, 200, 2, 32, 32)
    arch = contextlib.nullcontext() if many_sms else forced_arch("sm90")
    with segments.forced_segment_chunks(chunks), launch.forced_sm_count(1000 if many_sms else 0), arch:
        result = compare_chunk_op(package, dims, torch.float32, seed=11, cu_seqlens=cu_seqlens,
                                  op=name.removesuffix("_segment_scan_kernel"))
    assert not result.failures(), result.errors
    # a fused walk that scans the earlier segments itself (FOLDED_SCAN) leaves only the backward's scan; these
    # packed batches hold an empty sequence, which it does not take (launch.folds_segment_scan)
    folded = fused is not None and "FOLDED_SCAN" in fused.kernel.arg_names and not many_sms and not cu_seqlens
    assert scan.launches == (3 if cu_seqlens else 1 if folded else 2), scan.launches
    if fused is not None:
        assert (fused.launches > 0) == (not many_sms), fused.launches


# the ops whose fused forward walk scans the earlier segments itself (FOLDED_SCAN): the ungated ones
FOLDING = ["linear_attn"]


def test_only_ungated_walks_fold_the_scan():
    # the ops with a fused forward walk (KDA's forward is fwd_h + fwd_o)
    for package in ("linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule"):
        fused = getattr(generated(package).chunk, f"{recurrence(package).spec.op}_fwd_fused_kernel")
        assert ("FOLDED_SCAN" in fused.arg_names) == (package in FOLDING), package


@pytest.mark.parametrize("package", FOLDING)
@pytest.mark.parametrize("cu_seqlens", [None, [0, 130, 300]], ids=["dense", "packed"])
def test_folded_scan_matches_scan_launch(monkeypatch, package, cu_seqlens):
    """A fused forward walk that computes the state entering its segment itself (launch.FoldedScan) gives the
    outputs, final states and kept entering states of the walk after a segment_scan launch, bit for bit (the
    same fp32 additions in the same order), with no scan launched; every allocation poisoned first."""
    module = generated(package).chunk
    rec = recurrence(package)
    name = next(n for n in dir(module) if n.endswith("_segment_scan_kernel"))
    B, T, H, K, V = (1, 300, 2, 32, 32) if cu_seqlens else (2, 200, 2, 32, 32)
    x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=8)
    N = len(cu_seqlens) - 1 if cu_seqlens else B
    h0 = torch.randn(N, H, K, V, generator=torch.Generator().manual_seed(9))
    captured = []
    monkeypatch.setattr(module, "call_op", lambda op, forward, *args: captured.append(args) or forward(*args))
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    getattr(module, f"chunk_{rec.spec.op}")(**x, initial_state=h0, output_final_state=True, cu_seqlens=cu)
    args = captured[0]
    unsplit = module._op_forward(*args)  # no SM count off CUDA: whole sequences
    results = {}
    # with a backward to follow (the entering states kept) and without one (none stored)
    for backward, max_segments in itertools.product((True, False), (0, launch.FOLDED_SCAN_MAX_SEGMENTS)):
        scan = _CountingKernel(getattr(module, name))
        monkeypatch.setattr(module, name, scan)
        monkeypatch.setattr(launch, "FOLDED_SCAN_MAX_SEGMENTS", max_segments)
        with (segments.forced_segment_chunks(1), launch.forced_sm_count(0), forced_arch("sm90"),
              poisoned_allocations(), contextlib.nullcontext() if backward else launch.no_backward()):
            results[backward, max_segments] = module._op_forward(*args)
        assert scan.launches == (0 if max_segments else 1), (max_segments, scan.launches)
    for backward in (True, False):
        scanned, folded = results[backward, 0], results[backward, launch.FOLDED_SCAN_MAX_SEGMENTS]
        # o, the final state, what the forward keeps and, dense with a backward to follow, the entering states
        assert len(folded) == len(scanned) == len(unsplit) + (1 if backward and not cu_seqlens else 0)
        for a, b in zip(folded, scanned, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("gates", [("g", "g_gamma"), ("g",), ("g_gamma",)], ids="+".join)
@pytest.mark.parametrize("cu_seqlens", [None, [0, 50, 50, 300]], ids=["dense", "packed"])
def test_walk_from_zero_sums_the_scalar_gate(monkeypatch, gates, cu_seqlens):
    """Over segments simple_gla's forward launches no cumsum kernel: its walk from zero sums the raw gates into
    g_cum, which then holds, bit for bit, what the cumsum kernel stores (every allocation poisoned first, so a
    token no walk wrote would fail). The backward still launches it. (test_chunk_op_over_segments holds the op
    over segments to the float64 reference.)"""
    module = generated("simple_gla").chunk
    cumsum = _CountingKernel(module.simple_gla_cumsum_kernel)
    monkeypatch.setattr(module, "simple_gla_cumsum_kernel", cumsum)
    summed = []
    chunk_cumsum = module._chunk_cumsum
    monkeypatch.setattr(module, "_chunk_cumsum", lambda *a, **kw: summed.append((a, chunk_cumsum(*a, **kw)))
                        or summed[-1][1])
    B, T, H, K, V = (1, 300, 2, 32, 32) if cu_seqlens else (2, 200, 2, 32, 32)
    x = sample_inputs(recurrence("simple_gla"), B, T, H, K, V, torch.float32, seed=12)
    x = {name: t for name, t in x.items() if name in gates or name not in ("g", "g_gamma")}
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    split = (segments.forced_segment_chunks(1), launch.forced_sm_count(0), forced_arch("sm90"), poisoned_allocations())
    with contextlib.ExitStack() as stack:
        for context in split:
            stack.enter_context(context)
        with torch.no_grad():
            module.chunk_simple_gla(**x, cu_seqlens=cu)
        assert cumsum.launches == 0 and len(summed) == 1
        args, by_walk = summed[0]
        assert torch.equal(by_walk, chunk_cumsum(*args))  # the same arguments, the cumsum kernel launched
        assert cumsum.launches == 1
        leaves = {name: t.requires_grad_() for name, t in x.items()}
        o, _ = module.chunk_simple_gla(**leaves, cu_seqlens=cu)
        assert cumsum.launches == 1
        o.sum().backward()
        assert cumsum.launches == 2  # the backward's


@pytest.mark.parametrize("package", ["gated_delta_rule", "kda", "rwkv7"])
def test_transition_split_without_states(package):
    """The call the benchmarks time, no initial state and no final state, split into one-chunk segments: the scan
    then starts from zero and stores nothing at the end. o and every input's gradient against the float64
    reference, outputs poisoned first."""
    pkg = generated(package)
    x = sample_inputs(recurrence(package), 2, 200, 2, 32, 32, torch.float32, seed=21)
    leaves = {n: t.clone().requires_grad_(True) for n, t in x.items()}
    ref_leaves = {n: t.double().requires_grad_(True) for n, t in x.items()}
    with segments.forced_segment_chunks(1), launch.forced_sm_count(1000), poisoned_allocations():
        o, ht = getattr(pkg, f"chunk_{package}")(*leaves.values())
        assert ht is None
        do = torch.randn_like(o)
        grads = torch.autograd.grad((o * do).sum(), list(leaves.values()))
    o_ref, _ = getattr(pkg, f"{package}_reference")(*ref_leaves.values())
    grads_ref = torch.autograd.grad((o_ref * do.double()).sum(), list(ref_leaves.values()))
    assert relative_error(o, o_ref) < 1e-5
    for name, g, g_ref in zip(leaves, grads, grads_ref, strict=True):
        assert relative_error(g, g_ref) < 1e-4, name


@pytest.mark.parametrize("package", ["linear_attn", "simple_gla", "gla", "delta_rule", "gated_delta_rule", "kda",
                                     "dplr", "rwkv7"])
def test_backward_from_saved_segment_states_matches_recompute(monkeypatch, package):
    """Every family's forward over segments keeps the state entering each segment (and what carries a state across
    one, where the family has it); the backward that starts from them gives the same gradients, bit for bit, as the
    one that walks and scans the segments again (saved cut back to what the forward keeps without segments)."""
    module = generated(package).chunk
    rec = recurrence(package)
    B, T, H, K, V = 1, 200, 2, 32, 16
    x = sample_inputs(rec, B, T, H, K, V, torch.float32, seed=5)
    gen = torch.Generator().manual_seed(6)
    h0 = torch.randn(B, H, K, V, generator=gen)
    do = torch.randn(B, T, H, V, generator=gen)
    # the custom op's arguments as the public function passes them (its transforms applied, its order)
    captured = []
    monkeypatch.setattr(module, "call_op", lambda op, forward, *args: captured.append(args) or forward(*args))
    getattr(module, f"chunk_{rec.spec.op}")(**x, initial_state=h0)
    args = captured[0]
    _, _, *unsplit = module._op_forward(*args)  # no SM count off CUDA: whole sequences
    with segments.forced_segment_chunks(1):
        _, _, *saved = module._op_forward(*args)
        kept = module._op_backward(*args, do, None, saved)
        recomputed = module._op_backward(*args, do, None, saved[:len(unsplit)])
    # the entering states [S, H, K, V] (S one-chunk segments: 4 of 64 tokens, DPLR's 13 of 16) and, but for
    # linear_attn's, their carries
    tail = saved[len(unsplit):]
    assert len(tail) == (1 if package == "linear_attn" else 2), [t.shape for t in tail]
    assert tail[0].shape[0] in (4, 13) and tail[0].shape[1:] == (H, K, V), tail[0].shape
    for a, b in zip(kept, recomputed, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    # a packed batch keeps none (fake tensors only bound its segment count)
    cu = torch.tensor([0, 80, 200], dtype=torch.int32)
    packed = (*args[:-5], None, False, cu, cu, args[-1])  # no initial state (it would hold one per sequence)
    with segments.forced_segment_chunks(1):
        _, _, *saved = module._op_forward(*packed)
    assert len(saved) == len(unsplit), [t.shape for t in saved[len(unsplit):]]


def test_saved_segment_states_round_trip():
    """What a forward over segments keeps (no None in an op's saved list; nothing under no_backward or for a packed
    batch) and how its backward reads it back."""
    entry, carry = torch.zeros(3, 2, 4, 4), torch.zeros(3, 2)
    kept = launch.saved_segment_states((entry, carry), None)
    assert len(kept) == 2 and kept[0] is entry and kept[1] is carry
    assert launch.resumed_segment_states(kept) == (entry, carry)
    kept = launch.saved_segment_states((entry, None), None)  # linear attention: no gate carries a state across
    assert len(kept) == 1 and kept[0] is entry
    assert launch.resumed_segment_states(kept) == (entry, None)
    assert launch.saved_segment_states((entry, carry), torch.tensor([0, 5, 9])) == ()
    assert launch.saved_segment_states(None, None) == ()  # whole sequences: no segments
    with launch.no_backward():
        assert launch.saved_segment_states((entry, carry), None) == ()
    assert launch.resumed_segment_states(()) is None
