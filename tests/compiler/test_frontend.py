"""Parser, checker, canonicalizer and planner on valid specs."""

from pathlib import Path

import pytest

from fla_gen.canonical import canonicalize
from fla_gen.check import check_spec
from fla_gen.features import RankOne, TokenDecay
from fla_gen.lower import lower
from fla_gen.parse import parse_spec, read_spec
from fla_gen.plan import (
    ALGORITHMS,
    ARCHS,
    DTYPES,
    HEAD_DIM_BUCKETS,
    DecodeWork,
    PlanError,
    _smem_bytes,
    bind_kernel_inputs,
    decode_work,
    plan_algorithm,
    plan_table,
    select_algorithms,
    tile_dims,
)
from fla_gen.tuned import tuned_entry

SPECS = sorted((Path(__file__).resolve().parents[2] / "specs").glob("*.fla"))

EXTRA = {"g": "[B, T, H]", "gk": "[B, T, H, K]", "beta": "[B, T, H]", "a": "[B, T, H, K]", "b": "[B, T, H, K]"}


def canon(updates: str, *extra: str):
    """Canonicalize a spec with q, k, v, the named extra inputs, and these update lines."""
    decls = "".join(f"input {n}: {EXTRA[n]}\n" for n in extra)
    src = ("op t\ninput q: [B, T, H, K]\ninput k: [B, T, H, K]\ninput v: [B, T, H, V]\n" + decls
           + "state S: [K, V]\nparam scale = K ** -0.5\n" + updates + "output o = scale * S^T @ q\n")
    return canonicalize(check_spec(parse_spec(src, "t.fla")))


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_shipped_specs_compile(path):
    rec = canonicalize(check_spec(read_spec(path)))
    assert rec.spec.package == path.stem
    expected = {"dplr": RankOne.GENERAL, "rwkv7": RankOne.GENERAL, "kda": RankOne.DELTA}
    assert lower(rec).features.rank1 == expected.get(path.stem,
                                                     RankOne.DELTA if "delta" in path.stem else RankOne.NONE)


def test_families_follow_structure_not_names():
    assert lower(canon("update S = S + outer(k, v)\n")).features.rank1 is RankOne.NONE
    delta = canon("update S = S + beta * outer(k, v - S^T @ k)\n", "beta")
    assert lower(delta).features.rank1 is RankOne.DELTA
    assert delta.low_rank.u.input == "k" and delta.low_rank.w.input == "k"
    dplr = canon("update S = exp(gk) * S + outer(b, S^T @ a) + outer(k, v)\n", "gk", "a", "b")
    assert lower(dplr).features.rank1 is RankOne.GENERAL
    assert (dplr.low_rank.u.input, dplr.low_rank.w.input) == ("b", "a")
    assert lower(dplr).features.token_decay is TokenDecay.CHANNEL


def test_gated_delta_composes_two_updates():
    rec = canon("update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n", "g", "beta")
    assert lower(rec).features.rank1 is RankOne.DELTA
    assert [t.input for t in rec.decay] == ["g"]
    # S = exp(g) S - beta k (exp(g) k)^T S + beta k v^T: u = beta k, w = -exp(g) k.
    assert [getattr(c, "name", None) for c in rec.low_rank.u.coef] == ["beta"]
    assert [getattr(c, "fn", getattr(c, "value", None)) for c in rec.low_rank.w.coef] == [-1.0, "exp"]
    assert rec.write[0].input == "k" and [c.name for c in rec.write[0].coef] == ["beta"]


@pytest.mark.parametrize("spelling", [
    "update S = exp(gk) * S + outer(k, v)\n",
    "update S = diag(exp(gk)) @ S + outer(k, v)\n",
    "update S = outer(k, v) + exp(gk) * S\n",
    "update S = exp(gk) * S\nupdate S = S + outer(k, v)\n",
])
def test_equivalent_spellings_agree(spelling):
    rec = canon(spelling, "gk")
    features = lower(rec).features
    assert features.rank1 is RankOne.NONE and features.token_decay is TokenDecay.CHANNEL
    assert (rec.write[0].input, rec.write[1].input, rec.query.input) == ("k", "v", "q")


def test_plans_fit_every_arch():
    for path in SPECS:
        rec = canonicalize(check_spec(read_spec(path)))
        for algo in select_algorithms(rec):
            for p in plan_table(rec, algo):
                arch = ARCHS[p.arch]
                for stage, cfg in p.kernels:
                    assert cfg.source, stage
                    if cfg.min_sm_share is None:  # never launched (plan_fused_walk): nothing to fit
                        continue
                    # the rules give 4 or 8 warps; fewer only where a measured plan (fla_gen/tuned.py) says so,
                    # or a one-warp rule whose source cites its measurement (the decode kernel's, fwd_solve's)
                    measured = tuned_entry(p.arch, algo.name, stage, p.dtype, p.head_dim) is not None \
                        or bool({"recurrent-one-warp", "solve-one-warp"} & set(cfg.source.split(",")))
                    assert cfg.num_warps in (4, 8) or (cfg.num_warps in (1, 2) and measured), (stage, cfg)
                    shape = next(k for k in algo.kernels if k.stage == stage)
                    sizes = tile_dims(p.chunk_size, cfg.block_k, cfg.block_v)
                    elem = 4 if p.dtype == "fp32" else 2
                    assert _smem_bytes(shape, sizes, elem, cfg.num_stages) <= arch.smem_per_block


