"""``fla-gen aot --override``: one plan override applied to the op's plans that have its kernels (chunk kernels
to the chunk op, recurrent ones to the decode op), so a launch config's registers and spills can be read on the
CPU before a GPU times it; a kernel no plan of the op has is refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import generated.linear_attn.plans as linear_attn_plans
from fla_gen.aot_ops import split_override

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_an_override_splits_by_the_algorithm_whose_plans_have_the_kernel():
    split = split_override(linear_attn_plans, {"fwd_h": {"num_warps": 8}, "recurrent_fwd": {"num_warps": 2}})
    assert split == {"chunk": {"fwd_h": {"num_warps": 8}}, "fused_recurrent": {"recurrent_fwd": {"num_warps": 2}}}
    assert split_override(linear_attn_plans, None) == {"chunk": {}, "fused_recurrent": {}}
    with pytest.raises(ValueError, match=r"\['fwd_slove'\] that no plan of this op has; chunk: \[.*'fwd_h'"):
        split_override(linear_attn_plans, {"fwd_slove": {"num_warps": 2}, "fwd_h": {"num_warps": 8}})


def test_aot_compiles_the_overridden_configs(tmp_path):
    """linear_attn on sm80: every fwd_h launch (the forward's split walk, which pinning fwd_h selects, and the
    backward's recompute) on 8 warps, the decode kernel on 2; the kernels not named keep their plan's warps."""
    out = tmp_path / "aot.json"
    override = {"fwd_h": {"num_warps": 8}, "recurrent_fwd": {"num_warps": 2}}
    proc = subprocess.run([sys.executable, "-m", "fla_gen.cli", "aot", "specs/linear_attn.fla", "--arch", "sm80",
                           "--override", json.dumps(override), "--json", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    warps = {}
    for r in rows:
        warps.setdefault(r["kernel"], set()).add(r["num_warps"])
    assert warps["linear_attn_fwd_h_kernel"] == {8}, warps
    assert warps["linear_attn_recurrent_fwd_kernel"] == {2}, warps
    plan = linear_attn_plans.CHUNK_PLANS[("sm80", "bf16", 128)]
    assert warps["linear_attn_bwd_dh_kernel"] == {plan.config("bwd_dh").num_warps}, warps
