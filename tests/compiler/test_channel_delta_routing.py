"""The delta rule on a per-channel decayed state (KDA's kernel features: a per-channel token decay and the
delta rank-1 part) plans chunk_delta's template with its per-channel kernels (chunk_delta_channel)."""

from fla_gen.features import KernelFeatures, RankOne, TokenDecay
from fla_gen.plan import ALGORITHMS, plan_table, select_algorithms

KDA = KernelFeatures(TokenDecay.CHANNEL, False, RankOne.DELTA)


def test_channel_delta_features_select_the_channel_kernels_of_chunk_delta():
    chunk, _ = select_algorithms(KDA)
    assert chunk.name == "chunk_delta_channel" and chunk.template == ALGORITHMS["chunk_delta"].template
    assert KDA.token_gate == "channel" and KDA.kernel_args == ("q", "k", "v", "g", "beta")
    # the scalar-gate delta rule keeps chunk_delta (and its measured tuned entries)
    assert select_algorithms(KernelFeatures(TokenDecay.SCALAR, False, RankOne.DELTA))[0].name == "chunk_delta"


def test_every_target_plans_the_per_channel_kernels():
    chunk, _ = select_algorithms(KDA)
    plans = plan_table(KDA, chunk)
    stages = {"cumsum", "fwd_A_chunk", "fwd_A", "fwd_solve", "fwd_wu", "fwd_h", "fwd_o", "bwd_dh", "bwd_dqk", "bwd_wy",
              "bwd_dqk_intra", "bwd_dqkg", "segment_scan"}
    # no fwd_fused: the per-channel walk is not measured, so the forward is fwd_h + fwd_o
    assert plans and all({s for s, _ in p.kernels} == stages for p in plans)
    assert all(p.chunk_size == 64 for p in plans)
    # every target has a plan at head dims 64 and 128: bwd_dh's whole-K tiles fit the 99 KB targets since it
    # reads the pre-gated kd and qg (four [64, 128] tiles, not six with k, q and the G tiles)
    assert {p.arch for p in plans if p.head_dim == 64} == {"sm80", "sm86", "sm89", "sm90", "sm100"}
    assert {p.arch for p in plans if p.head_dim == 128} == {"sm80", "sm86", "sm89", "sm90", "sm100"}
