"""Measured plan choices, a table per arch: launch configs that a GPU measurement found faster than the rules.

The planner (plan.py) applies its rules first; an entry here for the same (arch, algorithm, kernel stage, dtype,
head-dim bucket) replaces the rule's LaunchConfig. Each line ends in a source id whose prose (device, command,
the times) is in fla_gen/measurements.py; ``fla-gen plan`` prints it. An arch's table cites only measurements
taken on that arch. ``python benchmarks/sweep_plans.py --propose SWEEP.json`` prints lines for a sweep's wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from fla_gen.runtime.plan_types import LaunchConfig


@dataclass(frozen=True)
class Tuned:
    """One measured LaunchConfig and the id of its measurement (fla_gen/measurements.py)."""

    block_k: int
    block_v: int
    num_warps: int
    num_stages: int
    source: str


# (algorithm, kernel stage, dtype, head-dim bucket)
Key = tuple[str, str, str, int]

TUNED: dict[str, dict[Key, Tuned]] = {
    "sm90": {
        ("chunk_channel_gate", "bwd_dv", "bf16", 128): Tuned(64, 128, 4, 2, "h100-gla-wide-v"),
        ("chunk_channel_gate", "bwd_dqkg", "bf16", 128): Tuned(64, 64, 4, 3, "h200-gla-dqkg-tiles"),
        ("chunk_channel_gate", "bwd_dqk_intra_chunk", "bf16", 128): Tuned(32, 64, 2, 1, "h200-gla-dqkg-tiles"),
        ("chunk_channel_gate", "fwd_A", "bf16", 64): Tuned(64, 64, 1, 1, "h200-gla-fwd-a-tiles"),
        ("chunk_channel_gate", "fwd_A", "bf16", 128): Tuned(128, 64, 2, 1, "h200-gla-fwd-a-tiles"),
        ("chunk_channel_gate", "fwd_A", "bf16", 256): Tuned(64, 64, 1, 1, "h200-gla-fwd-a-tiles"),
        ("chunk_channel_gate", "fwd_A_chunk", "bf16", 64): Tuned(64, 64, 4, 3, "h200-gla-pre-gated"),
        ("chunk_channel_gate", "fwd_A_chunk", "bf16", 128): Tuned(32, 64, 4, 3, "h200-fwd-a-chunk"),
        ("chunk_channel_gate", "fwd_o", "bf16", 128): Tuned(128, 128, 4, 3, "h200-gla-pre-gated"),
        ("chunk_scalar_gate", "fwd_h", "bf16", 256): Tuned(64, 64, 4, 4, "h100-walk-4-stages"),
        ("chunk_scalar_gate", "bwd_dh", "bf16", 256): Tuned(64, 64, 4, 4, "h100-walk-4-stages"),
        ("chunk_channel_gate", "fwd_h", "bf16", 128): Tuned(64, 64, 8, 3, "h200-gla-pre-gated"),
        ("chunk_channel_gate", "fwd_h", "bf16", 256): Tuned(64, 64, 8, 4, "h100-walk-4-stages"),
        ("chunk_channel_gate", "bwd_dh", "bf16", 128): Tuned(64, 64, 8, 4, "h100-walk-4-stages"),
        ("chunk_channel_gate", "bwd_dh", "bf16", 256): Tuned(64, 64, 8, 4, "h100-walk-4-stages"),
        ("chunk_delta", "fwd_solve", "bf16", 128): Tuned(64, 64, 1, 2, "h200-delta-solve-stages"),
        ("chunk_delta", "fwd_wu", "bf16", 128): Tuned(64, 64, 4, 3, "h200-delta-wu-warps"),
        ("chunk_delta", "fwd_h", "bf16", 128): Tuned(128, 64, 4, 3, "h100-delta-fwd-h-128"),
        ("chunk_delta", "fwd_h", "bf16", 256): Tuned(256, 32, 4, 3, "h100-delta-fwd-h-256"),
        ("chunk_delta", "bwd_dh", "bf16", 128): Tuned(128, 64, 4, 3, "h100-delta-bwd-dh-128"),
        ("chunk_delta", "bwd_dh", "bf16", 256): Tuned(256, 32, 4, 2, "h100-delta-bwd-dh-256"),
        ("chunk_delta", "bwd_dqk", "bf16", 128): Tuned(128, 64, 4, 3, "h100-delta-bwd-dqk-whole-k"),
        ("chunk_delta_channel", "fwd_A", "bf16", 128): Tuned(128, 64, 2, 1, "h100-delta-channel-whole-k"),
        ("chunk_delta_channel", "fwd_A_chunk", "bf16", 128): Tuned(32, 64, 4, 3, "h200-fwd-a-chunk"),
        ("chunk_delta_channel", "bwd_dqk_intra", "bf16", 128): Tuned(128, 64, 2, 1, "h100-delta-channel-whole-k"),
        ("chunk_delta_channel", "fwd_o", "bf16", 128): Tuned(64, 128, 4, 3, "h100-delta-channel-fwd-o-wide-v"),
        ("chunk_delta_channel", "fwd_solve", "bf16", 128): Tuned(64, 64, 2, 1, "h200-delta-channel-solve"),
        ("chunk_delta_channel", "fwd_wu", "bf16", 128): Tuned(32, 64, 4, 3, "h200-delta-channel-wu-bk32"),
        ("chunk_delta_channel", "fwd_h", "bf16", 128): Tuned(128, 64, 4, 3, "h200-delta-channel-wu-bk32"),
        ("chunk_delta_channel", "bwd_dh", "bf16", 128): Tuned(128, 64, 4, 2, "h200-delta-channel-bwd-dh-stages"),
        ("chunk_dplr", "fwd_intra", "bf16", 64): Tuned(32, 16, 2, 1, "h100-dplr-pair-kernels"),
        ("chunk_dplr", "fwd_intra", "bf16", 128): Tuned(32, 16, 2, 1, "h100-dplr-pair-kernels"),
        ("chunk_dplr", "fwd_intra", "bf16", 256): Tuned(32, 16, 2, 1, "h100-dplr-pair-kernels"),
        ("chunk_dplr", "bwd_dqk", "bf16", 64): Tuned(32, 32, 4, 3, "h200-dplr-dqk-stages"),
        ("chunk_dplr", "bwd_dqk", "bf16", 128): Tuned(32, 32, 4, 3, "h200-dplr-dqk-stages"),
        ("chunk_dplr", "bwd_dqk", "bf16", 256): Tuned(32, 16, 4, 3, "h200-dplr-dqk-stages"),
        ("chunk_dplr", "bwd_dA", "bf16", 256): Tuned(256, 16, 4, 2, "h100-dplr-bwd-da-256"),
        ("chunk_dplr", "fwd_h", "bf16", 64): Tuned(64, 64, 4, 3, "h200-dplr-walk-stages-64"),
        ("chunk_dplr", "bwd_dh", "bf16", 64): Tuned(64, 64, 4, 3, "h200-dplr-walk-stages-64"),
        ("chunk_dplr", "bwd_dA", "bf16", 64): Tuned(64, 64, 4, 3, "h200-dplr-walk-stages-64"),
        ("chunk_dplr", "fwd_h", "bf16", 128): Tuned(128, 32, 4, 3, "h200-dplr-walk-stages"),
        ("chunk_dplr", "bwd_dh", "bf16", 128): Tuned(128, 32, 4, 3, "h200-dplr-walk-stages"),
        ("chunk_dplr", "bwd_dA", "bf16", 128): Tuned(128, 32, 4, 3, "h200-dplr-walk-stages"),
    },
}


@dataclass(frozen=True)
class FusedWalk:
    """The measured config of fwd_fused (the forward as one walk that also writes the outputs): V tile, warps,
    stages, and the share of the GPU's SMs its grid must reach at run time (None: never taken)."""

    block_v: int
    num_warps: int
    num_stages: int
    min_sm_share: float | None
    source: str
    # The measurement behind a delta-family walk that builds v_new from the chunks' inverses
    # (LaunchConfig.reads_inverse); empty: the walk reads fwd_wu's W and U.
    inverse_source: str = ""
    # The group size (value heads per key head, HV / H) from which the walk reads the inverse; below it, W and U.
    inverse_min_group: int = 1
    # A second launch of the same kernel, (V tile, stages, share), whose shared memory holds two programs on one SM:
    # taken for a dense call whose grid at that tile has share x the SMs' programs or more (launch.fused_walk_choice).
    # Then one program's start (its entering state, the pipeline's first loads) runs under the other's steps. None:
    # the plan's launch always.
    two_per_sm: tuple[int, int, float] | None = None
    two_per_sm_source: str = ""
    # The two-per-SM launch also for a packed batch, where its walks differ in length: only while the call's work
    # per SM at that tile is at least its longest walk (launch.fused_walk_choice), since two programs per SM slow
    # each one's steps and a longest walk that bounds the call gets slower. False: dense calls only.
    two_per_sm_packed: bool = False
    two_per_sm_packed_source: str = ""


