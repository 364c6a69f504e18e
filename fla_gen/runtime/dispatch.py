"""Pick the build-time plan that fits a call: the device's arch, the dtype, the head-dim bucket."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
from collections.abc import Iterator, Mapping

import torch

from fla_gen.runtime.plan_types import HEAD_DIM_BUCKETS, Plan, head_dim_bucket

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


_forced_arch: str | None = None


@contextlib.contextmanager
def forced_arch(arch: str) -> Iterator[None]:
    """Use the plans of ``arch`` whatever the device (ahead-of-time compiles for other GPUs)."""
    global _forced_arch
    previous, _forced_arch = _forced_arch, arch
    try:
        yield
    finally:
        _forced_arch = previous


def arch_of(device: torch.device) -> str:
    """The plan key of a device: sm80, sm86, sm89, sm90 or sm100 (the interpreter on the CPU uses sm80)."""
    if _forced_arch is not None:
        return _forced_arch
    if device.type != "cuda":
        return "sm80"
    return _cuda_arch(device)


@functools.lru_cache(maxsize=64)
def _cuda_arch(device: torch.device) -> str:
    # Cached: get_device_capability costs a few us per call and a device's arch never changes.
    major, minor = torch.cuda.get_device_capability(device)
    if major >= 10:
        return "sm100" if major == 10 else "sm89"  # sm120 parts have ~100 KB of shared memory, as sm89
    if major == 9:
        return "sm90"
    if major == 8:
        return {0: "sm80", 6: "sm86", 7: "sm86", 9: "sm89"}.get(minor, "sm86")
    return "sm80"


def select_plan(plans: dict[tuple[str, str, int], Plan], device: torch.device, dtype: torch.dtype,
                head_dim: int) -> Plan:
    """The plan for (arch of ``device``, ``dtype``, smallest bucket holding ``head_dim``), with any
    active plan override applied (``overridden_plans``, ``FLA_GEN_PLAN_OVERRIDE``)."""
    bucket = head_dim_bucket(head_dim)
    key = (arch_of(device), _DTYPE_NAMES[dtype], bucket)
    if key not in plans:
        others = sorted({d for a, d, b in plans if a == key[0] and b == bucket})
        raise ValueError(f"no plan for {key[1]} inputs at head dim <= {bucket} on {key[0]}: the kernels do not fit its "
                         f"shared memory; use {' or '.join(others) or 'a smaller head dim'}")
    return apply_plan_override(plans[key])


# ----------------------------------------------------------------------------- experiments

# The LaunchConfig fields an experiment may change; the chunk size and the reasons stay the planner's.
OVERRIDE_FIELDS = ("block_k", "block_v", "num_warps", "num_stages", "reads_inverse", "inverse_min_group")
OVERRIDE_ENV = "FLA_GEN_PLAN_OVERRIDE"

_override: dict[str, dict[str, int]] | None = None
_env_cache: tuple[str, dict[str, dict[str, int]]] | None = None


def parse_plan_override(overrides: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """Check ``{stage: {field: value}}`` (fields from OVERRIDE_FIELDS: positive ints, tiles powers of two >= 16;
    reads_inverse a bool) and return a plain copy; ValueError names the bad stage or field. reads_inverse without
    inverse_min_group means it at every group size (inverse_min_group 1)."""
    if not isinstance(overrides, Mapping):
        raise ValueError(f"plan override: expected {{stage: {{field: value}}}}, got {type(overrides).__name__}")
    out: dict[str, dict[str, int]] = {}
    for stage, fields in overrides.items():
        if not isinstance(fields, Mapping) or not fields:
            raise ValueError(f"plan override of kernel {stage!r}: expected a non-empty {{field: value}} mapping")
        for name, value in fields.items():
            if name not in OVERRIDE_FIELDS:
                raise ValueError(f"plan override of kernel {stage!r}: unknown field {name!r}; "
                                 f"known: {', '.join(OVERRIDE_FIELDS)}")
            if name == "reads_inverse":
                if not isinstance(value, bool):
                    raise ValueError(f"plan override of kernel {stage!r}: reads_inverse must be true or false, "
                                     f"got {value!r}")
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"plan override of kernel {stage!r}: {name} must be a positive int, got {value!r}")
            if name.startswith("block") and (value < 16 or value & (value - 1)):
                raise ValueError(f"plan override of kernel {stage!r}: {name} must be a power of two >= 16 "
                                 f"(tl.dot tiles), got {value}")
        out[str(stage)] = dict(fields)
        if "reads_inverse" in fields and "inverse_min_group" not in fields:
            out[str(stage)]["inverse_min_group"] = 1
    return out


@contextlib.contextmanager
def overridden_plans(overrides: Mapping[str, Mapping[str, int]]) -> Iterator[None]:
    """Launch kernels with changed LaunchConfig fields, for benchmarks that try plan variants
    without rebuilding: ``with overridden_plans({"fwd_o": {"block_v": 64, "num_warps": 8}}): op(...)``.

    Applies to every plan selected inside the block (the backward uses the plan its forward
    selected); every named kernel must be in that plan (ValueError otherwise). Takes precedence
    over the ``FLA_GEN_PLAN_OVERRIDE`` environment variable (the same mapping as JSON).
    """
    global _override
    parsed = parse_plan_override(overrides)
    previous, _override = _override, parsed
    try:
        yield
    finally:
        _override = previous


def active_plan_override() -> dict[str, dict[str, int]] | None:
    """The plan override in force now (``overridden_plans`` or the environment), or None."""
    return _active_override()


def _active_override() -> dict[str, dict[str, int]] | None:
    global _env_cache
    if _override is not None:
        return _override
    text = os.environ.get(OVERRIDE_ENV)
    if not text:
        return None
    if _env_cache is None or _env_cache[0] != text:
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{OVERRIDE_ENV} is not JSON ({e}): {text!r}") from None
        _env_cache = (text, parse_plan_override(parsed))
    return _env_cache[1]


def apply_plan_override(plan: Plan) -> Plan:
    """``plan`` with the active override's fields replaced (reasons marked), or ``plan`` itself."""
    override = _active_override()
    if not override:
        return plan
    stages = [name for name, _ in plan.kernels]
    unknown = sorted(set(override) - set(stages))
    if unknown:
        raise ValueError(f"plan override names kernel(s) {unknown} that this op's plan does not have; known: {stages}")
    kernels = tuple(
        (name, dataclasses.replace(cfg, **override[name], pinned=True,
                                   reason=f"override {override[name]} ({cfg.reason or cfg.source})"))
        if name in override else (name, cfg)
        for name, cfg in plan.kernels
    )
    return dataclasses.replace(plan, kernels=kernels)


def select_bounded_plan(plan: Plan, bounded_plans: dict[tuple[str, str, int], Plan], gate_lower_bound: float) -> Plan:
    """The plan of ``bounded_plans`` for the same (arch, dtype, head dim) as ``plan`` when the caller's
    gate lower bound is at least the one it relies on (``Plan.gate_bound``); else ``plan`` itself."""
    bounded = bounded_plans.get((plan.arch, plan.dtype, plan.head_dim))
    if bounded is None or bounded.gate_bound is None or gate_lower_bound < bounded.gate_bound:
        return plan
    return apply_plan_override(bounded)


def plan_covers(plans: Mapping[tuple[str, str, int], Plan], device: torch.device, dtype: torch.dtype,
                head_dim: int) -> bool:
    """Whether ``plans`` hold a row for (arch of ``device``, ``dtype``, bucket of ``head_dim``): a call at that
    head dim would run rather than be refused by :func:`select_plan`."""
    if dtype not in _DTYPE_NAMES or head_dim > HEAD_DIM_BUCKETS[-1]:
        return False
    return (arch_of(device), _DTYPE_NAMES[dtype], head_dim_bucket(head_dim)) in plans