def test_plan_table_is_complete_and_deterministic():
    rec = canonicalize(check_spec(read_spec(next(p for p in SPECS if p.stem == "gla"))))
    algo = select_algorithms(rec)[0]
    table = plan_table(rec, algo)
    assert len(table) == len(ARCHS) * len(DTYPES) * len(HEAD_DIM_BUCKETS)
    assert table == plan_table(rec, algo)


def test_decode_plan_follows_the_inline_transforms():
    """The decode kernel runs on one warp when it applies l2norms inline and no rope (recurrent-one-warp), and
    keeps the register rule's four warps otherwise; an explicit DecodeWork overrides what the spec says."""
    def decode_cfg(stem, decode=None):
        rec = canonicalize(check_spec(read_spec(next(p for p in SPECS if p.stem == stem))))
        return plan_algorithm(rec, select_algorithms(rec)[1], "sm90", "bf16", 128, decode=decode).config(
            "recurrent_fwd")

    for stem in ("kda", "gated_delta_rule"):
        cfg = decode_cfg(stem)
        assert (cfg.block_k, cfg.block_v, cfg.num_warps, cfg.source) == (128, 32, 1, "recurrent-one-warp"), stem
        assert decode_cfg(stem, DecodeWork()).num_warps == 4  # the same spec, told it has no inline norm
    for stem in ("gated_delta_rule_rope", "linear_attn", "dplr"):  # a rope inline, or no transform at all
        cfg = decode_cfg(stem)
        assert (cfg.block_v, cfg.num_warps, cfg.source) == (64, 4, "recurrent"), stem
    rope = canonicalize(check_spec(read_spec(next(p for p in SPECS if p.stem == "gated_delta_rule_rope"))))
    assert decode_work(rope) == DecodeWork(norms=2, rotates=True)
    for bucket, bv in ((64, 64), (256, 16)):  # 128 fp32 state registers per thread at every head dim
        rec = canonicalize(check_spec(read_spec(next(p for p in SPECS if p.stem == "kda"))))
        assert plan_algorithm(rec, select_algorithms(rec)[1], "sm80", "fp16", bucket).config(
            "recurrent_fwd").block_v == bv


def test_plan_errors():
    rec = canonicalize(check_spec(read_spec(SPECS[0])))
    algo = ALGORITHMS["chunk_scalar_gate"]
    with pytest.raises(PlanError, match="unknown arch"):
        plan_algorithm(rec, algo, "sm70", "bf16", 128)
    with pytest.raises(PlanError, match="outside 1..256"):
        plan_algorithm(rec, algo, "sm90", "bf16", 512)
    dplr = canon("update S = exp(gk) * S + outer(b, S^T @ a) + outer(k, v)\n", "gk", "a", "b")
    assert [a.name for a in select_algorithms(dplr)] == ["chunk_dplr", "fused_recurrent"]
    assert bind_kernel_inputs(dplr).names == ("q", "k", "v", "g", "a", "b")
    assert bind_kernel_inputs(dplr).inputs == ("q", "k", "v", "gk", "a", "b")
    scalar_gate = canon("update S = exp(g) * S + outer(b, S^T @ a) + outer(k, v)\n", "g", "a", "b")
    assert lower(scalar_gate).features.token_decay is TokenDecay.SCALAR
    assert [a.name for a in select_algorithms(scalar_gate)] == ["chunk_dplr", "fused_recurrent"]
    scaled = canon("update S = exp(gk) * S + outer(b, S^T @ a) + outer(beta * k, v)\n", "gk", "a", "b", "beta")
    assert bind_kernel_inputs(scaled).inputs == ("q", None, "v", "gk", "a", "b")


def test_combinations_that_do_not_fit_are_left_out_and_refused():
    rec = canonicalize(check_spec(read_spec(next(p for p in SPECS if p.stem == "delta_rule"))))
    table = plan_table(rec, select_algorithms(rec)[0])
    keys = {(p.arch, p.dtype, p.head_dim) for p in table}
    assert ("sm80", "fp32", 256) not in keys and ("sm90", "bf16", 128) in keys
    import torch

    from fla_gen.runtime.dispatch import forced_arch, select_plan

    plans = {(p.arch, p.dtype, p.head_dim): p for p in table}
    with forced_arch("sm80"), pytest.raises(ValueError, match="no plan for fp32 inputs at head dim <= 256 on sm80"):
        select_plan(plans, torch.device("cpu"), torch.float32, 200)


def test_delta_kernels_refuse_a_look_alike_recurrence():
    """exp(g) S + beta k (v - S^T k)^T reads the undecayed state: (exp(g) I - beta k k^T) S is not the
    gated delta rule exp(g) (I - beta k k^T) S, so the delta kernels must not take it."""
    from fla_gen.plan import bind_kernel_inputs

    look_alike = canon("update S = exp(g) * S + beta * outer(k, v - S^T @ k)\n", "g", "beta")
    # it holds as a general rank-1 term b (a^T S) with a = k and b = -beta k (the DPLR kernels)
    assert bind_kernel_inputs(look_alike).names == ("q", "k", "v", "g", "a", "b")
    gated = canon("update S = exp(g) * S\nupdate S = S + beta * outer(k, v - S^T @ k)\n", "g", "beta")
    assert bind_kernel_inputs(gated).names == ("q", "k", "v", "g", "beta")
