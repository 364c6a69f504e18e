"""fwd_A's whole-chunk programs (fwd_A_chunk_kernel, templates/kernels/_channel_decay.jinja) in Triton's interpreter,
KDA and GLA against their derived float64 references.

A chunk whose gates move at most the dtype's factor span (launch.factor_span: 30 in fp32, 4 in fp16) about its
reference token is built whole through that token; any other chunk is flagged for the 16-token sub-chunks (by KDA's
cumsum kernel, by GLA's fwd_A_chunk itself). The reference token is the chunk's middle valid one, except in GLA's
fwd_A_chunk on 32-bit and bf16 inputs, where it is the last.
The inputs put both kinds in one call: weak gates (-0.09 U(0, 1) per token and channel: at most 2.9 over half a
chunk) with strong ones (-5 U(0, 1): tens over half a chunk) in some chunks. Each call's routes are recorded and
compared with the ones the gates call for, so a test fails when a chunk takes the wrong route, and the reference
comparison (outputs, final state, every gradient; allocations poisoned) fails when a route builds a wrong product.
"""

import importlib

import pytest
import torch

from fla_gen.runtime import launch
from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference
from tests.support import chunk_ranges, generated, poisoned_allocations, recurrence

BT = 64


class RecordedFlags:
    """A kernel launcher that also keeps a copy of the int8 routes tensor each launch read (the cumsum's), and of
    the int32 work list it wrote for fwd_A where it has one (KDA's: its count, then the strong chunks as
    i_bh * NT + i_t)."""

    def __init__(self, kernel):
        self.kernel, self.flags, self.lists = kernel, [], []

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.kernel[grid](*args, **kwargs)
            names = self.kernel.arg_names
            self.flags.append(args[names.index("strong")].clone())
            if "strong_chunks" in names:
                self.lists.append(args[names.index("strong_chunks")].clone())
        return run


def expected_flags(g: torch.Tensor, ranges, span: float, last: bool) -> torch.Tensor:
    """[B * H, NT] int8: 1 where a chunk's cumulative gate moves more than ``span`` about its reference token (the
    last valid one with ``last``, else the middle one)."""
    B, _, H, _ = g.shape
    flags = torch.zeros(B * H, 1 + max(c for _, c, _, _ in ranges), dtype=torch.int8)
    for b, c, t0, t1 in ranges:
        G = g[b, t0:t1].double().cumsum(0)  # [n, H, K]
        moved = (G - G[t1 - t0 - 1 if last else (t1 - t0 - 1) // 2]).abs().amax(dim=(0, 2))  # [H]
        flags[b * H:(b + 1) * H, c] = (moved > span).to(torch.int8)
    return flags


def mixed_gates(B, T, H, K, strong_tokens: list[tuple[int, int]], seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    g = -0.09 * torch.rand(B, T, H, K, generator=gen)
    for t0, t1 in strong_tokens:
        g[:, t0:t1] = -5.0 * torch.rand(B, t1 - t0, H, K, generator=gen)
    return g


CASES = [
    # op, dtype, (B, T, H, K, V), cu_seqlens, tokens with strong gates
    ("kda", torch.float32, (2, 200, 2, 32, 48), None, [(64, 128)]),
    ("kda", torch.float16, (1, 150, 2, 32, 48), [0, 37, 37, 150], [(100, 110)]),
    ("gla", torch.float32, (1, 150, 2, 100, 40), [0, 70, 70, 150], [(10, 20)]),
    ("gla", torch.float16, (2, 160, 2, 32, 40), None, [(128, 160)]),
]


@pytest.mark.parametrize(("op", "dtype", "dims", "cu_seqlens", "strong_tokens"), CASES,
                         ids=["kda-fp32", "kda-fp16-varlen", "gla-fp32-varlen-K100", "gla-fp16"])
def test_whole_chunks_beside_sub_chunks(monkeypatch, op, dtype, dims, cu_seqlens, strong_tokens):
    B, T, H, K, V = dims
    pkg = generated(op)
    module = importlib.import_module(f"generated.{op}.chunk")
    recorder = RecordedFlags(getattr(module, f"{op}_fwd_A_chunk_kernel"))
    monkeypatch.setattr(module, f"{op}_fwd_A_chunk_kernel", recorder)
    x = sample_inputs(recurrence(op), B, T, H, K, V, dtype, seed=21)
    x["g"] = mixed_gates(B, T, H, K, strong_tokens, seed=22)
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    result = compare_with_reference(getattr(pkg, f"chunk_{op}"), getattr(pkg, f"{op}_reference"),
                                    {**x, "initial_state": torch.randn(N, H, K, V)}, dtype, name=f"chunk_{op}",
                                    guard=poisoned_allocations, cu_seqlens=cu)
    assert not result.failures(), f"{result.name} {dtype}: over tolerance {result.failures()} (all {result.errors})"
    last = op == "gla" and dtype != torch.float16
    want = expected_flags(x["g"], chunk_ranges(B, T, cu_seqlens, BT), launch.factor_span(dtype), last)
    assert 0 < int(want.sum()) < want.numel(), "the case should hold chunks of both kinds"
    assert recorder.flags, "fwd_A_chunk_kernel never ran"
    for flags in recorder.flags:  # [NF, B * H, NT]: KDA's one row per K tile of the cumsum's launch, GLA's one
        routes = flags.cpu().reshape(-1, *want.shape).amax(0)
        assert torch.equal(routes, want), f"routes {routes.tolist()} against {want.tolist()}"
    # fwd_A's work list (two row sets): every strong chunk once, in any order, and nothing else
    assert bool(recorder.lists) == (op == "kda"), len(recorder.lists)
    flagged = sorted(want.flatten().nonzero().flatten().tolist())
    for work in recorder.lists:
        count = int(work[0])
        assert sorted(work[1:1 + count].tolist()) == flagged, (work[:1 + count].tolist(), flagged)


@pytest.mark.parametrize(("items", "sms", "expected"), [
    # the H100's 132 SMs: 8 programs each, whatever the call's size (16384 sub-chunks at 4x4096x16x128) ...
    (16384, 132, 8 * 132),
    # ... never more programs than sub-chunks, never none
    (40, 132, 40),
    (0, 132, 1),
    # off CUDA three, so that the interpreter's programs each take several items
    (16384, 0, 3),
])
def test_strong_work_programs(items, sms, expected):
    with launch.forced_sm_count(sms):
        assert launch.strong_work_programs(items, torch.device("cpu")) == expected


def test_persistent_programs_cover_every_strong_chunk(monkeypatch):
    """KDA's fwd_A programs stride through the work list: with one program (every item in turn) and with more
    programs than items, every chunk strong, against the float64 reference with every gradient, outputs poisoned."""
    B, T, H, K, V = 1, 130, 2, 32, 16
    pkg = generated("kda")
    x = sample_inputs(recurrence("kda"), B, T, H, K, V, torch.float32, seed=31)
    x["g"] = mixed_gates(B, T, H, K, [(0, T)], seed=32)
    for programs in (1, 64):
        monkeypatch.setattr(launch, "strong_work_programs", lambda items, device, n=programs: n)
        result = compare_with_reference(pkg.chunk_kda, pkg.kda_reference,
                                        {**x, "initial_state": torch.randn(B, H, K, V)}, torch.float32,
                                        name="chunk_kda", guard=poisoned_allocations)
        assert not result.failures(), (programs, result.errors)
