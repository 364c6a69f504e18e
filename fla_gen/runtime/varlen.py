"""Index tables that map a program of a chunked kernel to (sequence, chunk) under cu_seqlens."""

from __future__ import annotations

import torch


def prepare_chunk_indices(cu_seqlens_cpu: torch.Tensor, chunk_size: int, device: torch.device):
    """Build the chunk tables for a packed batch.

    Args:
        cu_seqlens_cpu: ``[N+1]`` int tensor on the CPU, validated (starts at 0, non-decreasing).
        chunk_size: BT, the chunk length of the plan.
        device: where the kernels run.

    Returns:
        chunk_indices: ``[NT, 2]`` int32, row ``i`` = (sequence n, chunk index within n) of
            the i-th chunk over the whole packed batch; zero-length sequences own no chunk.
        chunk_offsets: ``[N+1]`` int32, the first global chunk of each sequence (so the
            per-chunk states of sequence n live at ``h[chunk_offsets[n] + c]``).
    """
    lens = (cu_seqlens_cpu[1:] - cu_seqlens_cpu[:-1]).to(torch.int64)
    n_chunks = (lens + chunk_size - 1) // chunk_size
    chunk_offsets = torch.zeros(len(lens) + 1, dtype=torch.int64)
    chunk_offsets[1:] = torch.cumsum(n_chunks, 0)
    total = int(chunk_offsets[-1])
    seq_ids = torch.repeat_interleave(torch.arange(len(lens)), n_chunks)
    within = torch.arange(total) - chunk_offsets[:-1].repeat_interleave(n_chunks)
    chunk_indices = torch.stack([seq_ids, within], 1).to(torch.int32)
    return chunk_indices.to(device), chunk_offsets.to(torch.int32).to(device)
