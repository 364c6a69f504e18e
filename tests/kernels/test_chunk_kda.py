"""The delta rule on a per-channel decayed state (Kimi Linear's KDA, specs/kda.fla) in Triton's interpreter
against its derived float64 reference (generated/kda/reference.py).

The kernels under test are chunk_delta.jinja's with token_gate "channel" (the chunk_delta_channel plan), rendered
here from the template for KDA's kernel features, so they are tested whichever chunk algorithm the lowering picks
for the shipped spec; test_package_matches_reference runs generated/kda itself. Output, final state and the
gradients of q, k, v, g, beta and the initial state, by relative norm error, on fresh random inputs: T not a
multiple of the 64-token chunk, K != V, H = 2, allocations poisoned with NaN. Gates: logsigmoid(N(0, 1)) per
channel (fla_gen.sample), and strong gates down to -5 per token and channel, whose cumulative gates (to ~-160
over a chunk) overflow any factor exp(-G) formed against one reference row: they take the entry-by-entry
diagonal sub-chunks of fwd_A and bwd_dqk_intra.
"""

import importlib.util

import pytest
import torch

from fla_gen.emit import TEMPLATES_DIR, _environment
from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.plan import plan_algorithm, select_algorithms
from fla_gen.runtime.torch_op import chunk_tables
from fla_gen.sample import sample_inputs
from fla_gen.verify import compare_with_reference
from tests.support import KERNEL_MODULE_HEADER, compare_chunk_op, generated, poisoned_allocations, recurrence

KDA = KernelFeatures(TokenDecay.CHANNEL, False, RankOne.DELTA)
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory):
    """chunk_delta.jinja rendered for KDA's features, imported from a file (Triton reads the kernels' source)."""
    algo = select_algorithms(KDA)[0]
    source = _environment(str(TEMPLATES_DIR), trim=False).get_template(algo.template).render(
        op="kda_channel", token_gate=KDA.token_gate, head_gate=False, features=KDA, inline=None)
    path = tmp_path_factory.mktemp("chunk_delta_channel") / "kda_channel_chunk.py"
    path.write_text(KERNEL_MODULE_HEADER + source)
    spec = importlib.util.spec_from_file_location("kda_channel_chunk", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, algo


def chunk_op(kernels, dtype):
    """chunk_kda on the rendered kernels, as an autograd function of (q, k, v, g, beta, initial_state)."""
    module, algo = kernels
    plan = plan_algorithm(KDA, algo, "sm90", {torch.float32: "fp32", torch.float16: "fp16"}[dtype], 64)

    class ChunkKDA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, g, beta, h0, cu_seqlens):
            ci, co = chunk_tables("chunk_kda", cu_seqlens, None, plan.chunk_size, q.shape[1])
            scale = q.shape[-1] ** -0.5
            # segments None: sequences walked whole (test_sequence_segments.py splits them)
            o, ht, saved = module.chunk_fwd(q, k, v, g, beta, scale, h0, True, cu_seqlens, ci, co, None, plan)
            ctx.save_for_backward(q, k, v, g, beta, h0, *saved)
            ctx.tables = (cu_seqlens, ci, co, scale)
            return o, ht

        @staticmethod
        def backward(ctx, do, dht):
            cu_seqlens, ci, co, scale = ctx.tables
            q, k, v, g, beta, h0, *saved = ctx.saved_tensors
            grads = module.chunk_bwd(q, k, v, g, beta, saved, scale, h0, do.contiguous(), dht.contiguous(),
                                     cu_seqlens, ci, co, None, plan)
            return (*grads, None)

    def op(q, k, v, g, beta, initial_state, output_final_state, cu_seqlens=None):
        assert output_final_state
        return ChunkKDA.apply(q, k, v, g, beta, initial_state, cu_seqlens)

    return op


def check(kernels, dtype, dims, *, seed, strong_gates=False, cu_seqlens=None):
    B, T, H, K, V = dims
    x = sample_inputs(recurrence("kda"), B, T, H, K, V, dtype, seed=seed)
    if strong_gates:
        x["g"] = -5.0 * torch.rand(B, T, H, K, generator=torch.Generator().manual_seed(seed + 1))
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    cu = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int32)
    result = compare_with_reference(chunk_op(kernels, dtype), generated("kda").kda_reference,
                                    {**x, "initial_state": torch.randn(N, H, K, V)}, dtype, name="chunk_kda",
                                    guard=poisoned_allocations, cu_seqlens=cu)
    assert not result.failures(), \
        f"{result.name} {result.dtype}: over tolerance {result.failures()} (all {result.errors})"


@DTYPES
def test_matches_reference(kernels, dtype):
    check(kernels, dtype, (2 if dtype == torch.float32 else 1, 100, 2, 32, 48), seed=1)


def test_varlen_with_an_empty_sequence_matches_reference(kernels):
    # the second sequence is empty (its state passes through), the third spans two chunks
    check(kernels, torch.float32, (1, 110, 2, 32, 48), seed=2, cu_seqlens=[0, 37, 37, 110])


@DTYPES
def test_strong_gates_match_reference(kernels, dtype):
    check(kernels, dtype, (1, 70, 2, 32, 48), seed=3, strong_gates=True)


def test_package_matches_reference():
    """generated/kda end to end, with the chunk algorithm the lowering picks for it."""
    result = compare_chunk_op("kda", (1, 70, 2, 32, 48), torch.float32, seed=5)
    assert not result.failures(), f"{result.failures()} (all {result.errors})"
