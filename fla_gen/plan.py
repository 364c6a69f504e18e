"""Stage 4: Recurrence × (arch, dtype, head dim) → Plan: which kernels, how big, for which GPU.

The rules are data: an arch table (shared-memory limit, matrix instruction) and a kernel
table per algorithm (what each kernel keeps in shared memory per pipeline stage). Measured
configs are a table per arch in fla_gen/tuned.py. Every choice carries source ids (written into
the generated tables; their prose is in fla_gen/measurements.py) and a reason that ``fla-gen
plan`` prints. No run-time autotuning: the plan is fixed when the op is built, so a first call
costs only Triton's compile. docs/design.md describes the rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from fla_gen.canonical import Recurrence
from fla_gen.features import Family, KernelFeatures, RankOne
from fla_gen.ir import Apply, Node
from fla_gen.measurements import SOURCES, explain, speaks_for
from fla_gen.runtime.plan_types import HEAD_DIM_BUCKETS, LaunchConfig, Plan, SegmentRule, head_dim_bucket
from fla_gen.tuned import FUSED_WALK, FusedWalk, tuned_config


@dataclass(frozen=True)
class ArchInfo:
    """One compile target. ``smem_per_block``: the opt-in maximum of dynamic shared memory
    per block in bytes (CUDA C Programming Guide, compute capabilities table); ``sm_count``: the SMs of
    the target's usual GPU (A100, A6000, L40S, H100 SXM, B200), for the launchers' run-time choices where no
    GPU is present (``fla-gen aot``, ``fla-gen plan --call``)."""

    name: str
    capability: int
    smem_per_block: int
    matrix_unit: str
    reason: str
    sm_count: int


ARCHS: dict[str, ArchInfo] = {
    a.name: a
    for a in (
        ArchInfo("sm80", 80, 166912, "mma.sync", "A100: 163 KB shared memory per block, mma.sync tensor cores", 108),
        ArchInfo("sm86", 86, 101376, "mma.sync", "consumer Ampere: 99 KB shared memory per block", 84),
        ArchInfo("sm89", 89, 101376, "mma.sync", "Ada (L4, RTX 40): 99 KB shared memory per block", 142),
        ArchInfo("sm90", 90, 232448, "wgmma",
                 "H100/H200: 227 KB shared memory per block, wgmma (M >= 64, 4-warp groups)", 132),
        ArchInfo("sm100", 100, 232448, "tcgen05", "B200: 227 KB shared memory per block", 148),
    )
}

ARCH_NAMES = tuple(ARCHS)
DTYPES = ("fp16", "bf16", "fp32")
# Tokens per sub-chunk ("BC" in KernelShape tiles) of the kernels that split a chunk further: the
# per-channel decays exp(G_i - G_j) within one are built entry by entry.
SUB_CHUNK = 16


@dataclass(frozen=True)
class ArchRule:
    """A per-arch override of one KernelShape value (warps, or most pipeline stages), for the head-dim
    buckets ``head_dims`` (default: all of them), with the id of its source (fla_gen/measurements.py)."""

    arch: str
    value: int
    source: str
    head_dims: tuple[int, ...] = HEAD_DIM_BUCKETS


@dataclass(frozen=True)
class KernelShape:
    """What one kernel stages in shared memory per pipeline stage, in tiles of the plan.

    ``tiles``: operand tiles loaded each loop iteration, as pairs of tile dims drawn from
    ``BT`` (chunk), ``BC`` (sub-chunk, SUB_CHUNK tokens), ``BK``, ``BV``; ``resident``: tiles held
    for the whole program (e.g. the intra-chunk [BT, BT] product staged for a second dot).
    """

    stage: str
    tiles: tuple[tuple[str, str], ...]
    resident: tuple[tuple[str, str], ...] = ()
    pipelined: bool = True
    # Overrides of the 4-warp default, from `fla-gen aot` register reports or GPU timings.
    warps: tuple[ArchRule, ...] = ()
    # Most pipeline stages, measured by `fla-gen aot` where the tile model is optimistic.
    max_stages: tuple[ArchRule, ...] = ()
    # Keeps a whole-K [K, BV] state tile in registers (sequential over chunks): BV shrinks as K grows.
    whole_k: bool = False
    # Archs where a kernel that loops over V tiles around a once-built [BT, BT] product takes one V tile
    # up to 128 wide instead (no V loop): source "wide-v".
    wide_v: tuple[str, ...] = ()
    # Builds [BT, BT, BK] tiles of pairwise decays entry by entry where the gates are strong (no dot,
    # nothing to pipeline), else [BT, BK] factor tiles for small dots: 16-wide K blocks either way.
    pair_tiles: bool = False
    # A scan whose every step's dot takes the last step's result (not pipelined): its K tile is the whole key
    # head dim and its V tile the plan's, narrowed by the launcher while the grid is small.
    serial_dots: bool = False
    # One program per BC-token sub-chunk ("BC" in tiles): its dots have M = BC = 16 rows, so they run
    # as mma.sync on every target (wgmma needs M >= 64).
    sub_chunk: bool = False
    # (widest K tile, source id): a measured cap where wider K tiles keep too many [BT, BK] fp32 tiles live.
    max_block_k: tuple[int, str] | None = None
    # A sequential walk over the chunks whose launcher splits its tiles at run time while the grid leaves
    # SMs idle: (rule id, id of its measurement), appended to the plan's sources (SMALL_GRID_SPLIT: K and V
    # tiles on the grid, launch.state_walk_tiles; WHOLE_K_GRID_SPLIT: a walk that keeps all of K,
    # launch.whole_k_walk_block_v).
    small_grid_split: tuple[str, str] | None = None
    # Only for a recurrence with a decay: a gate-free spec (linear attention) neither plans nor renders it.
    gate_only: bool = False
    # Works on the chunk's 16x16 blocks in registers, a chain of small dots with no loop over K or V to pipeline
    # (the per-channel delta rule's fwd_solve: its A comes from fwd_A, so it never loads a K tile).
    block_chain: bool = False


SMALL_GRID_SPLIT = ("split-walk", "h100-split-walk")
WHOLE_K_GRID_SPLIT = ("split-whole-k", "h100-split-whole-k")

# When the state walks split long sequences (fla_gen/runtime/segments.py). The algorithms whose transition over
# a segment is a diagonal decay (linear attention, scalar and per-channel gates): two walks and a scan of
# elementwise products. Measured on the H100 (bf16, linear_attn's forward, fla_gen/measurements.py
# h100-split-sequence): the split pays while the unsplit walks, at their narrowest tiles, make fewer programs than
# half the SMs (1x16384x16x128: 64 programs, 0.301 -> 0.217 ms), not above (2x8192x8x256: 128 programs, 0.229 ms
# unsplit, 0.233-0.741 split), and is fastest with about two (segment, head) walks per SM: 16 segments at H = 16
# both at T = 16384 and at T = 65536 (1.168 -> 0.714 ms), against 0.265 / 0.750 ms with twice as many and 0.249 /
# 0.727 with half. A segment has 4 chunks at least: shorter ones spend more on the scan and the extra walk than the
# parallel walk saves.
DIAGONAL_SPLIT = SegmentRule(below_sm_share=0.5, walks_per_sm=2.0, min_chunks=4, source="h100-split-sequence")
SEGMENT_SPLIT = ("split-sequence", DIAGONAL_SPLIT.source)
# The delta family: a segment's transition is a [K, K] matrix, from a walk of its own from the identity, so the
# split forward walks three times where the diagonal families walk twice, and its scan multiplies by a [K, K]
# matrix per segment, one segment after another. Measured on the H200 (bf16, benchmarks/segment_sweep.py,
# fla_gen/measurements.py h200-split-delta): it gains only with one (segment, head) walk per SM, no more:
# 8 segments at H = 16 (the gated delta rule at 1x16384x16x128 0.624 -> 0.598 ms at 32-chunk segments, but 0.690
# at 29-chunk ones, 9 segments: the walks' programs then spill into one more wave) and long segments (0.642 at 16
# chunks). Hence 8 segments of 32 chunks at least, or none: on 132 SMs at B = 1, H = 16, from 225 chunks (the
# last segment may be short); with fewer than 128 SMs, 16 walks are not below half of them. Its scan holds M_s in
# registers: K <= 128.
TRANSITION_SPLIT = SegmentRule(below_sm_share=0.5, walks_per_sm=1.0, min_chunks=32, source="h200-split-delta",
                               min_segments=8, max_key_dim=128)
# DPLR and RWKV-7: their chunk map is affine too, S' = M S + C with M = exp(G_L) + bg^T W, so they split as the
# delta family does (its scan kernel). Measured on the H200 (bf16, benchmarks/segment_sweep.py, dplr_delta_rule, ours
# alone, fla_gen/measurements.py h200-split-dplr): their walk is most of their forward, so the split gains more than
# the delta family's and wants more segments: the forward 1.53x faster at 1x65536x16x128 with 16-64 segments (1.44x
# with 8), 1.48x at 1x16384 with 16 (1.44x with 32, 1.41x with 8), 1.31x at 1x4096 with 8 or 16 segments of 32 or
# 16 chunks; at 4x4096 (64 walks, 256 programs unsplit) 0.79-0.81x. Hence two (segment, head) walks per SM, 16
# segments at H = 16, of 16 chunks at least, 8 of them at least.
DPLR_SPLIT = SegmentRule(below_sm_share=0.5, walks_per_sm=2.0, min_chunks=16, source="h200-split-dplr",
                         min_segments=8, max_key_dim=128)


@dataclass(frozen=True)
class Algorithm:
    """A kernel template and the kernels it defines."""

    name: str
    template: str
    kernels: tuple[KernelShape, ...]
    chunked: bool
    # A second plan table at this chunk size for calls that pass a gate lower bound (0: none).
    bounded_chunk_size: int = 0
    # The state walks split long sequences into segments at run time (fla_gen/runtime/segments.py) by this rule:
    # a scan joins the segments, with each segment's transition (a diagonal decay, or the delta family's [K, K]
    # matrix from a walk of its own). None: sequences are walked whole.
    segment_rule: SegmentRule | None = None
    # The template renders the backward of a recurrence whose gradients are forward walks
    # (KernelFeatures.gradients_are_forward_walks) as three runs of its fwd_fused walk.
    backward_walks_forward: bool = False
    # Where a forward over segments runs as fwd_fused and the recurrence has no decay, each walk program sums its
    # sequence's earlier segments itself instead of a segment_scan launch before it (launch.FoldedScan;
    # templates/kernels/_segments.jinja says why only without a decay).
    folds_segment_scan: bool = False

    @property
    def splits_sequences(self) -> bool:
        """Whether the launchers may split long sequences into segments (the plan has a segment_scan stage)."""
        return self.segment_rule is not None


def backward_walks_forward(algo: Algorithm, features: KernelFeatures) -> bool:
    """Whether ``algo``'s chunked backward of a recurrence with these features runs as three fwd_fused walks (where
    the forward's walk would run: the launcher decides per call) instead of the chunk-state walks and bwd_dqkvg."""
    return algo.backward_walks_forward and features.gradients_are_forward_walks


