"""The plan types shared by the planner (at build time) and generated packages (at run time)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

# Plans are tabulated per padded head dim: the smallest bucket that holds max(K, V).
HEAD_DIM_BUCKETS = (64, 128, 256)

# Row blocks a whole-K state walk unrolls when it holds its state as [RB, BV] blocks (the compiler's
# emit.per_row_block writes them, launch.state_row_block sizes them): four blocks of 64 rows cover every
# head dim the planner accepts.
STATE_ROW_BLOCKS = 4


def head_dim_bucket(head_dim: int) -> int:
    """The plan bucket of a head dim (1..256): 64, 128 or 256."""
    return next(b for b in HEAD_DIM_BUCKETS if head_dim <= b)


@dataclass(frozen=True)
class LaunchConfig:
    """How one kernel is launched: tile sizes, warps and software-pipelining depth.

    ``block_k``/``block_v`` tile the key and value head dims; a tile never exceeds the
    padded head dim (the launcher clamps it with ``min(block, next_power_of_2(dim))``).
    ``source``: where the values come from, comma-separated ids of fla_gen/measurements.py (rules,
    compile-time checks, GPU measurements); generated tables keep it. ``reason``: the planner's prose
    for ``fla-gen plan``, not part of a config's identity and not written into generated tables.
    """

    block_k: int
    block_v: int
    num_warps: int
    num_stages: int
    reason: str = field(default="", compare=False)
    # Set by a plan override (an experiment): the launcher uses these tiles as given, with no
    # run-time adjustment (launch.split_sm_count).
    pinned: bool = False
    # For a kernel the launcher may pass over at run time (fwd_fused): the share of the GPU's SMs its
    # grid must reach, narrowing its V tile if need be (launch.fused_walk_block_v); 0: always taken,
    # None: never (not measured on the target, measured slower, or it does not fit).
    min_sm_share: float | None = 0.0
    source: str = ""
    # For the delta family's fwd_fused: the walk builds v_new from fwd_solve's inverse, (Ai diag(beta)) (v - k h),
    # rather than reading the W and U of fwd_wu, which then does not run in the forward; only at calls whose key
    # heads each serve at least inverse_min_group value heads (launch.walk_reads_inverse).
    reads_inverse: bool = False
    inverse_min_group: int = 1
    # For fwd_fused: (V tile, stages, share of the SMs) of a second launch that holds two programs per SM, taken for
    # a dense call whose grid at that tile reaches the share (launch.fused_walk_launch); None: the config's always.
    two_per_sm: tuple[int, int, float] | None = None
    # Also for a packed call whose longest walk does not bound it (launch.fused_walk_choice); False: dense calls only.
    two_per_sm_packed: bool = False


@dataclass(frozen=True)
class SegmentRule:
    """When an algorithm's state walks split long sequences into segments (fla_gen/runtime/segments.py), and
    how finely. The split is considered while the unsplit walks, at their narrowest tiles, make fewer programs
    than ``below_sm_share`` of the SMs (0: never, unless a test or sweep forces it); it then makes at most
    ``walks_per_sm`` (segment, head) walks per SM, of ``min_chunks`` chunks at least, and only where the longest
    sequence gets ``min_segments`` of them. No split at a key head dim above ``max_key_dim``, not even a forced one
    (the delta family's scan holds a [K, K] transition in registers). ``source``: the id of the measurement behind
    it (fla_gen/measurements.py)."""

    below_sm_share: float
    walks_per_sm: float
    min_chunks: int
    source: str
    min_segments: int = 2
    max_key_dim: int = 256  # the largest head dim the planner takes: no limit of its own


@dataclass(frozen=True)
class Plan:
    """Everything the planner decided for one (arch, dtype, head-dim bucket).

    ``kernels`` maps a kernel's stage name (``fwd_h``, ``fwd_o``, ...) to its launch config.
    """

    arch: str
    dtype: str
    head_dim: int
    chunk_size: int
    # the planner's prose for ``fla-gen plan``; not written into generated tables
    chunk_size_reason: str = field(default="", compare=False)
    kernels: tuple[tuple[str, LaunchConfig], ...] = ()
    # A lower bound on the log gates that this plan relies on (None: the plan is safe for any gate).
    gate_bound: float | None = None

    def config(self, stage: str) -> LaunchConfig:
        """The launch config of kernel ``stage``; KeyError names the known stages."""
        for name, cfg in self.kernels:
            if name == stage:
                return cfg
        raise KeyError(f"plan has no kernel {stage!r}; known: {[n for n, _ in self.kernels]}")


def same_plans_as(plans: dict[tuple[str, str, int], Plan], source: str, dtype: str,
                  unless: tuple[tuple[str, int], ...] = ()) -> dict[tuple[str, str, int], Plan]:
    """A ``dtype`` row for every ``source`` row of ``plans`` whose (arch, head dim) is not in ``unless``:
    the same plan with only its dtype changed (generated tables write fp16 rows this way when they
    equal the bf16 ones: the planner's rules depend on the element size, not the format)."""
    return {(arch, dtype, hd): dataclasses.replace(p, dtype=dtype)
            for (arch, d, hd), p in plans.items() if d == source and (arch, hd) not in unless}


def with_gate_bound(plans: dict[tuple[str, str, int], Plan], gate_bound: float) -> dict[tuple[str, str, int], Plan]:
    """Every row of ``plans`` with ``gate_bound`` set: the plan of the calls that pass a gate lower bound of at
    least ``gate_bound`` (the same chunks and launches; the kernels drop their run-time check of the gates)."""
    return {key: dataclasses.replace(p, gate_bound=gate_bound) for key, p in plans.items()}


def same_arch_plans_as(plans: dict[tuple[str, str, int], Plan], source: str, arch: str,
                       unless: tuple[tuple[str, int], ...] = ()) -> dict[tuple[str, str, int], Plan]:
    """An ``arch`` row for every ``source`` row of ``plans`` whose (dtype, head dim) is not in ``unless``: the
    same plan with only its arch changed (generated tables write a target's rows this way when they equal an
    earlier target's: the same limits, rules and measurements)."""
    return {(arch, d, hd): dataclasses.replace(p, arch=arch)
            for (a, d, hd), p in plans.items() if a == source and (d, hd) not in unless}
