"""Measured plan choices: launch configs that a GPU sweep found faster than the planner's rules.

The planner (plan.py) applies its rules first, then an entry here for the same (arch, algorithm,
kernel stage, dtype, head-dim bucket) replaces the rule's LaunchConfig; ``fla-gen plan`` prints
the entry's reason. Every entry must name its measurement: device, date, the two times and the
command (``benchmarks/sweep_plans.py``, raw JSON in ``benchmarks/results/``). ``python
benchmarks/sweep_plans.py --propose SWEEP.json`` prints entries for a sweep's wins, to paste here.
"""

from __future__ import annotations

from dataclasses import dataclass

from fla_gen.runtime.plan_types import LaunchConfig


@dataclass(frozen=True)
class TunedPlan:
    """One measured LaunchConfig for kernel ``stage`` of ``algorithm`` on ``arch`` for ``dtype``
    inputs whose padded head dim is ``head_dim`` (a HEAD_DIM_BUCKETS value)."""

    arch: str
    algorithm: str
    stage: str
    dtype: str
    head_dim: int
    block_k: int
    block_v: int
    num_warps: int
    num_stages: int
    reason: str

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.arch, self.algorithm, self.stage, self.dtype, self.head_dim)

    def config(self) -> LaunchConfig:
        return LaunchConfig(self.block_k, self.block_v, self.num_warps, self.num_stages,
                            f"tuned (fla_gen/tuned.py): {self.reason}")


_GLA_WIDE_V = ("one 128-wide V tile (no V loop around the [BT, BT] product), 2 stages, 4 warps, with fwd_o and "
               "bwd_dv changed together: measured on H100 2026-11-23 for chunk_gla at 4x4096x16x128 bf16, forward "
               "1.505 -> 1.327 ms, forward+backward 4.432 -> 4.136 ms against two 64-wide V tiles "
               "(benchmarks/results/2026-11-23_h100_bench_gla_wide_v.json)")

_DELTA_FWD_WU_2_WARPS = (
    "2 warps: the kernel's dots and its forward substitution work on 16x16 blocks, too small to share among "
    "4 warps; measured on H100 2026-11-23 (benchmarks/sweep_plans.py --stages fwd_wu, bf16, against 4 warps, "
    "benchmarks/results/2026-11-23_h100_sweep_delta_fwd_wu_s4.json): fwd_wu kernel {kernels}, forward {forwards}")

_GLA_FWD_A_2_WARPS = (
    "2 warps at 1 stage: its dots have 16 rows (one sub-chunk), too few to share among 4 warps; measured on H100 "
    "2026-11-24 (benchmarks/sweep_plans.py --ops gla --stages fwd_A, bf16, against 4 warps, "
    "benchmarks/results/2026-11-24_h100_sweep_gla_fwd_A_s10.json): fwd_A kernel {times}; at head dim 64 4 warps "
    "stay (0.216 against 0.224 ms at 8x2048x32x64)")

_WALK_4_STAGES = (
    "{warps} warps, 4 stages: the state walk streams each chunk's inputs past a state that stays in registers, "
    "and a fourth stage keeps one more chunk's loads in flight (fla-core's autotune picks 4 stages for its "
    "forward walk, chunk_fwd_kernel_h, at head dim 256); measured on H100 2026-11-24 (benchmarks/sweep_plans.py "
    "--extra-variants with num_stages 4, bf16, kernel alone, "
    "benchmarks/results/2026-11-24_h100_sweep_fwd_h_stages_s11.json and ..._sweep_4_stages_gated_s11.json): {times}")

_DPLR_FACTORED = (
    "{what}; measured on H100 2026-11-23 for chunk_rwkv7 at {shape} bf16 with RWKV-7 gates (every K block "
    "takes the factored dots), benchmarks/sweep_plans.py --stages fwd_intra,bwd_dqk "
    "(benchmarks/results/{result}): {times}")
_DPLR_K128 = {"shape": "4x4096x16x128", "result": "2026-11-23_h100_sweep_rwkv7_factored_s5.json"}
_DPLR_K64 = {"shape": "8x2048x32x64", "result": "2026-11-23_h100_sweep_rwkv7_k64_s6.txt"}
_DPLR_K256 = {"shape": "2x8192x8x256", "result": "2026-11-23_h100_sweep_rwkv7_k256_s7.json"}