def forward_walk_folds_scan(algo: Algorithm, features: KernelFeatures) -> bool:
    """Whether ``algo``'s fwd_fused over sequence segments, for a recurrence with these features, computes the state
    entering each segment itself (Algorithm.folds_segment_scan): one launch fewer per split forward."""
    return algo.folds_segment_scan and features.carries_state_unchanged


_CHUNK_STATE = KernelShape("fwd_h", (("BT", "BK"), ("BT", "BV")), small_grid_split=SMALL_GRID_SPLIT)
_CHUNK_OUT = KernelShape("fwd_o", (("BT", "BK"), ("BT", "BK"), ("BK", "BV")), (("BT", "BT"),))
# fwd_h + fwd_o in one walk: q, k^T and v tiles per chunk, the state staged once per step as a dot operand.
_CHUNK_FUSED = KernelShape("fwd_fused", (("BT", "BK"), ("BK", "BT"), ("BT", "BV")), (("BK", "BV"),), whole_k=True)
_CHUNK_DSTATE = KernelShape("bwd_dh", (("BT", "BK"), ("BT", "BV")))
# 4 warps at every head dim: at 64, 8 lay bwd_dqkvg's dots out apart (3 MMA->MMA conversions on sm90, fla-gen aot);
# at 128 and 256 a register rule once took 8 (4 spilled), but 4 measured 1.44-1.48x faster on the H200.
_CHUNK_GRADS = KernelShape("bwd_dqkvg", (("BT", "BK"), ("BT", "BK"), ("BT", "BV"), ("BT", "BV"), ("BK", "BV"),
                                         ("BK", "BV")), (("BT", "BT"),),
                           warps=(ArchRule("sm90", 4, "h200-grads-four-warps", (128, 256)),
                                  ArchRule("sm100", 4, "grads-four-warps-sm100", (128, 256))))
_CUMSUM = KernelShape("cumsum", (), pipelined=False, gate_only=True)
# The scan over sequence segments: one [BK, BV] fp32 state tile loaded and stored per segment, in order.
_SEGMENT_SCAN = KernelShape("segment_scan", (), pipelined=False, small_grid_split=SEGMENT_SPLIT)
# The delta family's scan: a [K, BV] fp32 state tile per program times each segment's whole [K, K] fp32 transition,
# one tf32x3 dot: at head dim 128, 4 warps spill 428 B (sm90, fla-gen aot's ptxas) and 8 fit in 241 registers; at 64,
# 8 warps lay the loop's dot out apart (an MMA->MMA conversion on sm90) and 4 do not.
_TRANSITION_SCAN = KernelShape("segment_scan", (), pipelined=False, serial_dots=True,
                               small_grid_split=("split-delta", TRANSITION_SPLIT.source),
                               warps=tuple(ArchRule(a, 8, "aot-scan-warps", (128, 256)) for a in ARCH_NAMES))
