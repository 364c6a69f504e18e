"""Host-side arithmetic shared by the chunked launchers of every generated op: tile sizes, chunk
counts and the tl.dot precision. Nothing here reads a tensor's values (no device sync)."""

from __future__ import annotations

import torch
import triton


def dot_tile(block: int, dim: int) -> int:
    """A tile for a head dim: the plan's block, at most the padded dim, at least 16 (tl.dot's minimum)."""
    return max(16, min(block, triton.next_power_of_2(dim)))


def whole_dim_tile(dim: int) -> int:
    """A tile that covers a whole head dim (the sequential kernels contract over all of K)."""
    return max(16, triton.next_power_of_2(dim))


def num_chunks(T: int, BT: int, chunk_indices: torch.Tensor | None) -> int:
    """Chunks per sequence of length T (dense), or of the whole packed batch (varlen: the rows of
    ``chunk_indices`` [NT, 2]), without a sync."""
    return triton.cdiv(T, BT) if chunk_indices is None else chunk_indices.shape[0]


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs keep full precision in tl.dot (the default would round them to tf32); 16-bit inputs
    ignore the setting."""
    return "ieee" if dtype == torch.float32 else "tf32"