TUNED: tuple[TunedPlan, ...] = (
    # The wide-V experiment of benchmarks/RESULTS.md: it agrees with plan.py's wide_v rule, and pins
    # the measured reason to the one target it was measured on. Its fwd_o entry went with the kernel it
    # measured (fwd_o then built A itself; fwd_A does that now): the rule stands for the new fwd_o.
    TunedPlan("sm90", "chunk_channel_gate", "bwd_dv", "bf16", 128, 64, 128, 4, 2, _GLA_WIDE_V),
    # gla's fwd_A in one pass over K (session 10), at the 1 stage of plan.py's rule for it.
    TunedPlan("sm90", "chunk_channel_gate", "fwd_A", "bf16", 128, 64, 64, 2, 1, _GLA_FWD_A_2_WARPS.format(
        times="0.326 -> 0.261 ms at 4x4096x16x128 (forward 0.754 -> 0.690)")),
    TunedPlan("sm90", "chunk_channel_gate", "fwd_A", "bf16", 256, 64, 64, 2, 1, _GLA_FWD_A_2_WARPS.format(
        times="0.341 -> 0.246 ms at 2x8192x8x256 (forward 0.954 -> 0.860)")),
    # The scalar- and channel-gate state walks (session 11): one more pipeline stage, and 8 warps for gla's.
    TunedPlan("sm90", "chunk_scalar_gate", "fwd_h", "bf16", 256, 64, 64, 4, 4, _WALK_4_STAGES.format(
        warps=4, times="fwd_h 0.161 -> 0.149 and 0.150 ms (simple_gla 2x8192x8x256, two sweeps; forward 0.371 -> "
                       "0.360); not at head dim 128 (4 stages 0.096 ms at 4x4096x16x128, the plan's 3 stages 0.094 in "
                       "session 8's profile)")),
    TunedPlan("sm90", "chunk_scalar_gate", "bwd_dh", "bf16", 256, 64, 64, 4, 4, _WALK_4_STAGES.format(
        warps=4, times="bwd_dh 0.164 -> 0.150 ms (simple_gla 2x8192x8x256), 0.158 -> 0.146 (linear_attn); at head "
                       "dim 128 0.098 -> 0.101 (simple_gla 4x4096x16x128), so not there")),
    TunedPlan("sm90", "chunk_channel_gate", "fwd_h", "bf16", 128, 64, 64, 8, 4, _WALK_4_STAGES.format(
        warps=8, times="fwd_h 0.168 -> 0.160 ms at 4x4096x16x128 (4 warps at 4 stages: 0.167)")),
    TunedPlan("sm90", "chunk_channel_gate", "fwd_h", "bf16", 256, 64, 64, 8, 4, _WALK_4_STAGES.format(
        warps=8, times="fwd_h 0.301 -> 0.281 ms at 2x8192x8x256 (4 warps at 4 stages: 0.296)")),
    TunedPlan("sm90", "chunk_channel_gate", "bwd_dh", "bf16", 128, 64, 64, 8, 4, _WALK_4_STAGES.format(
        warps=8, times="bwd_dh 0.170 -> 0.155 ms at 4x4096x16x128")),
    TunedPlan("sm90", "chunk_channel_gate", "bwd_dh", "bf16", 256, 64, 64, 8, 4, _WALK_4_STAGES.format(
        warps=8, times="bwd_dh 0.302 -> 0.257 ms at 2x8192x8x256")),
    TunedPlan("sm90", "chunk_delta", "fwd_wu", "bf16", 128, 64, 64, 2, 3, _DELTA_FWD_WU_2_WARPS.format(
        kernels="0.315 -> 0.220 ms (gated_delta_rule 4x4096x16x128), 0.300 -> 0.205 (delta_rule)",
        forwards="0.727 -> 0.648 and 0.657 -> 0.618 ms")),
    TunedPlan("sm90", "chunk_delta", "fwd_wu", "bf16", 64, 64, 64, 2, 3, _DELTA_FWD_WU_2_WARPS.format(
        kernels="0.559 -> 0.357 ms (gated_delta_rule 8x2048x32x64), 0.501 -> 0.323 (delta_rule)",
        forwards="0.855 -> 0.654 and 0.762 -> 0.585 ms")),
    TunedPlan("sm90", "chunk_delta", "fwd_wu", "bf16", 256, 64, 64, 2, 3, _DELTA_FWD_WU_2_WARPS.format(
        kernels="0.213 -> 0.167 ms (gated_delta_rule 2x8192x8x256), 0.202 -> 0.161 (delta_rule); "
                "benchmarks/results/2026-11-23_h100_sweep_delta_k256_s6.json",
        forwards="1.277 -> 1.229 and 1.060 -> 1.016 ms")),
    # The state walk at head dim 256: the rule's [256, 16] state tile (4 warps, no spill) gives N = 16
    # dots. Session 6 measured [256, 32] on 8 warps; session 7 added fla-core's own autotuned fwd_h config
    # (BV 32, 4 warps, 3 stages), which the first sweep had not tried.
    TunedPlan("sm90", "chunk_delta", "fwd_h", "bf16", 256, 256, 32, 4, 3,
              "[256, 32] fp32 state tile on 4 warps, 3 stages; measured on H100 2026-11-23 at 2x8192x8x256 bf16 "
              "(benchmarks/sweep_plans.py --stages fwd_h): session 6 (2026-11-23_h100_sweep_delta_k256_s6.json) "
              "fwd_h 0.641 -> 0.456 ms (delta_rule) and 0.830 -> 0.551 (gated) at [256, 32] on 8 warps against "
              "the rule's [256, 16]; session 7 (2026-11-23_h100_sweep_delta_k256_round2_s7.json, "
              "..._sweep_fwd_h_rowblocks_k256_s7.json) 0.409 -> 0.353 ms (delta_rule) and 0.526 -> 0.476 "
              "(gated) on 4 warps and 3 stages against 8 warps and 2; 4 stages do not fit (282 KB)"),
    # The state walk at head dim 128, once v_new = U - W h subtracted after the dot (session 8): fla-core's
    # autotuned pick (BV 64, 4 warps, 3 stages), which the old loop had measured slower.
    TunedPlan("sm90", "chunk_delta", "fwd_h", "bf16", 128, 128, 64, 4, 3,
              "[128, 64] fp32 state tile on 4 warps, 3 stages; measured on H100 2026-11-24, bf16, kernel alone "
              "in one process (benchmarks/results/2026-11-24_h100_walks_s8.json): at 4x4096x16x128 fwd_h 0.173 ms "
              "at the rule's [128, 32] and 2 stages, 0.147 at [128, 64] and 3 (gated_delta_rule 0.177 -> 0.147; "
              "fla-core's kernel 0.146 at its own pick, the same); at 1x16384x16x128 the run-time split takes BV to "
              "16, where 3 stages measured 0.223 ms against 0.378 at the old 2 (..._fwdh_variants_s8.json; "
              "gated 0.254 ms)"),
    # The backward's state walk at head dim 128, once it held the state gradient as [64, BV] row blocks
    # (session 8): fla-core's autotuned pick for its dhu kernel (BV 64, 4 warps, 3 stages).
    TunedPlan("sm90", "chunk_delta", "bwd_dh", "bf16", 128, 128, 64, 4, 3,
              "[128, 64] state gradient as two [64, 64] row blocks on 4 warps, 3 stages; measured on H100 "
              "2026-11-24, bf16, kernel alone in one process "
              "(benchmarks/results/2026-11-24_h100_dh_variants_rowblocks_s8.json, variant d5 = the template's row "
              "blocks): at 4x4096x16x128 0.196 ms against 0.266 for the one [128, 32] "
              "tile at the rule's 2 stages (fla-core's kernel 0.199 at this config); at 1x16384x16x128 the run-time "
              "split takes BV to 16: 0.294 ms against 0.652 for the old plan (one [128, 32] tile, 2 stages, "
              "no split; ..._walks_s8.json)"),
    # The backward's state walk at head dim 256: fla-core's own autotuned config for its dhu kernel
    # (BV 32, 4 warps, 2 stages), which the first sweep had not tried.
    TunedPlan("sm90", "chunk_delta", "bwd_dh", "bf16", 256, 256, 32, 4, 2,
              "[256, 32] fp32 state tile on 4 warps, 2 stages; measured on H100 2026-11-23 at 2x8192x8x256 bf16 "
              "(benchmarks/sweep_plans.py --stages fwd_h,bwd_dh, "
              "benchmarks/results/2026-11-23_h100_sweep_delta_k256_round2_s7.json): bwd_dh kernel 0.675 -> 0.494 ms "
              "(delta_rule), 0.784 -> 0.569 (gated_delta_rule) against the rule's [256, 16] on 4 warps, 1 stage; "
              "forward+backward 3.024 -> 2.836 and 3.602 -> 3.381 ms"),
    # The any-gate DPLR plan's two pairwise kernels, once they took the factored dots (their 8 / 4 warps
    # had been measured on the entry-wise path); strong gates still run the entry-wise path with these.
    TunedPlan("sm90", "chunk_dplr", "fwd_intra", "bf16", 128, 32, 16, 2, 1, _DPLR_FACTORED.format(
        **_DPLR_K128, what="2 warps: [16, 16] dots and a 16-step forward substitution; 32-wide K blocks (four "
                           "K-loop trips instead of eight), though they spill ~260 B on sm90 (fla-gen aot)",
        times="kernel 3.27 ms at BK 16 / 8 warps, 2.14 at 4, 1.24 at 2; forward 4.08 -> 2.12 ms; then "
              "(benchmarks/results/2026-11-23_h100_sweep_rwkv7_fwd_intra_k128_s6.json) 1.254 -> 1.105 ms at "
              "BK 32 / 2 warps, forward 2.147 -> 1.994 ms")),
    TunedPlan("sm90", "chunk_dplr", "bwd_dqk", "bf16", 128, 32, 32, 4, 1, _DPLR_FACTORED.format(
        **_DPLR_K128,
        what="32-wide K blocks, 4 warps: half the K-loop trips, though it spills ~600 B on sm90 (fla-gen aot; "
             "the entry-wise branch's [16, 16, 32] tiles)",
        times="kernel 3.69 ms at BK 16 / 4 warps, 5.16 at 8 warps, 9.11 at 2, 2.19 at BK 32 / 4 warps; "
              "forward+backward 11.21 -> 9.64 ms")),
    # The same two kernels at head dim 64, where the rules' 16-wide K blocks and 4 warps (the 128 entries
    # apply only to their bucket) left rwkv7 at 0.71x / 0.89x of fla-core (same call, 8x2048x32x64).
    TunedPlan("sm90", "chunk_dplr", "fwd_intra", "bf16", 64, 32, 16, 2, 1, _DPLR_FACTORED.format(
        **_DPLR_K64, what="32-wide K blocks, 2 warps: two K-loop trips instead of four",
        times="kernel 2.291 ms at BK 16 / 4 warps, 1.222 at BK 32 / 2 warps; forward 2.65 -> 1.60 ms")),
    TunedPlan("sm90", "chunk_dplr", "bwd_dqk", "bf16", 64, 32, 32, 4, 1, _DPLR_FACTORED.format(
        **_DPLR_K64, what="32-wide K blocks, 4 warps, as at head dim 128",
        times="kernel 3.768 ms at BK 16 / 4 warps, 2.084 at BK 32 / 4 warps; forward+backward 8.58 -> 6.87 ms")),
    # And at head dim 256, where the rules left rwkv7 at 4.78 / 16.77 ms: the same two changes, plus
    # bwd_dA on 4 warps (the rule's 8 warps share a [256, 16] state tile too thinly).
    TunedPlan("sm90", "chunk_dplr", "fwd_intra", "bf16", 256, 32, 16, 2, 1, _DPLR_FACTORED.format(
        **_DPLR_K256, what="32-wide K blocks, 2 warps, as at head dims 64 and 128",
        times="kernel 2.070 ms at BK 16 / 4 warps, 1.083 at BK 32 / 2 warps; forward 4.773 -> 3.768 ms")),
    TunedPlan("sm90", "chunk_dplr", "bwd_dqk", "bf16", 256, 32, 16, 4, 1, _DPLR_FACTORED.format(
        **_DPLR_K256, what="32-wide K blocks, 4 warps, as at head dims 64 and 128",
        times="kernel 3.686 ms at BK 16 / 4 warps, 2.178 at BK 32; forward+backward 16.75 -> 15.46 ms")),
    TunedPlan("sm90", "chunk_dplr", "bwd_dA", "bf16", 256, 256, 16, 4, 2,
              "4 warps on the [256, 16] state tile; measured on H100 2026-11-23 for chunk_rwkv7 at 2x8192x8x256 "
              "bf16 (benchmarks/sweep_plans.py --stages bwd_dA, "
              "benchmarks/results/2026-11-23_h100_sweep_rwkv7_k256_s7.json): kernel 2.893 ms on 8 warps, 1.665 "
              "on 4; forward+backward 16.86 -> 15.79 ms"),
)


def index(entries: tuple[TunedPlan, ...] | None = None) -> dict[tuple[str, str, str, str, int], TunedPlan]:
    """Entries (default: TUNED) by key; ValueError on two entries for one key (which measurement
    wins would be unclear)."""
    out: dict[tuple[str, str, str, str, int], TunedPlan] = {}
    for e in TUNED if entries is None else entries:
        if e.key in out:
            raise ValueError(f"two tuned plans for {e.key}: keep one")
        out[e.key] = e
    return out


def tuned_config(arch: str, algorithm: str, stage: str, dtype: str, head_dim: int,
                 entries: tuple[TunedPlan, ...] | None = None) -> LaunchConfig | None:
    """The measured LaunchConfig for one kernel and target, or None (the planner's rule stands)."""
    e = index(entries).get((arch, algorithm, stage, dtype, head_dim))
    return e.config() if e else None