_DPLR_TRANSITION_SCAN = replace(_TRANSITION_SCAN, small_grid_split=("split-delta", DPLR_SPLIT.source))

# The per-channel bwd_dv stages whole-chunk [BT, BT] products and sub-chunk operands: the tile model
# underestimates them, so the caps measured by fla-gen aot bound the stage search.
_CHANNEL_STAGE_CAPS = (
    ArchRule("sm80", 2, "aot-channel-stages"),
    ArchRule("sm86", 2, "aot-channel-stages-99k", (64, 128)),
    ArchRule("sm86", 1, "aot-channel-stages-99k", (256,)),
    ArchRule("sm89", 2, "aot-channel-stages-99k", (64, 128)),
    ArchRule("sm89", 1, "aot-channel-stages-99k", (256,)),
    ArchRule("sm90", 2, "aot-channel-stages"),
    ArchRule("sm100", 2, "aot-channel-stages"),
)
# fwd_A and bwd_dqk_intra: one program per 16-token sub-chunk. fwd_A loops over K tiles once: q, G rows
# [BC, BK]; k^T, G^T of every earlier sub-chunk [BK, BT] and of the diagonal block [BK, BC]. 1 stage everywhere:
# measured on sm90, the rule elsewhere.
_CHANNEL_A = KernelShape("fwd_A", (("BC", "BK"), ("BC", "BK"), ("BK", "BT"), ("BK", "BT"), ("BK", "BC"), ("BK", "BC")),
                         sub_chunk=True, max_stages=tuple(
                             ArchRule(arch, 1, "h100-fwd-a-stages" if arch == "sm90" else "fwd-a-one-stage")
                             for arch in ARCHS))
# fwd_A_chunk: one program per chunk, one loop over K tiles of q, k and G [BT, BK]; the [BT, BT] fp32 products
# stay in registers. K tiles of 32 at most: the measured sm90 config (the rule elsewhere).
_CHANNEL_A_CHUNK = KernelShape("fwd_A_chunk", (("BT", "BK"), ("BT", "BK"), ("BT", "BK")),
                               max_block_k=(32, "fwd-a-chunk-bk32"))
# Its delta-rule form (M = K K^T * Gamma beside A_qk, both from one transposed k tile) does not pipeline on sm100.
_CHANNEL_DELTA_A_CHUNK = replace(_CHANNEL_A_CHUNK, max_stages=(ArchRule("sm100", 1, "aot-fwd-a-chunk-sm100"),))
# The delta rule's fwd_A also loads the rows of k [BC, BK] for M = K K^T * Gamma beside A_qk's q rows (one launch
# builds both from the same column tiles).
_CHANNEL_DELTA_A = replace(_CHANNEL_A, tiles=(("BC", "BK"), *_CHANNEL_A.tiles))
# K tiles on the grid; a loop over the other sub-chunks (0 to NC - 1 steps) loads a dA block [BC, BC] and
# k or q, G [BC, BK] per step: too short to pipeline.
_CHANNEL_DQK_INTRA = KernelShape("bwd_dqk_intra", (("BC", "BC"), ("BC", "BK"), ("BC", "BK")), pipelined=False,
                                 sub_chunk=True)
# bwd_dqk_intra_chunk (one row set: GLA): one program per (K tile, chunk) of a chunk with weak gates, no loop: q, k,
# G [BT, BK] and the chunk's dA [BT, BT] (fp32) once; [BT, BK] fp32 tiles of the factors and parts stay live.
_CHANNEL_DQK_INTRA_CHUNK = KernelShape("bwd_dqk_intra_chunk", (("BT", "BK"), ("BT", "BK"), ("BT", "BK")),
                                       (("BT", "BT"),), pipelined=False, max_block_k=(32, "aot-dqk-intra-chunk-bk32"))
# The delta rule's bwd_dqk_intra loads M's gradient block [BC, BC] beside A_qk's and the rows of k [BC, BK] beside
# q's (one launch takes both products' gradients from the same column tiles).
_CHANNEL_DELTA_DQK_INTRA = replace(_CHANNEL_DQK_INTRA, tiles=(("BC", "BC"), ("BC", "BK"), *_CHANNEL_DQK_INTRA.tiles))
# fwd_o: o = qg h + A v, K unrolled (no loop to pipeline); A [BT, BT] and v [BT, BV] read once per V tile (V tiles
# on the grid). One 128-wide V tile on wgmma targets (A and qg read once); with mma.sync (sm80/89) 64-wide: with q
# and G (fp32) in place of qg, 128 took 254 registers there and 64 165-168 (fla-gen aot).
_CHANNEL_OUT = KernelShape("fwd_o", (("BT", "BK"), ("BK", "BV")), (("BT", "BT"), ("BT", "BV")),
                           wide_v=("sm90", "sm100"))
# fwd_h + fwd_o in one walk: qg [BT, BK], kd^T [BK, BT], A [BT, BT] and v tiles per chunk, the state staged once
# per step as a dot operand.
_CHANNEL_FUSED = KernelShape("fwd_fused", (("BT", "BK"), ("BK", "BT"), ("BT", "BT"), ("BT", "BV")), (("BK", "BV"),),
                             whole_k=True)
# bwd_dqkg: the inter-chunk dots do h^T, v dh^T in a V loop; the intra parts come from bwd_dqk_intra.
_CHANNEL_DQKG = KernelShape("bwd_dqkg", (("BT", "BV"), ("BT", "BV"), ("BK", "BV"), ("BK", "BV")),
                            max_block_k=(32, "aot-dqkg-bk32"))

