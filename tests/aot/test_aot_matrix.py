"""Every generated kernel, compiled ahead of time for sm80, sm89, sm90 and sm100 with its plan.

`fla-gen aot --all` runs in a subprocess without TRITON_INTERPRET (compiles need real
@triton.jit kernels). It captures the launches of chunk and fused_recurrent, forward and
backward (dense everywhere, varlen on sm89 and sm90; at head dims 128, and 64 and 256 dense where
the target has a plan for them), compiles each specialization for its
target and fails on a compile error, shared memory over the arch limit, or an MMA -> MMA
layout conversion off Ampere. Here we also check that wgmma is used on sm90 where the plan
tiles a kernel for the tensor cores, unless a measured plan gave it fewer than 4 warps.
"""

import json
import os
import subprocess
import sys

import pytest

from fla_gen.plan import ARCHS, SMALL_GRID_SPLIT, plan_chunk_size, select_algorithms
from fla_gen.tuned import TUNED
from tests.support import REPO_ROOT, SPECS, recurrence

# (algorithm, stage) of the measured sm90 plans with fewer than 4 warps (fla_gen/measurements.py says why)
NARROW_TUNED_SM90 = {(algorithm, stage) for (algorithm, stage, _, _), e in TUNED["sm90"].items() if e.num_warps < 4}


@pytest.fixture(scope="module")
def aot_reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("aot") / "aot.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "fla_gen.cli", "aot", "--all", "--head-dims", "128,64,256", "--json", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=3000,
    )
    return proc, json.loads(out.read_text()) if out.exists() else []


def test_every_kernel_compiles_cleanly_for_every_target(aot_reports):
    proc, rows = aot_reports
    problems = [r for r in rows if r["problems"]]
    assert proc.returncode == 0 and not problems, proc.stdout[-4000:] + proc.stderr[-4000:]
    caps = {r["cap"] for r in rows}
    assert caps == {80, 89, 90, 100}
    for spec in SPECS:
        for cap in caps:
            op = recurrence(spec.stem).spec.op
            kernels = {r["kernel"] for r in rows if r["op"] == op and r["cap"] == cap}
            assert any("recurrent_fwd" in k for k in kernels) and any("fwd_h" in k for k in kernels), (spec, cap)
    assert {r["variant"] for r in rows if r["cap"] in (89, 90)} >= {"dense", "varlen"}
    # the walks over sequence segments and their scan, for every algorithm that splits long sequences
    for spec in SPECS:
        rec = recurrence(spec.stem)
        if any(a.splits_sequences for a in select_algorithms(rec)):
            for cap in caps:
                assert any("segment_scan" in r["kernel"] for r in rows if r["op"] == rec.spec.op and r["cap"] == cap)
    # every plan row of the other head-dim buckets compiles too (gla at 256 once overflowed sm90's shared
    # memory, found only on the H100): every spec has rows at 64 and 256 on sm90
    for spec in SPECS:
        op = recurrence(spec.stem).spec.op
        assert {r["variant"] for r in rows if r["op"] == op and r["cap"] == 90} >= {"dense_k64", "dense_k256"}, spec
    # the bounded-gate plans of the DPLR family, with cu_seqlens on sm90
    rwkv7_sm90 = {r["variant"] for r in rows if r["op"] == "rwkv7" and r["cap"] == 90}
    assert rwkv7_sm90 == {"dense", "varlen", "bounded_varlen", "dense_k64", "dense_k256"}


def test_sm90_matrix_kernels_use_wgmma(aot_reports):
    _, rows = aot_reports
    for spec in SPECS:
        rec = recurrence(spec.stem)
        op = rec.spec.op
        # wgmma needs M >= 64: with 16-token chunks only the whole-K kernels (M = K) qualify, and kernels
        # over 16-token sub-chunks never do
        short_chunks = plan_chunk_size(rec, ARCHS["sm90"])[0] < 64
        matrix_stages = {k.stage: algo.name for algo in select_algorithms(rec) for k in algo.kernels
                         if k.tiles and not k.sub_chunk and (k.whole_k or not short_chunks)}
        split_stages = {k.stage for algo in select_algorithms(rec) for k in algo.kernels
                        if k.small_grid_split == SMALL_GRID_SPLIT}
        assert matrix_stages, spec
        for r in rows:
            stage = r["kernel"].removeprefix(f"{op}_").removesuffix("_kernel")
            if r["op"] == op and r["cap"] == 90 and stage in matrix_stages:
                if stage in split_stages and "BK=32" in r["launch"]:
                    # a small grid's split state walk (launch.state_walk_tiles): M = 32 rules wgmma out; measured
                    # faster than the plan's wgmma tiles there (fla_gen/measurements.py, h100-split-walk)
                    assert not r["problems"], r
                elif r["num_warps"] < 4:
                    # fewer warps than one warp group rules wgmma out: only a measured plan may ask for that
                    assert (matrix_stages[stage], stage) in NARROW_TUNED_SM90, f"{r['kernel']}: {r['num_warps']} warps"
                else:
                    assert r["uses_wgmma"], f"{r['kernel']} on sm90 does not use wgmma"


# The chunk stages that load a [BT, BT] tile (the inverse Ai, A or dA, some of them triangular). A load mask that
# varies along the tile's contiguous dim splits it into per-element loads: 32 narrow loads per thread for one
# [64, 64] 16-bit tile on 4 warps (docs/design.md, "Kernel conventions: triangular tiles load whole rows"); the
# per-token vectors these kernels gather (beta, gates) account for the rest, 18 at most (bwd_wy).
SQUARE_TILE_STAGES = ("fwd_wu", "fwd_fused", "fwd_o", "bwd_wy", "bwd_dv", "bwd_dqk_intra", "bwd_dqk_intra_chunk")


def test_sm90_square_tiles_load_whole_rows(aot_reports):
    _, rows = aot_reports
    checked = 0
    for spec in SPECS:
        op = recurrence(spec.stem).spec.op
        for r in rows:
            stage = r["kernel"].removeprefix(f"{op}_").removesuffix("_kernel")
            if r["op"] == op and r["cap"] == 90 and stage in SQUARE_TILE_STAGES:
                checked += 1
                assert r["narrow_loads"] < 32, f"{r['launch']}: {r['narrow_loads']} one- or two-byte global loads"
    assert checked > 20


def test_template_decays_flush_denormals(aot_reports):
    """The templates' exps go through exp_ftz (fla_gen/runtime/triton_math.py), never tl.exp: no ex2.approx.f32
    without .ftz in any chunk or recurrent kernel. The spec's own transforms still render tl.exp (the pass
    kernels, and the lines a recurrent kernel applies inline), and they show that the count sees it."""
    _, rows = aot_reports
    inline_transforms = {recurrence(spec.stem).spec.op for spec in SPECS if recurrence(spec.stem).spec.transforms}
    from_spec, from_templates = [], []
    for r in rows:
        spec_code = "_transform_" in r["kernel"] or (r["op"] in inline_transforms and "recurrent" in r["kernel"])
        (from_spec if spec_code else from_templates).append(r)
    assert len(from_templates) > 500 and any(r["denormal_exps"] for r in from_spec)
    flagged = sorted({f"{r['kernel']} sm{r['cap']}" for r in from_templates if r["denormal_exps"]})
    assert not flagged, flagged