def _never(source: str) -> FusedWalk:
    return FusedWalk(0, 0, 0, None, source)


# (algorithm, has a gate, head-dim bucket). A target without a table never takes fwd_fused.
FUSED_WALK: dict[str, dict[tuple[str, bool, int], FusedWalk]] = {
    "sm90": {
        ("chunk_scalar_gate", False, 64): FusedWalk(64, 4, 3, 0.5, "h100-fused-walk-scalar"),
        ("chunk_scalar_gate", False, 128): FusedWalk(64, 4, 3, 0.5, "h100-fused-walk-scalar",
                                                     two_per_sm=(64, 2, 3.0), two_per_sm_source="h200-walk-two-per-sm"),
        ("chunk_scalar_gate", False, 256): FusedWalk(32, 4, 3, 0.5, "h100-fused-walk-scalar"),
        ("chunk_scalar_gate", True, 64): FusedWalk(64, 4, 2, 1.9, "h100-fused-walk-scalar"),
        ("chunk_scalar_gate", True, 128): FusedWalk(32, 4, 3, 1.9, "h100-fused-walk-scalar",
                                                    two_per_sm=(64, 2, 1.9), two_per_sm_source="h200-walk-two-per-sm",
                                                    two_per_sm_packed=True,
                                                    two_per_sm_packed_source="h200-walk-packed"),
        ("chunk_scalar_gate", True, 256): _never("h100-fused-walk-scalar"),
        ("chunk_delta", False, 64): FusedWalk(64, 4, 3, 0.45, "h100-fused-walk-delta", "h200-delta-walk-inverse"),
        ("chunk_delta", False, 128): FusedWalk(64, 4, 3, 0.45, "h100-fused-walk-delta"),
        ("chunk_delta", False, 256): FusedWalk(32, 4, 2, 0.45, "h100-fused-walk-delta"),
        ("chunk_delta", True, 64): FusedWalk(64, 4, 2, 1.9, "h100-fused-walk-delta", "h200-delta-walk-inverse"),
        ("chunk_delta", True, 128): FusedWalk(32, 4, 2, 1.9, "h100-fused-walk-delta",
                                              "h200-gated-delta-walk-inverse-128", inverse_min_group=2),
        ("chunk_delta", True, 256): _never("h100-fused-walk-delta"),
        ("chunk_channel_gate", True, 64): FusedWalk(64, 4, 2, 1.9, "h100-fused-walk-gla"),
        ("chunk_channel_gate", True, 128): _never("h100-fused-walk-gla"),
        ("chunk_channel_gate", True, 256): _never("h100-fused-walk-gla"),
    },
}


def tuned_entry(arch: str, algorithm: str, stage: str, dtype: str, head_dim: int,
                table: dict[str, dict[Key, Tuned]] | None = None) -> Tuned | None:
    """The measured entry for one kernel and target, or None (the planner's rule stands)."""
    return (TUNED if table is None else table).get(arch, {}).get((algorithm, stage, dtype, head_dim))


def tuned_config(arch: str, algorithm: str, stage: str, dtype: str, head_dim: int,
                 table: dict[str, dict[Key, Tuned]] | None = None) -> LaunchConfig | None:
    """The measured LaunchConfig for one kernel and target (its reason the measurement's prose), or None."""
    from fla_gen.measurements import explain

    e = tuned_entry(arch, algorithm, stage, dtype, head_dim, table)
    if e is None:
        return None
    return LaunchConfig(e.block_k, e.block_v, e.num_warps, e.num_stages, f"measured: {explain(e.source)}",
                        source=e.source)