# The delta family's fwd_solve on one warp, on every target: the measured sm90 rule (its source's prose).
_SOLVE_WARPS = tuple(ArchRule(a, 1, "solve-one-warp") for a in ARCH_NAMES)
_DPLR_DA_WARPS = tuple(ArchRule(a, 8, "aot-dplr-da-warps") for a in ARCH_NAMES)
# The entry-wise pairwise kernels' warps, measured on sm90 (4, the default elsewhere). With RWKV-7 gates
# fwd_intra takes the factored dots, where 2 warps were faster still: the measured bf16 entries of
# fla_gen/tuned.py; the rules stay at one warp group or more.
_DPLR_DQK_WARPS = (ArchRule("sm90", 4, "h100-dplr-dqk-warps"),)
_DPLR_INTRA_WARPS = (ArchRule("sm90", 4, "h100-dplr-intra-warps"),)


ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        # The chunk-parallel kernels recompute the chunk-local gate cumsum (a [BT] scan); the sequential
        # walks read it from a cumsum pass (measured on the H100: see templates/kernels/_programs.jinja).
        Algorithm("chunk_scalar_gate", "kernels/chunk_scalar_gate.jinja",
                  (_CUMSUM, _CHUNK_STATE, _CHUNK_OUT, _CHUNK_FUSED, _CHUNK_DSTATE, _CHUNK_GRADS, _SEGMENT_SCAN),
                  chunked=True, segment_rule=DIAGONAL_SPLIT, backward_walks_forward=True, folds_segment_scan=True),
        # Per-channel gates: fwd_A_chunk takes the chunk-local cumsum in registers and writes the pre-gated q and k
        # the walks and fwd_o read; the backward's kernels of dL/dG read G from a cumsum pass.
        Algorithm("chunk_channel_gate", "kernels/chunk_channel_gate.jinja",
                  (_CUMSUM, _CHUNK_STATE, _CHANNEL_A_CHUNK, _CHANNEL_A, _CHANNEL_OUT, _CHANNEL_FUSED, _CHUNK_DSTATE,
                   # 128-wide V spills 164-196 B with mma.sync (sm80/89, fla-gen aot): 64 there.
                   KernelShape("bwd_dv", (("BT", "BK"), ("BT", "BK"), ("BK", "BV")), (("BT", "BT"),),
                               max_stages=_CHANNEL_STAGE_CAPS, wide_v=("sm90", "sm100")),
                   _CHANNEL_DQK_INTRA_CHUNK, _CHANNEL_DQK_INTRA, _CHANNEL_DQKG, _SEGMENT_SCAN),
                  chunked=True, segment_rule=DIAGONAL_SPLIT),
        # Delta family (WY / UT transform): fwd_solve builds (I + A)^-1 as products of powers on 16x16 blocks
        # merged with dots, on one warp; fwd_wu W and U from it on the tile rule's warps; fwd_h and bwd_dh walk
        # the chunks with a whole-K state tile.
        Algorithm("chunk_delta", "kernels/chunk_delta.jinja",
                  (KernelShape("fwd_solve", (("BT", "BK"), ("BK", "BT")), warps=_SOLVE_WARPS),
                   KernelShape("fwd_wu", (("BT", "BK"), ("BT", "BV"), ("BT", "BV")),
                               (("BT", "BT"), ("BT", "BT"), ("BT", "BT"))),
                   KernelShape("fwd_h", (("BT", "BK"), ("BK", "BT"), ("BT", "BV")), (("BK", "BV"),), whole_k=True,
                               small_grid_split=WHOLE_K_GRID_SPLIT),
                   KernelShape("fwd_o", (("BT", "BK"), ("BK", "BT"), ("BK", "BV")), (("BT", "BT"), ("BT", "BV"))),
                   # fwd_h + fwd_o in one walk: w, q, k^T and u tiles per chunk (plan_fused_walk)
                   KernelShape("fwd_fused", (("BT", "BK"), ("BT", "BK"), ("BK", "BT"), ("BT", "BV")), (("BK", "BV"),),
                               whole_k=True),
                   KernelShape("bwd_dh", (("BT", "BK"), ("BK", "BT"), ("BK", "BT"), ("BT", "BV")),
                               (("BK", "BV"), ("BT", "BV")), whole_k=True, small_grid_split=WHOLE_K_GRID_SPLIT,
                               max_stages=(ArchRule("sm86", 1, "aot-delta-dh-99k"),
                                           ArchRule("sm89", 1, "aot-delta-dh-99k"))),
                   KernelShape("bwd_dqk", (("BT", "BV"), ("BT", "BV"), ("BV", "BT"), ("BV", "BT"), ("BV", "BK")),
                               (("BT", "BT"), ("BT", "BT"))),
                   # 4 warps (the default): at 8, wgmma lays out bwd_wy's chained dots apart (MMA->MMA on sm90).
                   KernelShape("bwd_wy", (("BT", "BK"), ("BT", "BK"), ("BK", "BT"), ("BK", "BT")),
                               (("BT", "BT"), ("BT", "BT"), ("BT", "BT"))),
                   _TRANSITION_SCAN),
                  chunked=True, segment_rule=TRANSITION_SPLIT),
        # General rank-1 (DPLR): 16-token chunks whose pairwise decays are dots of exp factors where the
        # gates keep them finite (checked per K block at run time), else built entry by entry; the output
        # is fused into the sequential state walk (fwd_h). With a gate lower bound the same plan takes the dots
        # on every K block, compiled without the run-time check (bounded_chunk_size).
        Algorithm("chunk_dplr", "kernels/chunk_dplr.jinja",
                  (KernelShape("fwd_intra", (), pair_tiles=True, warps=_DPLR_INTRA_WARPS),
                   KernelShape("fwd_h", (("BT", "BK"), ("BT", "BK"), ("BK", "BT"), ("BK", "BT"), ("BT", "BV")),
                               (("BK", "BV"), ("BT", "BT"), ("BT", "BT"), ("BT", "BT")), whole_k=True),
                   KernelShape("bwd_dh", (("BT", "BK"), ("BK", "BT"), ("BK", "BT"), ("BT", "BV")),
                               (("BK", "BV"), ("BT", "BT")), whole_k=True),
                   KernelShape("bwd_dv", (("BT", "BK"), ("BK", "BV")), (("BT", "BT"), ("BT", "BT"), ("BT", "BV"))),
                   KernelShape("bwd_dA", (("BV", "BK"), ("BV", "BK"), ("BT", "BV"), ("BT", "BV"), ("BT", "BV"),
                                          ("BT", "BV")), (("BT", "BK"),), whole_k=True, warps=_DPLR_DA_WARPS),
                   KernelShape("bwd_dqk", (), pair_tiles=True, warps=_DPLR_DQK_WARPS),
                   _DPLR_TRANSITION_SCAN),
                  chunked=True, bounded_chunk_size=16, segment_rule=DPLR_SPLIT),
        # One token-by-token template for every recurrence, switched by its features (fla_gen.features).
        Algorithm("fused_recurrent", "kernels/fused_recurrent.jinja",
                  (KernelShape("recurrent_fwd", (), pipelined=False),
                   KernelShape("recurrent_bwd", (), pipelined=False)), chunked=False),
    )
}

# The delta rule on a per-channel decayed state (KDA): chunk_delta's kernels with the gate applied per key
# channel, plus the per-channel blocks of chunk_channel_gate (the gate cumsum, fwd_A for the two intra-chunk
# products A_kk = K K^T * Gamma and A_qk = scale Q K^T * Gamma, bwd_dqk_intra for their gradients). Its own
# name: the measured entries of fla_gen/tuned.py and FUSED_WALK_TILES are for the scalar-gate kernels. No
# fwd_fused: its per-channel walk is not measured, so the forward is fwd_h + fwd_o. Shared-memory models as
# chunk_delta's plus the fp32 G tiles (the model counts them at the input dtype: `fla-gen aot` checks the real
# size); warps are the 4-warp default, not measured.
# bwd_wy's dk loop keeps several [BT, BK] fp32 tiles (X, exp(G), k, the two parts of dk) live.
_CHANNEL_WY_WARPS = tuple(
    ArchRule(a, 8, "aot-channel-delta-wy-warps") for a in ("sm80", "sm86", "sm89"))
