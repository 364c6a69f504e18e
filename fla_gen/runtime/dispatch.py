"""Pick the build-time plan that fits a call: the device's arch, the dtype, the head-dim bucket."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from fla_gen.runtime.plan_types import Plan, head_dim_bucket

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
    """The plan for (arch of ``device``, ``dtype``, smallest bucket holding ``head_dim``)."""
    bucket = head_dim_bucket(head_dim)
    key = (arch_of(device), _DTYPE_NAMES[dtype], bucket)
    if key not in plans:
        others = sorted({d for a, d, b in plans if a == key[0] and b == bucket})
        raise ValueError(f"no plan for {key[1]} inputs at head dim <= {bucket} on {key[0]}: the kernels do not fit its "
                         f"shared memory; use {' or '.join(others) or 'a smaller head dim'}")
    return plans[key]
