"""A delta update after a per-channel decay (KDA) is the delta family and plans chunk_delta's kernels with
the per-channel gate (chunk_delta_channel); look-alikes that are not that update stay general rank-1."""

import torch

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.emit import kernel_features
from fla_gen.features import TokenDecay
from fla_gen.parse import parse_spec
from fla_gen.plan import bind_kernel_inputs, plan_table, select_algorithms
from fla_gen.sample import sample_inputs

DECLS = {"g": "[B, T, H, K]", "h": "[B, T, H, K]", "beta": "[B, T, H]"}
KDA = "update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n"


def canon(updates: str, *extra: str):
    decls = "".join(f"input {n}: {DECLS[n]}\n" for n in extra)
    src = ("op t\ninput q: [B, T, H, K]\ninput k: [B, T, H, K]\ninput v: [B, T, H, V]\n" + decls
           + "state S: [K, V]\nparam scale = K ** -0.5\n" + updates + "output o = scale * S^T @ q\n")
    return canonicalize(check_spec(parse_spec(src, "t.fla")))


def test_delta_after_a_channel_decay_is_the_delta_family():
    rec = canon(KDA, "g", "beta")
    assert rec.family == "delta" and rec.decay_kind == "channel"
    chunk, _ = select_algorithms(rec)
    assert chunk.name == "chunk_delta_channel" and chunk.template == "kernels/chunk_delta.jinja"
    assert bind_kernel_inputs(rec).names == ("q", "k", "v", "g", "beta")
    features = kernel_features(rec)
    assert features.delta and features.token_decay is TokenDecay.CHANNEL
    # every target and dtype has a plan with the per-channel kernels, fwd_fused left out (not measured)
    plans = plan_table(rec, chunk)
    assert plans and all({"cumsum", "fwd_A", "bwd_dqk_intra", "bwd_dqkg"} <= {s for s, _ in p.kernels} for p in plans)
    assert all("fwd_fused" not in {s for s, _ in p.kernels} for p in plans)


def test_a_rank1_read_through_another_gate_is_not_the_delta_rule():
    # S = exp(g) * S, then a delta step that reads S through exp(h) * k: the read is not the state's own decay
    rec = canon("update S = exp(g) * S\nupdate S = S + beta * outer(k, v - (exp(h) * S)^T @ k)\n", "g", "h", "beta")
    assert rec.family != "delta"


def test_sampled_kda_inputs_are_in_range():
    rec = canon(KDA, "g", "beta")
    x = sample_inputs(rec, 2, 40, 2, 16, 8, torch.float32, seed=0)
    assert ((x["beta"] > 0) & (x["beta"] < 1)).all()
    assert torch.allclose(x["k"].norm(dim=-1), torch.ones(2, 40, 2), atol=1e-5)
    assert (x["g"] < 0).all() and x["g"].shape == (2, 40, 2, 16)