_CHANNEL_DELTA = Algorithm(
    "chunk_delta_channel", "kernels/chunk_delta.jinja",
    (_CUMSUM, _CHANNEL_DELTA_A_CHUNK, _CHANNEL_DELTA_A,
     # the inverse from fwd_A's A_kk blocks [16, 16]
     KernelShape("fwd_solve", (), pipelined=False, block_chain=True),
     # W = Ai (beta exp(G) K) scales each k tile by exp(G)
     KernelShape("fwd_wu", (("BT", "BK"), ("BT", "BK"), ("BT", "BV"), ("BT", "BV")),
                 (("BT", "BT"), ("BT", "BT"), ("BT", "BT"))),
     # w, the pre-gated kd^T (fwd_wu) and u. sm100: 8 warps, measured when the walk built its k^T factors [K, BT]
     # in fp32 beside the state tile
     KernelShape("fwd_h", (("BT", "BK"), ("BK", "BT"), ("BT", "BV")), (("BK", "BV"),), whole_k=True,
                 small_grid_split=WHOLE_K_GRID_SPLIT,
                 warps=(ArchRule("sm100", 8, "aot-channel-delta-h-warps"),)),
     # the pre-gated qg (fwd_A) and the chunk states
     KernelShape("fwd_o", (("BT", "BK"), ("BK", "BV")), (("BT", "BT"), ("BT", "BV"))),
     # kd, qg^T and w^T (k and q pre-gated by fwd_wu and fwd_A) and do
     KernelShape("bwd_dh", (("BT", "BK"), ("BK", "BT"), ("BK", "BT"), ("BT", "BV")),
                 (("BK", "BV"), ("BT", "BV")), whole_k=True, small_grid_split=WHOLE_K_GRID_SPLIT,
                 max_stages=(ArchRule("sm86", 1, "aot-delta-dh-99k"), ArchRule("sm89", 1, "aot-delta-dh-99k"))),
     KernelShape("bwd_dqk", (("BT", "BV"), ("BV", "BT"), ("BV", "BK"), ("BV", "BK"), ("BT", "BK")), (("BT", "BT"),)),
     KernelShape("bwd_wy", (("BT", "BK"), ("BT", "BK"), ("BK", "BT"), ("BK", "BT")),
                 (("BT", "BT"), ("BT", "BT"), ("BT", "BT")), warps=_CHANNEL_WY_WARPS),
     _CHANNEL_DELTA_DQK_INTRA,
     # dg from dL/dG (bwd_dqk_intra finishes dq and dk): [BT, BK] loads and a reverse cumsum, no dot
     KernelShape("bwd_dqkg", (), pipelined=False),
     _TRANSITION_SCAN),
    chunked=True, segment_rule=TRANSITION_SPLIT)
# every algorithm by name, the per-channel delta kernels included (fla_gen/tuned.py keys them by name)
ALGORITHMS[_CHANNEL_DELTA.name] = _CHANNEL_DELTA


@dataclass(frozen=True)
class DecodeWork:
    """What the decode kernel (recurrent_fwd) does per token beside the update, from the spec's transforms,
    which it applies inline as it loads a token when no autograd runs: ``norms`` l2norms (each a reduction
    over the head dim), ``rotates`` a rope (the rotated partners live in registers beside the state)."""

    norms: int = 0
    rotates: bool = False


def _count_l2norms(node: Node | None) -> int:
    if not isinstance(node, Apply):
        return 0
    return (node.fn == "l2norm") + sum(_count_l2norms(a) for a in node.args)


def decode_work(rec: Recurrence) -> DecodeWork:
    """The per-token transform work of ``rec``'s decode kernel (every transform line, guarded or not: the
    plan serves the call with its flags on)."""
    transforms = rec.spec.transforms
    return DecodeWork(norms=sum(_count_l2norms(t.expr) for t in transforms),
                      rotates=any(t.kind == "rope" for t in transforms))


class PlanError(ValueError):
    """The planner has no rule for this recurrence or target."""


# The chunk algorithm of each kernel family, and the decode algorithm of each rank-1 kind.
CHUNK_ALGORITHM: dict[Family, str] = {
    Family.GATED_SCALAR: "chunk_scalar_gate",
    Family.GATED_CHANNEL: "chunk_channel_gate",
    Family.DELTA: "chunk_delta",
    Family.GENERAL: "chunk_dplr",
}
RECURRENT_ALGORITHM: dict[RankOne, str] = {r: "fused_recurrent" for r in RankOne}


def kernel_features(rec: Recurrence | KernelFeatures) -> KernelFeatures:
    """The kernel features of a recurrence (lowered here), or the features themselves."""
    if isinstance(rec, KernelFeatures):
        return rec
    from fla_gen.lower import lower  # lower builds on canonical, as this module does

    return lower(rec).features


def select_algorithms(rec: Recurrence | KernelFeatures) -> tuple[Algorithm, Algorithm]:
    """The (chunk, fused recurrent) algorithms for a recurrence's kernel features."""
    features = kernel_features(rec)
    # the delta rule on a per-channel decayed state: chunk_delta's template with its per-channel kernels
    channel_delta = features.delta and features.channel_decay
    chunk = _CHANNEL_DELTA if channel_delta else ALGORITHMS[CHUNK_ALGORITHM[features.family]]
    if not features.any_decay:
        chunk = replace(chunk, kernels=tuple(k for k in chunk.kernels if not k.gate_only))
    return chunk, ALGORITHMS[RECURRENT_ALGORITHM[features.rank1]]


@dataclass(frozen=True)
class KernelInputs:
    """The tensors the launchers take: fixed launcher names (q, k, v, g, g_gamma, beta, a, b) and the
    declared input each reads directly (None where the lowering derives the value)."""

    names: tuple[str, ...]
    inputs: tuple[str | None, ...]


def bind_kernel_inputs(rec: Recurrence) -> KernelInputs:
    """The launchers' arguments and the inputs bound to them (fla_gen/lower.py decides)."""
    from fla_gen.lower import lower

    lowered = lower(rec)
    return KernelInputs(lowered.features.kernel_args, tuple(s.input for s in lowered.slots))


def _row_gate(features: KernelFeatures) -> bool:
    """Whether a DPLR recurrence decays by one log gate per token (per-token scalar and/or per-head)."""
    return features.general and features.any_decay and not features.channel_decay


