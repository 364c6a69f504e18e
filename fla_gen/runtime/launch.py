"""Host-side arithmetic shared by the chunked launchers of every generated op: tile sizes, chunk
counts and the tl.dot precision; and the one runtime kernel they launch themselves, the group sum of
grouped heads' dq and dk. Nothing here reads a tensor's values (no device sync)."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import torch

from fla_gen.runtime.group_sum import sum_groups_kernel
from fla_gen.runtime.plan_types import STATE_ROW_BLOCKS, LaunchConfig, Plan
from fla_gen.runtime.tracing import shapes_only


# Plain-Python twins of triton.cdiv and triton.next_power_of_2: since Triton 3.6 those are
# constexpr_functions whose host-side call unwraps every argument (~4 us each, several per launch).
def cdiv(x: int, y: int) -> int:
    """ceil(x / y) for positive ints (triton.cdiv)."""
    return -(-x // y)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for n >= 1 (triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length()


# The tile of a head dim narrower than this. With V = 16 (K = 128, bf16, H200, Triton 3.6) and 16-wide tiles,
# KDA's fwd_o read shared memory out of bounds in the dot P @ v_new (compute-sanitizer; an illegal address) and the
# gated delta rule's output was wrong (relative error 0.998) with no fault; V = 32 and 64 were exact. A [64, 16]
# 16-bit wgmma operand has 32-byte rows, a width at which Triton does not pad small-N wgmma operands in shared
# memory, so the MMA can read past them. A 16-wide head dim therefore takes a 32-wide tile, half of it masked. Wider
# dims keep the plan's tiles, 16 included: the whole-K walks' split to BV = 16 and the head-dim-256 plans are
# measured exact.
HEAD_DIM_MIN_TILE = 32


def dot_tile(block: int, dim: int) -> int:
    """A tile for a head dim: the plan's block, at most the padded dim, at least 16 (tl.dot's minimum); a dim
    narrower than HEAD_DIM_MIN_TILE gets HEAD_DIM_MIN_TILE."""
    if dim < HEAD_DIM_MIN_TILE:
        return HEAD_DIM_MIN_TILE
    return max(16, min(block, next_power_of_2(dim)))


def whole_dim_tile(dim: int) -> int:
    """A tile that covers a whole head dim (the sequential kernels contract over all of K), at least
    HEAD_DIM_MIN_TILE."""
    return max(HEAD_DIM_MIN_TILE, next_power_of_2(dim))


_forced_sm_count: int | None = None


@contextlib.contextmanager
def forced_sm_count(sms: int) -> Iterator[None]:
    """Launch as on a GPU with ``sms`` SMs whatever the device: ahead-of-time compiles and interpreter
    tests of the tiles that state_walk_tiles picks for a small grid."""
    global _forced_sm_count
    previous, _forced_sm_count = _forced_sm_count, sms
    try:
        yield
    finally:
        _forced_sm_count = previous


_NO_BACKWARD: contextvars.ContextVar[bool] = contextvars.ContextVar("fla_gen_no_backward", default=False)


@contextlib.contextmanager
def no_backward() -> Iterator[None]:
    """A forward run where nothing will take its gradient (torch_op.call_op's direct call without autograd):
    launchers need not keep what only their backward reads."""
    token = _NO_BACKWARD.set(True)
    try:
        yield
    finally:
        _NO_BACKWARD.reset(token)


def backward_follows() -> bool:
    """Whether a backward may read what this forward keeps (its ``saved`` tensors): True unless inside
    no_backward, so a forward under autograd, a registered op's call and a trace all keep them."""
    return not _NO_BACKWARD.get()


# (the state entering each segment, what carries a state across one or None), as the chunk-state walks return it
SegmentStates = tuple[torch.Tensor, torch.Tensor | None]


def saved_segment_states(seg_states: SegmentStates | None, cu_seqlens: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """What a forward over sequence segments (fla_gen/runtime/segments.py) keeps for its backward, whose recompute
    of the chunk states then starts every segment from it instead of walking the segments from zero and scanning
    them again. ``seg_states`` (entry, carry), as the chunk-state walks return it (None: the call walked whole
    sequences): ``entry`` [S, H, K, V] float32, the state entering each segment, then ``carry``, what carries a
    state across a segment where the family has one (its total log gate [S, H] or [S, H, K], its transition
    [S, H, K, K]). The op's saved list holds tensors only, so no None; () under no_backward, and for a packed
    batch (``cu_seqlens`` given): tracing with fake tensors only bounds its segment count (segments.segment_tables'
    shapes_only), while a saved tensor's shape must be the traced one."""
    if seg_states is None or not keeps_segment_states(cu_seqlens):
        return ()
    entry, carry = seg_states
    return (entry,) if carry is None else (entry, carry)


def keeps_segment_states(cu_seqlens: torch.Tensor | None) -> bool:
    """Whether saved_segment_states keeps a call's entering states (``cu_seqlens``: the call's)."""
    return backward_follows() and cu_seqlens is None


class FoldedScan(NamedTuple):
    """What an ungated forward walk over sequence segments reads to compute the state entering its segment itself,
    from its sequence's earlier segments, instead of from a segment_scan launch before it (folds_segment_scan):
    ``seg_state`` [S, H, K, V] float32 (each segment's walk from zero), ``seg_entry`` [S, H, K, V] float32 where
    the walk stores the entering states for the backward (None: saved_segment_states keeps none), and the
    segments' ``first_segment`` and ``sequence`` tables (segments.SegmentTables). All None: the walk does not
    scan."""

    seg_state: torch.Tensor | None
    seg_entry: torch.Tensor | None
    first_segment: torch.Tensor | None
    sequence: torch.Tensor | None


NO_FOLDED_SCAN = FoldedScan(None, None, None, None)

# The most segments of one sequence for which each forward walk program scans its sequence's earlier segments
# itself (FoldedScan): segment s reads the s states before it, so the reads grow as S^2 / 2 per sequence and
# head, against the S of a segment_scan launch. 16 is what a B = 1, H = 16 call splits into on 132 SMs, where the
# folded walk measured the scanned one's kernel time (docs/performance.md); more segments are not measured.
FOLDED_SCAN_MAX_SEGMENTS = 16


def folds_segment_scan(least_segments: int, most_segments: int) -> bool:
    """Whether a forward walk over a call's segments, of which its sequences have ``least_segments`` to
    ``most_segments`` (segments.SegmentTables), computes the states entering them itself, one launch fewer than a
    segment_scan before it: where no sequence has more than FOLDED_SCAN_MAX_SEGMENTS, and none is empty (the last
    segment of a sequence stores its final state: an empty one has none)."""
    return least_segments >= 1 and most_segments <= FOLDED_SCAN_MAX_SEGMENTS


def resumed_segment_states(kept: Sequence[torch.Tensor]) -> SegmentStates | None:
    """saved_segment_states' tensors (the tail of a backward's saved list) as (entry, carry or None), or None where
    the forward kept none (it walked whole sequences, or ran under no_backward)."""
    if not kept:
        return None
    return kept[0], (kept[1] if len(kept) > 1 else None)


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA ``device`` (read once per device, no sync); 0 elsewhere, so
    that Triton's interpreter runs the plan's tiles unchanged (unless forced_sm_count says otherwise)."""
    if _forced_sm_count is not None:
        return _forced_sm_count
    if device.type != "cuda":
        return 0
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def split_sm_count(cfg: LaunchConfig, device: torch.device) -> int:
    """The SM count a state walk splits its tiles for (state_walk_tiles): the device's, or 0 (no split)
    for a config pinned by a plan override, so that a sweep measures the tiles it asked for."""
    return 0 if cfg.pinned else sm_count(device)


STATE_WALK_MIN_TILE = 32


def state_walk_tiles(block_k: int, block_v: int, K: int, V: int, walks: int, sms: int) -> tuple[int, int]:
    """The [BK, BV] tiles of a sequential walk over the chunks whose grid is (K / BK, V / BV, walks):
    the plan's tiles, halved (the wider first, V on a tie; never below 32) while the grid has fewer
    programs than ``sms``. Each program walks every chunk of its sequence in turn, so a grid smaller
    than the SM count leaves SMs idle for the whole walk: at B = 1, T = 16384, H = 16, K = V = 128 the
    plan's 64x64 tiles give 64 programs on the H100's 132 SMs, 32x32 give 256 (fwd_h 0.403 -> 0.312 ms
    for simple_gla, 0.503 -> 0.371 for gla; at 4x4096x16x128, 256 programs already, 32x32 was slower).
    ``walks``: sequences times heads (N * H)."""
    BK, BV = block_k, block_v
    while cdiv(K, BK) * cdiv(V, BV) * walks < sms:
        if BV >= BK and BV > STATE_WALK_MIN_TILE:
            BV //= 2
        elif BK > STATE_WALK_MIN_TILE:
            BK //= 2
        else:
            break
    return BK, BV


WHOLE_K_WALK_MIN_BLOCK_V = 16


def whole_k_walk_block_v(block_v: int, V: int, walks: int, sms: int) -> int:
    """The V tile of a sequential walk that holds all of K in one state tile (grid (V / BV, walks)): the
    plan's, halved (never below 16) while the grid fills at most half of ``sms``. K cannot split there
    (v_new = U - W h contracts over it), so only V gives programs. Measured on the H100 (fwd_h of the
    delta family; fla_gen/measurements.py, h100-split-whole-k): at 1x16384x16x128, 64 programs on 132 SMs, BV 32 -> 16
    took fwd_h 0.452 -> 0.420 ms (delta_rule) and 0.690 -> 0.634 (gated_delta_rule); at 2x8192x8x256, 128
    programs, BV 16 measured 0.589 ms against 0.353-0.374 at 32, hence half the SMs, not all of them. The
    backward walk (bwd_dh) splits by the same rule: 0.349 -> 0.294 ms at 1x16384x16x128. A tile that halves
    without adding programs (it already covers V: a head dim narrower than HEAD_DIM_MIN_TILE) stays.
    ``walks``: sequences times heads (N * H); ``sms`` 0 (CPU, or a pinned plan) keeps the plan's tile."""
    BV = block_v
    while 2 * cdiv(V, BV) * walks <= sms and BV > WHOLE_K_WALK_MIN_BLOCK_V and cdiv(V, BV // 2) > cdiv(V, BV):
        BV //= 2
    return BV


FUSED_WALK_MIN_BLOCK_V = 32


def fused_walk_block_v(block_v: int, V: int, walks: int, sms: int, min_sm_share: float | None) -> int:
    """The V tile of the forward that walks the chunks and writes the outputs in one kernel (fwd_fused,
    grid (V / BV, walks)), or 0 when the launcher should take the state walk + the chunk-parallel output
    kernel instead. The plan's tile halves (to 32 at least) while the grid holds fewer than
    ``min_sm_share`` * ``sms`` programs, and 0 if it still does: each program walks a whole sequence, so a
    small grid leaves SMs idle for the whole call. The share is the plan's (LaunchConfig.min_sm_share, with
    its measurements in the reason). ``walks``: sequences times heads (N * H); ``sms`` 0 (CPU, or a pinned
    plan): the plan's tile, always. ``min_sm_share`` None (the plan never takes the kernel): 0."""
    if min_sm_share is None:
        return 0
    BV = block_v
    while cdiv(V, BV) * walks < min_sm_share * sms and BV > FUSED_WALK_MIN_BLOCK_V:
        BV //= 2
    return BV if cdiv(V, BV) * walks >= min_sm_share * sms else 0


def walk_reads_inverse(cfg: LaunchConfig, group: int) -> bool:
    """Whether the delta family's fwd_fused builds v_new from fwd_solve's inverse (and fwd_wu does not run in the
    forward) at a call whose key heads each serve ``group`` value heads (HV / H; 1 ungrouped): the plan's
    reads_inverse from its inverse_min_group on. The inverse path reads k, which a group's value heads share,
    where the other reads a W per value head: measured, it gains most with grouped heads."""
    return cfg.reads_inverse and group >= cfg.inverse_min_group


# Programs per SM of a persistent launch over a device-side work list, and off CUDA (a few, so that the
# interpreter's programs stride through the list).
STRONG_WORK_PROGRAMS_PER_SM = 8
STRONG_WORK_PROGRAMS_OFF_CUDA = 3


def strong_work_programs(items: int, device: torch.device) -> int:
    """Programs of a persistent launch over a work list that a kernel before it wrote on the device (fwd_A over
    the sub-chunks of the strong-gated chunks fwd_A_chunk listed, at most ``items``): the host does not know the
    list's length without a sync, so the grid is sized to the device, STRONG_WORK_PROGRAMS_PER_SM per SM, each
    program striding through the list; never more than ``items``, never fewer than 1."""
    sms = sm_count(device)
    per_device = STRONG_WORK_PROGRAMS_PER_SM * sms if sms else STRONG_WORK_PROGRAMS_OFF_CUDA
    return max(1, min(items, per_device))


# The kernels of the forward that fwd_fused replaces.
SPLIT_FORWARD_STAGES = ("fwd_h", "fwd_o")


def walk_order(chunk_offsets: torch.Tensor | None, walks: int) -> torch.Tensor | None:
    """The order of a varlen call's (or its segments') ``walks`` state walks, longest first: the tail of its
    ``chunk_offsets`` [2 * walks + 1] (varlen.prepare_chunk_indices, segments.SegmentTables), or None for a dense
    call (``chunk_offsets`` None), whose walks are all alike."""
    return None if chunk_offsets is None else chunk_offsets[walks + 1:]


class PackedWalks(NamedTuple):
    """How the chunks of a packed call (cu_seqlens) spread over its walks, for the launch rules that depend on its
    longest walk: ``chunk_steps``, the chunks of all its sequences times the heads (the steps of all its
    (sequence, head) walks); ``longest_chunks``, the chunks of its longest sequence, also where the walks run over
    segments of it (the rule then keeps the plan's launch more often than the segments' length would: that case
    is not measured)."""

    chunk_steps: int
    longest_chunks: int


# A packed call known only to be bounded by its longest walk (no work known beside it: a traced call's, which launches
# nothing): the plan's launch, never the two-per-SM one.
LONGEST_WALK_BOUND = PackedWalks(0, 1)


def fused_walk_choice(cfg: LaunchConfig, V: int, walks: int, sms: int,
                      packed: PackedWalks | None) -> tuple[int, int]:
    """fwd_fused's (V tile, stages) on ``sms`` SMs for the plan's config ``cfg``, or (0, 0) for fwd_h + fwd_o.
    A dense call (``packed`` None) whose grid at the config's two-per-SM tile (LaunchConfig.two_per_sm) reaches
    its share of the SMs takes that tile and its stages: two programs per SM, one's start under the other's
    steps. A packed call takes it too where the config says so (two_per_sm_packed) and its work per SM at that
    tile, cdiv(V, BV) * chunk_steps / sms, is at least its longest walk: else that walk bounds the call, and two
    programs per SM would slow its steps. Otherwise fused_walk_block_v on the plan's tile, at the plan's stages.
    ``walks``: sequences (or sequence segments) times heads; ``sms`` 0 (CPU, or a pinned config): the plan's
    launch, always."""
    if cfg.min_sm_share is not None and cfg.two_per_sm is not None and sms > 0:
        block_v, stages, share = cfg.two_per_sm
        BV = dot_tile(block_v, V)
        balanced = packed is None or (cfg.two_per_sm_packed
                                      and cdiv(V, BV) * packed.chunk_steps >= sms * packed.longest_chunks)
        if balanced and cdiv(V, BV) * walks >= share * sms:
            return BV, stages
    BV = fused_walk_block_v(dot_tile(cfg.block_v, V), V, walks, sms, cfg.min_sm_share)
    return (BV, cfg.num_stages) if BV else (0, 0)


def fused_walk_launch(plan: Plan, V: int, walks: int, device: torch.device, packed: PackedWalks | None,
                      replaces: tuple[str, ...] = SPLIT_FORWARD_STAGES) -> tuple[int, int]:
    """fwd_fused's (V tile, stages) for this call, or (0, 0) for the kernels it ``replaces`` (default fwd_h +
    fwd_o): fused_walk_choice on the plan's fwd_fused config and the device's SM count. A plan override that pins
    one of those kernels but not fwd_fused runs them: an experiment that changes them (sweep_plans.py) must time
    them, not the walk. ``walks``: sequences (or segments) times heads; ``packed``: the call's PackedWalks (None:
    a dense call)."""
    cfg = plan.config("fwd_fused")
    if not cfg.pinned and any(plan.config(stage).pinned for stage in replaces):
        return 0, 0
    return fused_walk_choice(cfg, V, walks, split_sm_count(cfg, device), packed)


STATE_ROW_BLOCK = 64


def state_row_block(block_k: int) -> int:
    """Rows of one register block of a whole-K state walk that holds its [BK, BV] state as row blocks
    (the delta family's bwd_dh): 64, or BK when it is smaller."""
    if block_k > STATE_ROW_BLOCKS * STATE_ROW_BLOCK:
        raise ValueError(f"a state of {block_k} rows does not fit {STATE_ROW_BLOCKS} row blocks of {STATE_ROW_BLOCK}")
    return min(block_k, STATE_ROW_BLOCK)


def num_chunks(T: int, BT: int, chunk_indices: torch.Tensor | None) -> int:
    """Chunks per sequence of length T (dense), or of the whole packed batch (varlen: the rows of
    ``chunk_indices`` [NT, 2]), without a sync."""
    return cdiv(T, BT) if chunk_indices is None else chunk_indices.shape[0]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs keep full precision in tl.dot (the default would round them to tf32); with 16-bit inputs
    it applies to the dots whose operands a kernel keeps in fp32 (tf32 there)."""
    return "ieee" if dtype == torch.float32 else "tf32"


def factor_span(dtype: torch.dtype) -> float:
    """The largest |log| of a gate factor that a kernel may fold into a tensor-core operand of this dtype
    (x * exp(+-span)): fp16 tops out at 65504, so e^4 keeps |x| up to ~1000 finite; bf16 and fp32 share
    fp32's exponent range, and e^30 also keeps the masked-out entries of a [16, 16] product (up to
    e^60 |q| |k| K) finite."""
    return 4.0 if dtype == torch.float16 else 30.0


# fp32 values per program of the per-row transform kernels and per thread, per direction. Measured on the
# H100 at 4x4096x16x128 bf16 (gated_delta_rule_rope's transforms, each kernel alone; docs/performance.md),
# with rope's partner channels read by a second load instead of a tl.gather:
# - forward: 2048 (16 rows of 128 on 4 warps), 16 per thread: 0.104 ms (2.6 TB/s, 88% of a copy), against
#   0.157 at 8 rows and 0.156 at 16 rows on 8 warps;
# - backward: 1024 (8 rows of 128 on 4 warps), 8 per thread: 0.214 ms. 16 rows on 4 warps measured 0.167,
#   but spilled 20 B on sm89 and sm90 in the backward of an interleaved-rope spec
#   (tests/kernels/test_transforms.py), and 8 per thread is the tile with no spill anywhere.
ROW_TILE_ELEMENTS = {"fwd": 2048, "bwd": 1024}
ROW_TILE_PER_THREAD = {"fwd": 16, "bwd": 8}


def row_tile(rows: int, width: int, direction: str) -> tuple[int, int]:
    """Rows per program (BR) and warps of the per-row transform kernel of ``direction`` ("fwd" or "bwd"),
    for ``rows`` flat (token, head) rows ([B * T * H]) of padded width ``width`` (the widest head dim
    they hold).

    BR is a power of two with BR * width about ROW_TILE_ELEMENTS[direction], no more than the rows there
    are (padded to a power of two); the warps give each thread ROW_TILE_PER_THREAD[direction] values of a
    tile, 1 to 8 warps.
    """
    per_thread = ROW_TILE_PER_THREAD[direction]
    br = max(1, min(ROW_TILE_ELEMENTS[direction] // width, next_power_of_2(rows)))
    return br, max(1, min(8, br * width // (32 * per_thread)))


def tile_of_one_token(heads: int, rows_per_tile: int) -> bool:
    """Whether every tile of ``rows_per_tile`` flat (token, head) rows holds heads of a single token, so
    the tile shares one rope position (the tiles start at multiples of BR and a token's H rows are
    contiguous)."""
    return heads % rows_per_tile == 0


def group_partials(x: torch.Tensor, heads: int) -> torch.Tensor:
    """An empty [B, T, heads, K] buffer for the per-value-head gradient of a key-side input x [B, T, HK, K]
    (kernels that group heads: each of the heads value heads writes its own row): float32 when heads >
    HK, so that sum_groups adds unrounded partials, else x's dtype (no group: the buffer is the gradient)."""
    B, T, HK, K = x.shape
    return x.new_empty(B, T, heads, K, dtype=torch.float32 if heads != HK else x.dtype)


# [rows, K] elements per program of the group sum: 16 KB of fp32 per partial read, a few thousand programs at
# real sizes
_GROUP_SUM_TILE_ELEMENTS = 4096


def sum_groups(partials: torch.Tensor, key_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """The gradient [B, T, HK, K] of a key-side input, in ``dtype``, from its per-value-head partials
    [B, T, H, K] (``group_partials``; contiguous, fp32 when H > HK): key head i serves the value heads
    i * H // HK ... (i + 1) * H // HK - 1, so its gradient is their sum, one kernel (runtime/group_sum.py). The
    partials themselves when H == HK (they were allocated in the input's dtype then)."""
    B, T, H, K = partials.shape
    if H == key_heads:
        return partials
    if H % key_heads:
        raise ValueError(f"sum_groups: {H} value heads do not split into groups of the {key_heads} key heads")
    if not partials.is_contiguous():
        raise ValueError("sum_groups: the partials must be contiguous [B, T, H, K] (launch.group_partials)")
    out = partials.new_empty(B, T, key_heads, K, dtype=dtype)
    if shapes_only():  # a fake implementation (torch.compile): the shape is the answer, no kernel runs
        return out
    rows = B * T * key_heads
    BK = whole_dim_tile(K)
    BR = max(1, _GROUP_SUM_TILE_ELEMENTS // BK)
    sum_groups_kernel[(cdiv(rows, BR),)](partials, out, rows, G=H // key_heads, K=K, BR=BR, BK=BK, num_warps=4)
    return out
