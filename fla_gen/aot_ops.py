"""Compile every kernel of generated ops ahead of time for real GPU targets, without a GPU.

For each target arch the op is called on CPU stand-in inputs with that arch's plans forced
(chunk and fused recurrent, forward and backward, with and without cu_seqlens; fused recurrent also
without autograd, where it applies a spec's transforms inline), every kernel launch is captured
instead of run, and each captured specialization is compiled with ``triton.compile`` for the target
(``fla_gen.aot``). Must run with TRITON_INTERPRET unset.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fla_gen.aot import CompiledKernelReport, capture_launches, check_report, compile_all, dedupe_launches
from fla_gen.canonical import Recurrence
from fla_gen.lower import lower
from fla_gen.plan import ARCHS
from fla_gen.runtime.dispatch import forced_arch, overridden_plans
from fla_gen.runtime.launch import forced_sm_count
from fla_gen.runtime.segments import forced_segment_chunks
from fla_gen.sample import sample_inputs

ARCH_OF_CAP = {80: "sm80", 86: "sm86", 89: "sm89", 90: "sm90", 100: "sm100"}
# SMs of one GPU per target (plan.ArchInfo.sm_count): the AOT calls' grids (2 sequences x 2 heads) are far
# below any of them, so their state walks take launch.state_walk_tiles' smallest tiles.
SM_COUNT_OF_CAP = {cap: ARCHS[arch].sm_count for cap, arch in ARCH_OF_CAP.items()}


@dataclass(frozen=True)
class MatrixEntry:
    """One compiled kernel specialization for one target, and what is wrong with it (if anything)."""

    op: str
    variant: str
    report: CompiledKernelReport
    problems: tuple[str, ...]


# The gate lower bound of the "bounded" variants: inside every bounded plan's limit (about -9.55).
_AOT_GATE_BOUND = -0.5


def _call_op(pkg, rec: Recurrence, mode: str, dtype: torch.dtype, varlen: bool, K: int, V: int,
             bounded: bool = False) -> None:
    op = rec.spec.op
    B, T, H = (1, 192, 2) if varlen else (2, 128, 2)
    # a grouped spec's kernels compiled as a grouped call runs them: q, k on H heads, the rest on HV = 2 H
    HV = 2 * H if rec.spec.grouped else H
    x = sample_inputs(rec, B, T, H, K, V, dtype, seed=0, HV=HV)
    extra = {}
    if bounded:
        # every input of the gate at 0 (the token gate and a per-head one: the bound holds for their sum); a
        # derived gate's value at 0 is checked against the bound by the op itself
        for name in lower(rec).gate_inputs:
            x[name] = torch.zeros_like(x[name])
        extra["gate_lower_bound"] = _AOT_GATE_BOUND
    N = 3 if varlen else B
    h0 = torch.zeros(N, HV, K, V, requires_grad=True)
    leaves = [*x.values(), h0]
    for t in leaves:
        t.requires_grad_(True)
    cu = torch.tensor([0, 64, 100, 192], dtype=torch.int32) if varlen else None
    fn = getattr(pkg, f"{mode}_{op}")
    args = [x[i.name] for i in rec.spec.inputs]
    o, ht = fn(*args, initial_state=h0, output_final_state=True, cu_seqlens=cu, **extra)
    torch.autograd.grad((o.float().sum() + ht.sum()), leaves, allow_unused=True)
    if mode == "fused_recurrent":
        # the decode path: without autograd the recurrent forward applies a spec's transforms inline
        with torch.no_grad():
            fn(*args, initial_state=h0, output_final_state=True, cu_seqlens=cu, **extra)
    if rec.spec.flags:
        # the transform kernels as compiled with every guarded line switched on (the calls above ran with
        # the flags' defaults); keyword inputs of those lines given as zeros
        switched = {f.name: True for f in rec.spec.flags}
        sizes = {"H": H, "HV": HV, rec.spec.key_dim: K, rec.spec.value_dim: V}
        switched.update({i.name: torch.zeros([sizes[d] for d in i.dims]) for i in rec.spec.guarded_inputs})
        o, ht = fn(*args, initial_state=h0, output_final_state=True, cu_seqlens=cu, **extra, **switched)
        torch.autograd.grad((o.float().sum() + ht.sum()), leaves, allow_unused=True)


def _call_overridden(override: dict, *args, **kwargs) -> None:
    """_call_op under ``override`` (empty: the plans as they are)."""
    with overridden_plans(override) if override else contextlib.nullcontext():
        _call_op(*args, **kwargs)


_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


class UnknownOverrideKernel(ValueError):
    """A plan override names a kernel that no plan of the op has."""


def split_override(tables, override: Mapping[str, Mapping[str, int]] | None) -> dict[str, dict]:
    """A plan override ({stage: {field: value}}) split by the op's algorithm: {"chunk": ..., "fused_recurrent":
    ...}, each holding the entries whose kernel the plans of that algorithm have, so that one override can name
    chunk kernels without the decode op refusing it. UnknownOverrideKernel names the kernels that no plan of the
    op has."""
    if not override:
        return {"chunk": {}, "fused_recurrent": {}}
    stages = {mode: {s for t in names if hasattr(tables, t) for plan in getattr(tables, t).values()
                     for s, _ in plan.kernels}
              for mode, names in (("chunk", ("CHUNK_PLANS", "BOUNDED_CHUNK_PLANS")),
                                  ("fused_recurrent", ("RECURRENT_PLANS",)))}
    unknown = sorted(set(override) - stages["chunk"] - stages["fused_recurrent"])
    if unknown:
        raise UnknownOverrideKernel(f"plan override names kernel(s) {unknown} that no plan of this op has; chunk: "
                         f"{sorted(stages['chunk'])}, fused_recurrent: {sorted(stages['fused_recurrent'])}")
    return {mode: {k: dict(v) for k, v in override.items() if k in names} for mode, names in stages.items()}


def compile_op_matrix(rec: Recurrence, caps=(80, 89, 90, 100), dtype: torch.dtype = torch.bfloat16,
                      head_dims=(128,), varlen_caps=(89, 90), jobs: int = 2,
                      override: Mapping[str, Mapping[str, int]] | None = None) -> list[MatrixEntry]:
    """Compile all kernels of ``generated.<op>`` for each cap and head dim (K = V), each with that
    target's plan. The first head dim gets the full matrix (dense, varlen on ``varlen_caps``, the
    bounded-gate plans); the others dense calls only, on the targets whose plan tables have a row
    for them (a call that needs a missing row is refused on the host, so it has nothing to compile).
    Variants of the other head dims are named ``dense_k<dim>``. ``override``: a plan override (checked
    with fla_gen.runtime.dispatch.parse_plan_override) applied to the plans that have its kernels: what a
    launch config would cost in registers and spills before a GPU times it."""
    pkg = importlib.import_module(f"generated.{rec.spec.package}")
    tables = importlib.import_module(f"generated.{rec.spec.package}.plans")
    overrides = split_override(tables, override)
    dtype_name = _DTYPE_NAMES[dtype]
    entries = []
    for i, head_dim in enumerate(head_dims):
        for cap in caps:
            key = (ARCH_OF_CAP[cap], dtype_name, head_dim)
            if any(key not in getattr(tables, t) for t in ("CHUNK_PLANS", "RECURRENT_PLANS")):
                continue
            suffix = "" if i == 0 else f"_k{head_dim}"
            for varlen in (False, True) if i == 0 and cap in varlen_caps else (False,):
                # The plan's tiles, and for dense calls also the tiles the launchers pick on the target's GPU,
                # where these small grids split the state walk (launch.state_walk_tiles), and there with the
                # sequences split into segments (fla_gen/runtime/segments.py: one chunk each, so that these
                # short calls take that path; a no-op for the algorithms that do not split); and on one SM, where
                # every grid is a large one (fwd_fused's two-per-SM launch, launch.fused_walk_choice), whole and
                # split.
                launches = []
                for sms, segment_chunks in ((0, 0),) if varlen else ((0, 0), (SM_COUNT_OF_CAP[cap], 0),
                                                                      (SM_COUNT_OF_CAP[cap], 1), (1, 0), (1, 1)):
                    with forced_arch(ARCH_OF_CAP[cap]), forced_sm_count(sms), forced_segment_chunks(segment_chunks):
                        launches += capture_launches(lambda v=varlen, d=head_dim: [
                            _call_overridden(overrides[mode], pkg, rec, mode, dtype, v, d, d)
                            for mode in ("chunk", "fused_recurrent")
                        ])
                launches = dedupe_launches(launches)
                variant = ("varlen" if varlen else "dense") + suffix
                for report in compile_all(launches, [cap], jobs=jobs):
                    entries.append(MatrixEntry(rec.spec.op, variant, report, tuple(check_report(report))))
            # chunk ops with a plan for bounded gates (FACTORED kernels), where this
            # target has one; with cu_seqlens on the last of varlen_caps
            # (an op without a per-token gate has no gate_lower_bound argument: nothing to bound)
            if i or key not in getattr(tables, "BOUNDED_CHUNK_PLANS", {}) or not lower(rec).features.token_gate:
                continue
            varlen = bool(varlen_caps) and cap == varlen_caps[-1]
            with forced_arch(ARCH_OF_CAP[cap]):
                launches = capture_launches(lambda v=varlen, d=head_dim: _call_overridden(
                    overrides["chunk"], pkg, rec, "chunk", dtype, v, d, d, bounded=True))
            for report in compile_all(launches, [cap], jobs=jobs):
                entries.append(MatrixEntry(rec.spec.op, "bounded_varlen" if varlen else "bounded", report,
                                           tuple(check_report(report))))
    return entries