def plan_chunk_size(rec: Recurrence | KernelFeatures, arch: ArchInfo) -> tuple[int, str]:
    """BT and why. 64 tokens: the [64, 64] intra-chunk product fills an mma/wgmma tile (M >= 64)
    and keeps the sequential inter-chunk loop T/64 steps long, as fla does for this family."""
    features = kernel_features(rec)
    if _row_gate(features):
        return 16, ("16-token chunks (the per-channel gate's, not measured for this path): with one log gate per "
                    "token the pairwise decays exp(G_t - G_s) are a [16, 16] tile that scales tensor-core dots x y^T, "
                    "safe for any gate")
    if features.general:
        return 16, ("16-token chunks: the general rank-1 term's pairwise decays exp(G_t - G_s) are tensor-core dots "
                    "of factors around the middle row on every K block whose gates move at most "
                    "launch.factor_span inside the chunk (checked at run time), else built entry by entry in "
                    "[16, 16, BK] register tiles (never a factor that can overflow)")
    if features.channel_decay:
        return 64, "64-token chunks, intra-chunk decays in 16-token sub-chunks so exp(G_i - G_j) stays <= 1"
    return 64, "64-token chunks: M = 64 fills a wgmma/mma tile; T/64 sequential state steps"


# exp(x) stays finite in fp32 (and in the bf16 / tf32 operands of a dot, which share its exponent
# range) for x <= 88.7; fla's gate_bound_is_safe uses 124 in log2 units, i.e. x <= 85.95.
_LARGEST_SAFE_EXPONENT = 124 * math.log(2)


