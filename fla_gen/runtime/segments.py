"""Sequence segments: a long sequence's chunk walk split into pieces that run side by side.

The sequential kernels (the state walks fwd_h, fwd_fused, bwd_dh) run one program per (sequence, head, tile)
over every chunk of the sequence. With few sequences and heads (B * H = 16 at B = 1) that grid leaves most SMs
idle for the whole walk. The launchers of an algorithm with a SegmentRule (fla_gen/plan.py) split each sequence
into segments of whole chunks:

1. each segment's state from a zero start, all segments at once (the walk kernel in segment mode, with no
   per-chunk stores), and how a state crosses the segment: its total log gate where the transition is a
   diagonal decay (linear attention, scalar and per-key-channel gates), or, in the delta family and DPLR, its
   [K, K] transition M_s, the product of its chunks' transitions (the same walk from the identity, no values);
2. a scan over each sequence's segments: entering(s + 1) = exp(gate(s)) * entering(s) + local(s), or
   M_s entering(s) + local(s), started at the initial state; the last one is the final state (the
   segment_scan kernel);
3. the walk again, every segment from its entering state, writing what the call needs (outputs, or the
   per-chunk states), all segments at once.

The backward recomputes the states over the segments, then runs the same three steps in reverse for the state
gradient: the diagonal families' scan reuses the segments' total gates, the others' each M_s transposed (the
gradient crosses a segment by the adjoint of its affine map, which the recompute's transitions give).

Segments are whole chunks, so the chunk numbering (the per-chunk states h[chunk], the chunk-parallel kernels) is
the unsplit call's: a segment is a packed sequence of the segment-mode walk, and only the walks see segments.

Nothing here reads a tensor's values on the device: the tables come from shapes, or from the CPU copy of
``cu_seqlens`` that the chunk tables already need.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from fla_gen.runtime.launch import cdiv, sm_count
from fla_gen.runtime.plan_types import SegmentRule
from fla_gen.runtime.varlen import int32_tables_on, sequence_chunks, walk_order

# The narrowest V tile a walk takes to make programs (launch.FUSED_WALK_MIN_BLOCK_V, launch.STATE_WALK_MIN_TILE):
# one (sequence, head) walk is at most V / 32 programs.
WALK_MIN_BLOCK_V = 32


@dataclass(frozen=True)
class SegmentTables:
    """The segments of one call, as the segment-mode kernels index them.

    ``cu_seqlens``: [S + 1] int32, the token bounds of every segment in the flattened [B * T] tokens (a
    segment is a packed sequence of the segment-mode walks); ``chunk_offsets``: [2S + 1] int32, the first
    chunk of each segment in the call's chunk numbering, then the order of the walks over the segments
    (varlen.walk_order); ``first_segment``: [N + 1] int32, the first segment
    of each sequence (the scan's bounds); ``sequence``: [S] int32, the sequence of each segment (a walk that
    scans its sequence's earlier segments itself, launch.folds_segment_scan); ``count``: S;
    ``most_segments`` / ``least_segments``: the segments of the sequence that has most / fewest (0: an empty
    sequence, whose final state no segment's walk stores).
    """

    cu_seqlens: torch.Tensor
    chunk_offsets: torch.Tensor
    first_segment: torch.Tensor
    sequence: torch.Tensor
    count: int
    most_segments: int
    least_segments: int


_forced_segment_chunks: int | None = None


@contextlib.contextmanager
def forced_segment_chunks(chunks: int) -> Iterator[None]:
    """Split every call's sequences into segments of ``chunks`` chunks (0: never split), whatever the
    rule says: interpreter tests of the segment path, and GPU sweeps of the segment length."""
    global _forced_segment_chunks
    if chunks < 0:
        raise ValueError(f"forced_segment_chunks: chunks must be >= 0, got {chunks}")
    previous, _forced_segment_chunks = _forced_segment_chunks, chunks
    try:
        yield
    finally:
        _forced_segment_chunks = previous


def plan_segment_chunks(total_chunks: int, longest_chunks: int, walks: int, heads: int, K: int, V: int, sms: int,
                        rule: SegmentRule) -> int:
    """Chunks per segment for a call, or 0 to walk whole sequences.

    ``total_chunks``: chunks of all sequences; ``longest_chunks``: of the longest one; ``walks``: sequences
    times heads (N * H, value heads); ``heads``: H; ``K``, ``V``: the key and value head dims; ``sms``: the GPU's
    SM count (0 on the CPU: no split). A walk makes at most V / WALK_MIN_BLOCK_V programs; while the walks make
    fewer than ``rule.below_sm_share * sms`` that way, the sequences split into equal segments, as many as give
    at most ``rule.walks_per_sm`` (segment, head) walks per SM over all sequences, of ``rule.min_chunks`` chunks at
    least, and only if the longest sequence then has ``rule.min_segments`` segments or more. Never above
    ``rule.max_key_dim``, not even under ``forced_segment_chunks``.
    """
    if K > rule.max_key_dim:
        return 0
    if _forced_segment_chunks is not None:
        return _forced_segment_chunks if 0 < _forced_segment_chunks < longest_chunks else 0
    if sms <= 0 or walks * cdiv(V, WALK_MIN_BLOCK_V) >= rule.below_sm_share * sms:
        return 0
    # at most walks_per_sm * sms (segment, head) walks: one segment more would add a partial wave of programs
    segments = max(1, int(rule.walks_per_sm * sms) // heads)
    chunks = max(rule.min_chunks, cdiv(total_chunks, segments))
    return chunks if cdiv(longest_chunks, chunks) >= rule.min_segments else 0


def describe_segment_split(total_chunks: int, longest_chunks: int, walks: int, heads: int, K: int, V: int,
                           sms: int, rule: SegmentRule) -> str:
    """Why plan_segment_chunks decides what it decides for these arguments, in one line (``fla-gen plan --call``)."""
    chunks = plan_segment_chunks(total_chunks, longest_chunks, walks, heads, K, V, sms, rule)
    programs = walks * cdiv(V, WALK_MIN_BLOCK_V)
    share = rule.below_sm_share
    if K > rule.max_key_dim:
        return f"not split: key head dim {K} > {rule.max_key_dim}, the most this algorithm's scan holds"
    if _forced_segment_chunks is not None:
        why = f"forced to {_forced_segment_chunks} chunks per segment"
    elif sms <= 0:
        why = "no SM count (not a GPU)"
    elif share == 0:
        why = f"this algorithm's rule ({rule.source}) never splits a call by itself; forced_segment_chunks does"
    elif programs >= share * sms:
        why = (f"{walks} (sequence, head) walks of at most {cdiv(V, WALK_MIN_BLOCK_V)} programs (V/{WALK_MIN_BLOCK_V}) "
               f"make {programs} >= {share:g} x {sms} SMs")
    else:
        why = (f"{walks} walks of at most {cdiv(V, WALK_MIN_BLOCK_V)} programs make {programs} < "
               f"{share:g} x {sms} SMs; at most {rule.walks_per_sm:g} (segment, head) walks per SM, "
               f"segments of {rule.min_chunks} chunks at least, {rule.min_segments} of them at least")
    if not chunks:
        too_short = _forced_segment_chunks is not None or (sms > 0 and programs < share * sms)
        return f"not split: {why}" + (f", and the longest sequence ({longest_chunks} chunks) is too short"
                                      if too_short else "")
    return f"split into segments of {chunks} chunks: {why}"


def _tables(bounds: np.ndarray, chunk_size: int, chunks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment token bounds [S + 1], first chunk of each segment [S + 1] and the walk order [S], first segment
    of each sequence [N + 1] and the sequence of each segment [S]) for sequences with token ``bounds`` [N + 1]
    (int64, non-decreasing)."""
    seq_chunks = sequence_chunks(bounds, chunk_size)
    seq_segments = (seq_chunks + chunks - 1) // chunks
    first_segment = np.zeros(len(seq_chunks) + 1, dtype=np.int64)
    np.cumsum(seq_segments, out=first_segment[1:])
    first_chunk = np.zeros(len(seq_chunks) + 1, dtype=np.int64)
    np.cumsum(seq_chunks, out=first_chunk[1:])
    seq = np.repeat(np.arange(len(seq_chunks)), seq_segments)
    within = np.arange(first_segment[-1]) - first_segment[:-1][seq]
    starts = bounds[:-1][seq] + within * chunks * chunk_size
    seg_bounds = np.append(starts, bounds[-1]) if len(starts) else bounds[:1].copy()
    seg_chunks = np.append(first_chunk[:-1][seq] + within * chunks, first_chunk[-1])
    return (seg_bounds, np.concatenate([seg_chunks, walk_order(np.diff(seg_chunks))]),
            np.concatenate([first_segment, seq]))


def _segment_tables_of(bounds: np.ndarray, chunk_size: int, chunks: int, device: torch.device) -> SegmentTables:
    tables = _tables(bounds, chunk_size, chunks)
    N = len(bounds) - 1
    per_sequence = np.diff(tables[2][:N + 1])  # segments of each sequence, from their first segments
    most, least = (int(per_sequence.max()), int(per_sequence.min())) if N else (0, 0)
    cu, offsets, first_and_sequence = int32_tables_on(device, *tables)
    # one copy to the device for both tables: views of it
    return SegmentTables(cu, offsets, first_and_sequence[:N + 1], first_and_sequence[N + 1:], cu.shape[0] - 1, most,
                         least)


@functools.lru_cache(maxsize=64)
def _dense_tables(B: int, T: int, chunk_size: int, chunks: int, device: torch.device) -> SegmentTables:
    return _segment_tables_of(np.arange(B + 1, dtype=np.int64) * T, chunk_size, chunks, device)


def _placeholder_tables(count: int, N: int, most: int, least: int, device: torch.device) -> SegmentTables:
    empty = functools.partial(torch.empty, dtype=torch.int32, device=device)
    return SegmentTables(empty(count + 1), empty(2 * count + 1), empty(N + 1), empty(count), count, most, least)


def segment_tables(B: int, T: int, H: int, K: int, V: int, chunk_size: int, num_sequences: int | None,
                   bounds: torch.Tensor | None, device: torch.device, rule: SegmentRule,
                   shapes_only: bool = False) -> SegmentTables | None:
    """The segments of a call over k [B, T, *, K] and v [B, T, H, V] (H: the value heads the walks run over), or
    None when its sequences are walked whole.

    ``num_sequences``: N of a packed batch (B == 1, ``cu_seqlens`` [N + 1]), None for a dense one;
    ``bounds``: the CPU copy of that ``cu_seqlens`` (validated; None only with ``shapes_only``). ``shapes_only``
    (tracing with fake tensors: no values): uninitialized tables of the call's segment count (a packed batch: the
    most segments it could have), which size scratch buffers only, and nothing cached. Dense tables are cached per
    shape. ``rule``: the algorithm's (plan_segment_chunks).
    """
    sms = sm_count(device)
    if num_sequences is None:
        nt = cdiv(T, chunk_size)
        chunks = plan_segment_chunks(B * nt, nt, B * H, H, K, V, sms, rule)
        if not chunks:
            return None
        if shapes_only:
            return _placeholder_tables(B * cdiv(nt, chunks), B, cdiv(nt, chunks), cdiv(nt, chunks), device)
        return _dense_tables(B, T, chunk_size, chunks, device)
    N = num_sequences
    if shapes_only:
        nt = cdiv(T, chunk_size)
        chunks = plan_segment_chunks(nt, nt, N * H, H, K, V, sms, rule)
        return _placeholder_tables(cdiv(nt, chunks) + N, N, cdiv(nt, chunks), 0, device) if chunks else None
    values = bounds.numpy().astype(np.int64)
    seq_chunks = sequence_chunks(values, chunk_size)
    longest = int(seq_chunks.max()) if N else 0
    chunks = plan_segment_chunks(int(seq_chunks.sum()), longest, N * H, H, K, V, sms, rule)
    return _segment_tables_of(values, chunk_size, chunks, device) if chunks else None