def gate_bound_for_chunk(chunk_size: int) -> float:
    """The most negative per-token log gate for which a chunk of ``chunk_size`` tokens may build its
    pairwise decays exp(G_t - G_s) as products exp(G_t - G_m) exp(G_m - G_s) around its middle row m:
    each factor spans at most chunk_size / 2 + 1 tokens (fla-core 0.6.0, ``gate_bound_is_safe``)."""
    return -_LARGEST_SAFE_EXPONENT / (chunk_size // 2 + 1)


def _element_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def tile_dims(chunk_size: int, block_k: int, block_v: int) -> dict[str, int]:
    """The values of the tile dims that KernelShape tiles name: BT, BC, BK, BV."""
    return {"BT": chunk_size, "BC": min(SUB_CHUNK, chunk_size), "BK": block_k, "BV": block_v}


def _smem_bytes(shape: KernelShape, sizes: dict[str, int], elem: int, stages: int) -> int:
    per_stage = sum(sizes[a] * sizes[b] for a, b in shape.tiles) * elem
    resident = sum(sizes[a] * sizes[b] for a, b in shape.resident) * elem
    return per_stage * max(stages, 1) + resident


def _arch_rule(rules: tuple[ArchRule, ...], arch: ArchInfo, head_dim: int) -> tuple[int, str] | None:
    """The (value, source id) of the rule for ``arch`` and head-dim bucket ``head_dim`` in a KernelShape's
    per-arch overrides, if any."""
    return next(((r.value, r.source) for r in rules if r.arch == arch.name and head_dim in r.head_dims), None)


def _most_stages_that_fit(shape: KernelShape, sizes: dict[str, int], elem: int, most: int, budget: int) -> int:
    """The deepest pipeline (<= ``most``) whose modelled shared memory fits ``budget``; 0 if none."""
    return next((s for s in range(most, 0, -1) if _smem_bytes(shape, sizes, elem, s) <= budget), 0)


def _config(block_k: int, block_v: int, warps: int, stages: int, sources: list[str], why: str,
            min_sm_share: float | None = 0.0, reads_inverse: bool = False, inverse_min_group: int = 1,
            two_per_sm: tuple[int, int, float] | None = None, two_per_sm_packed: bool = False) -> LaunchConfig:
    """A LaunchConfig whose source is ``sources`` (ids, duplicates dropped) and whose reason is ``why`` followed
    by the prose of every id that is not a plain rule of this module (a measurement or a compile-time check)."""
    ids = [i for i in dict.fromkeys(sources) if i]
    cited = [i for i in ids if not SOURCES[i].text.startswith("rule")]
    reason = f"{why}; {explain(','.join(cited))}" if cited else why
    return LaunchConfig(block_k, block_v, warps, stages, reason, min_sm_share=min_sm_share, source=",".join(ids),
                        reads_inverse=reads_inverse, inverse_min_group=inverse_min_group, two_per_sm=two_per_sm,
                        two_per_sm_packed=two_per_sm_packed)


def plan_kernel(shape: KernelShape, arch: ArchInfo, dtype: str, head_dim: int, chunk_size: int,
                row_gate: bool = False, decode: DecodeWork = DecodeWork()) -> LaunchConfig:
    """Tile sizes, warps and stages for one kernel on one arch; ``row_gate``: the recurrence decays by one log
    gate per token (its pair_tiles kernels take plain dots times [BT, BT] decays); ``decode``: the decode
    kernel's inline transforms."""
    block = min(64, head_dim)
    warps = 4
    warps_src = ""  # the default: no source to cite
    warps_why = "4 warps (one warp group: wgmma-ready, no MMA->MMA conversion)"
    sub_chunk = min(SUB_CHUNK, chunk_size)
    if shape.sub_chunk:
        warps_src = "sub-chunk"
        warps_why = f"4 warps (the default, not measured: {sub_chunk}-row dots are mma.sync on every target)"
    if rule := _arch_rule(shape.warps, arch, head_dim):
        warps, warps_src = rule
        warps_why = f"{warps} warps"
    if shape.sub_chunk and not shape.pipelined:
        return _config(block, block, warps, 1, ["sub-chunk-loop", warps_src],
                       f"one program per {sub_chunk}-token sub-chunk and {block}-wide K tile (K on the grid): "
                       f"[{sub_chunk}, {sub_chunk}] x [{sub_chunk}, {block}] dots over the other sub-chunks (at "
                       f"most {chunk_size // sub_chunk - 1} steps, too few to pipeline), the diagonal block entry "
                       f"by entry; {warps_why}")
    if shape.pair_tiles and row_gate:
        return _config(16, 16, warps, 1, ["row-gate-pairs", warps_src],
                       f"K in 16-wide blocks: dots of [{chunk_size}, 16] tiles, then the [{chunk_size}, {chunk_size}] "
                       f"decays of one gate per token; {warps_why}")
    if shape.pair_tiles:
        return _config(16, 16, warps, 1, ["pair-blocks", warps_src],
                       f"K in 16-wide blocks: [BT, 16] factor tiles for dots, or entry-wise [BT, BT, 16] fp32 decay "
                       f"tiles under strong gates; {warps_why}")
    if not shape.pipelined:
        if shape.stage == "recurrent_fwd" and decode.norms and not decode.rotates:
            bv = max(16, min(head_dim, (128 * 32) // head_dim))
            return _config(head_dim, bv, 1, 1, ["recurrent-one-warp"],
                           f"one warp, whole K, V in {bv}-wide blocks (128 fp32 state registers per thread): the "
                           f"{decode.norms} l2norm(s) applied inline reduce over K within the warp, not across "
                           f"warps through shared memory")
        if shape.stage.startswith("recurrent"):
            # The state tile [K, BV] lives in fp32 registers: ~2 registers per element forward and
            # ~4 backward (dS, S and their products), within 128 per thread on 4 warps.
            per_element = 4 if shape.stage.endswith("bwd") else 2
            bv = max(16, min(64, head_dim, (128 * 32 * warps) // (per_element * head_dim)))
            return _config(head_dim, bv, warps, 1, ["recurrent"],
                           f"whole K in registers, V in {bv}-wide blocks: ~{per_element} fp32 registers per state "
                           f"element stay under 128 per thread (no spills); more programs in flight")
        if shape.block_chain:
            return _config(block, block, warps, 1, ["block-chain", warps_src],
                           f"16x16 blocks in registers, a chain of small dots and no K or V loop: nothing to "
                           f"pipeline; {warps_why}")
        if shape.serial_dots:
            return _config(block, block, warps, 1, ["scan-loop", warps_src],
                           f"a loop of dots, each on the last one's result: nothing to pipeline; {warps_why}")
        if shape.max_block_k:
            bk = min(block, shape.max_block_k[0])
            return _config(bk, block, warps, 1, [shape.max_block_k[1], warps_src],
                           f"K in {bk}-wide tiles on the grid and no loop: nothing to pipeline; {warps_why}")
        return _config(block, block, warps, 1, ["elementwise"], "elementwise pass, nothing to pipeline")
    budget = int(arch.smem_per_block * 0.8)  # headroom for Triton's own scratch (layout conversions)
    elem = _element_bytes(dtype)
    cap = _arch_rule(shape.max_stages, arch, head_dim)
    cap_src = [cap[1]] if cap else []
    if shape.whole_k:
        bv = 64 if head_dim <= 64 else (32 if head_dim <= 128 else 16)
        sizes = tile_dims(chunk_size, head_dim, bv)
        stages = _most_stages_that_fit(shape, sizes, elem, min(2, cap[0]) if cap else 2, budget)
        if not stages:
            raise PlanError(f"kernel {shape.stage} keeps whole-K tiles of {head_dim} ({dtype}) that do not fit "
                            f"{arch.name}'s shared memory")
        used = _smem_bytes(shape, sizes, elem, stages)
        return _config(head_dim, bv, warps, stages, ["whole-k", *cap_src, warps_src],
                       f"whole K ({head_dim}) with a [K, {bv}] fp32 state tile in registers: BV = {bv} keeps it "
                       f"from spilling (fla-gen aot) and gives more programs to the sequential chunk walk; "
                       f"{stages} stage(s): ~{used // 1024} KB of {arch.smem_per_block // 1024} KB; {warps_why}")
    most = cap[0] if cap else 3
    tiles = [(t, t) for t in (block, block // 2, block // 4)]
    if arch.name in shape.wide_v and head_dim == 2 * block:
        # Not at head dim 256: a [64, 128] tile pair needs 272-305 KB at 2 stages there (fla-gen aot, sm90).
        tiles.insert(0, (block, head_dim))
    bk_src = []
    if shape.max_block_k:
        bk_cap, bk_id = shape.max_block_k
        tiles = [(min(bk, bk_cap), bv) for bk, bv in tiles]
        bk_src = [bk_id]
    for bk, bv in tiles:
        sizes = tile_dims(chunk_size, bk, bv)
        if stages := _most_stages_that_fit(shape, sizes, elem, most, budget):
            used = _smem_bytes(shape, sizes, elem, stages)
            wide = " (one V tile: the [BT, BT] product serves all of V at once)" if bv > block else ""
            what = (f"one program per {sub_chunk}-token sub-chunk, K in {bk}-wide tiles" if shape.sub_chunk
                    else f"{bk}x{bv} tiles{wide}")
            rule = ["wide-v"] if bv > block else []
            return _config(bk, bv, warps, stages, ["tiles", *rule, *cap_src, *bk_src, warps_src],
                           f"{what}, {stages} stage(s): ~{used // 1024} KB of {arch.smem_per_block // 1024} KB "
                           f"shared memory; {warps_why}")
    raise PlanError(f"kernel {shape.stage} does not fit {arch.name}'s shared memory even with 16-wide tiles")


def plan_fused_walk(rec: Recurrence | KernelFeatures, algorithm: str, shape: KernelShape, arch: ArchInfo, dtype: str,
                    head_dim: int, chunk_size: int) -> LaunchConfig:
    """The config of fwd_fused, the forward that walks the chunks with a whole-K state and writes the outputs
    in one kernel: the measured entry of fla_gen/tuned.py FUSED_WALK for the target (algorithm, a gate or not,
    head dim), its V tile halved (to 16) until 2 or more pipeline stages fit the target's shared memory, with
    the share of the SMs its grid must reach at run time; min_sm_share None on a target without an entry, where
    it measured slower, or where no tile fits (the launcher then always takes fwd_h + fwd_o)."""
    gated = kernel_features(rec).any_decay
    if arch.name not in FUSED_WALK:
        return _never_launched(head_dim, "fused-walk-unmeasured", "not measured on this target, and on the "
                                                                  "mma.sync targets its tiles spill (fla-gen aot)")
    walk = FUSED_WALK[arch.name][(algorithm, gated, head_dim)]
    if walk.min_sm_share is None:
        return _never_launched(head_dim, walk.source, f"with a gate at head dim {head_dim} it was no faster than "
                                                      f"fwd_h + fwd_o on any grid measured")
    # The whole limit, not the 0.8 of plan_kernel: the measured [256, 32] at 3 stages models at 225 KB and
    # builds at 217 KB of sm90's 227 KB (fla-gen aot, which checks every planned build against the limit).
    budget = arch.smem_per_block
    elem = _element_bytes(dtype)
    bv = min(walk.block_v, head_dim)
    while bv >= 16:
        sizes = tile_dims(chunk_size, head_dim, bv)
        fit = _most_stages_that_fit(shape, sizes, elem, walk.num_stages, budget)
        if fit >= 2:
            used = _smem_bytes(shape, sizes, elem, fit)
            grouped = (f" where each key head serves {walk.inverse_min_group} or more value heads, else from "
                       f"fwd_wu's W and U" if walk.inverse_min_group > 1 else "")
            inverse = (f"; v_new from fwd_solve's inverse in the walk (no fwd_wu in the forward){grouped}"
                       if walk.inverse_source else "")
            two_per_sm = _two_per_sm_launch(walk, shape, chunk_size, head_dim, elem, budget)
            packed = two_per_sm is not None and walk.two_per_sm_packed
            calls = ("a dense call, or a packed one whose work per SM at that tile is at least its longest walk,"
                     if packed else "a dense call")
            crowded = (f"; for {calls} whose grid at BV {two_per_sm[0]} reaches {two_per_sm[2]}x the SMs, BV "
                       f"{two_per_sm[0]} at {two_per_sm[1]} stages instead, two programs per SM "
                       f"(launch.fused_walk_launch)" if two_per_sm else "")
            return _config(head_dim, bv, walk.num_warps, fit,
                           ["fused-walk", walk.source, walk.inverse_source, walk.two_per_sm_source if two_per_sm
                            else "", walk.two_per_sm_packed_source if packed else ""],
                           f"whole K ({head_dim}) with a [K, {bv}] fp32 state tile, {walk.num_warps} warps, {fit} "
                           f"stages (~{used // 1024} KB of {arch.smem_per_block // 1024} KB), "
                           f"{'with' if gated else 'without'} a gate; taken while its V / BV * N*H programs reach "
                           f"{walk.min_sm_share}x the GPU's SMs (launch.fused_walk_block_v), else fwd_h + fwd_o"
                           f"{inverse}{crowded}", min_sm_share=walk.min_sm_share,
                           reads_inverse=bool(walk.inverse_source), inverse_min_group=walk.inverse_min_group,
                           two_per_sm=two_per_sm, two_per_sm_packed=packed)
        bv //= 2
    return _never_launched(head_dim, "fused-walk-no-fit", f"even [K, 16] tiles at 2 stages do not fit {arch.name}'s "
                                                          f"shared memory in {dtype}")


def _two_per_sm_launch(walk: FusedWalk, shape: KernelShape, chunk_size: int, head_dim: int, elem: int,
                       budget: int) -> tuple[int, int, float] | None:
    """The measured second launch of a fused walk (FusedWalk.two_per_sm), where two programs of it fit the target's
    shared memory by the model (each at most half of ``budget``); else None."""
    if walk.two_per_sm is None:
        return None
    block_v, stages, share = walk.two_per_sm
    bv = min(block_v, head_dim)
    fits = _smem_bytes(shape, tile_dims(chunk_size, head_dim, bv), elem, stages) <= budget // 2
    return (bv, stages, share) if fits else None


def _never_launched(head_dim: int, source: str, why: str) -> LaunchConfig:
    """A fwd_fused config the launcher never takes (min_sm_share None): the forward is fwd_h + fwd_o."""
    return _config(head_dim, 16, 4, 1, [source], f"never taken: {why}; fwd_h + fwd_o", min_sm_share=None)


def _with_split(cfg: LaunchConfig, split: tuple[str, str] | None, arch: str) -> LaunchConfig:
    """``cfg`` with a walk's run-time split rule (and its measurement, on the target it was measured on) cited."""
    if split is None:
        return cfg
    ids = [i for i in split if speaks_for(i, arch)]
    reason = f"{cfg.reason}; {explain(','.join(ids))}"
    return replace(cfg, reason=reason, source=",".join(dict.fromkeys([*cfg.source.split(","), *ids])))


def plan_algorithm(rec: Recurrence | KernelFeatures, algo: Algorithm, arch_name: str, dtype: str, head_dim: int,
                   bounded: bool = False, decode: DecodeWork | None = None) -> Plan:
    """The Plan of one algorithm for (arch, dtype, head-dim bucket): the rules above, then any
    measured entry of fla_gen/tuned.py for the same kernel and target. ``bounded``: the plan for calls
    whose gates have a lower bound, at the algorithm's ``bounded_chunk_size``; ``decode``: the decode
    kernel's inline transforms (default: ``decode_work(rec)`` for a Recurrence, none for bare features)."""
    if decode is None:
        decode = decode_work(rec) if isinstance(rec, Recurrence) else DecodeWork()
    if arch_name not in ARCHS:
        raise PlanError(f"unknown arch {arch_name!r}; known: {', '.join(ARCHS)}")
    if dtype not in DTYPES:
        raise PlanError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPES)}")
    if head_dim > 256 or head_dim < 1:
        raise PlanError(f"head dim {head_dim} is outside 1..256, the range these kernels tile")
    arch = ARCHS[arch_name]
    rec = kernel_features(rec)
    bucket = head_dim_bucket(head_dim)
    if bounded:
        if not algo.bounded_chunk_size:
            raise PlanError(f"{algo.name} has no plan for a gate lower bound")
        # The plan without a bound, which a bound only lets drop the run-time check of the gates: the 32-token
        # plan a bound used to select was 1.4x slower in the forward on the H200 (docs/performance.md).
        plan = plan_algorithm(rec, algo, arch_name, dtype, head_dim, decode=decode)
        if plan.chunk_size != algo.bounded_chunk_size:
            raise PlanError(f"{algo.name}: the bounded plan's {algo.bounded_chunk_size}-token chunks are not the "
                            f"{plan.chunk_size}-token chunks of the plan without a bound")
        gate_bound = gate_bound_for_chunk(plan.chunk_size)
        why = (f"{plan.chunk_size}-token chunks for gates >= {gate_bound:.4f}, as without a bound: every factor "
               f"exp(+-(G - G_m)) around the middle row stays below e^86 (fla's gate_bound_is_safe), so every K "
               f"block's pairwise decays are tensor-core dots, with no run-time check and no list of strong-gate "
               f"chunks")
        if _row_gate(rec):
            why = (f"{plan.chunk_size}-token chunks for calls with a gate lower bound >= {gate_bound:.4f}: with one "
                   f"log gate per token the pairwise decays are dots times [BT, BT] decays whatever the bound, so "
                   f"this is the plan without one")
        return replace(plan, chunk_size_reason=why, gate_bound=gate_bound)
    if algo.chunked:
        bt, bt_why = plan_chunk_size(rec, arch)
    else:
        bt, bt_why = 1, "token by token"
    # A measured entry (fla_gen/tuned.py) for the same target replaces the rule's config. fwd_fused has its own
    # rule (plan_fused_walk), which never refuses a target: the generic whole-K rule would, and a refused kernel
    # drops the whole plan row.
    kernels = tuple((k.stage, plan_fused_walk(rec, algo.name, k, arch, dtype, bucket, bt) if k.stage == "fwd_fused"
                     else tuned_config(arch_name, algo.name, k.stage, dtype, bucket)
                     or plan_kernel(k, arch, dtype, bucket, bt, _row_gate(rec), decode)) for k in algo.kernels)
    kernels = tuple((stage, _with_split(cfg, k.small_grid_split, arch_name))
                    for k, (stage, cfg) in zip(algo.kernels, kernels, strict=True))
    return Plan(arch_name, dtype, bucket, bt, bt_why, kernels)


def plan_table(rec: Recurrence | KernelFeatures, algo: Algorithm, bounded: bool = False,
               decode: DecodeWork | None = None) -> tuple[Plan, ...]:
    """Every (arch, dtype, head-dim bucket) plan of an algorithm that fits its target, in a fixed
    order; a combination with no plan is left out, and a call that needs it is refused on the host.
    ``bounded``, ``decode``: as plan_algorithm."""
    if decode is None:
        decode = decode_work(rec) if isinstance(rec, Recurrence) else DecodeWork()
    features = kernel_features(rec)
    plans = []
    for arch in ARCHS:
        for dtype in DTYPES:
            for hd in HEAD_DIM_BUCKETS:
                try:
                    plans.append(plan_algorithm(features, algo, arch, dtype, hd, bounded, decode))
                except PlanError:
                    continue
    return tuple(plans)
