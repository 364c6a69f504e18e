"""benchmarks/bench_ops.py helpers on the CPU: the issue-7 shape preset, the floor ratio, 'no plan' cells."""

import sys

from tests.support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import _ops  # noqa: E402
import bench_ops  # noqa: E402


def test_issue7_preset_and_explicit_shapes():
    assert _ops.parse_shapes("issue7") == [(4, 4096, 16, 128, 128), (8, 2048, 32, 64, 64),
                                           (1, 16384, 16, 128, 128), (2, 8192, 8, 256, 256)]
    assert _ops.parse_shapes("2x64x2x16x32, issue7,4x4096x16x128")[:2] == [(2, 64, 2, 16, 32), (4, 4096, 16, 128, 128)]
    assert len(_ops.parse_shapes("issue7,4x4096x16x128")) == 4


def test_floor_ratio_and_no_plan_cells():
    no_plan = "ValueError: no plan for bf16 inputs at head dim <= 256 on sm86: the kernels do not fit"
    report = {"copy_tbs": 2.0, "rows": [
        {"op": "gla", "shape": "4x4096x16x128", "mode": "chunk",
         "ours": {"fwd_ms": 0.3, "fwdbwd_ms": 1.0, "bytes_in": 10**8, "bytes_out": 10**8},
         "fla": {"fwd_ms": 0.6, "fwdbwd_ms": 1.5}},
        {"op": "delta_rule", "shape": "2x8192x8x256", "mode": "chunk", "ours": {"errors": {"fwd": no_plan}}},
    ]}
    bench_ops._derive(report)
    row = report["rows"][0]
    assert row["floor_fwd_ms"] == 0.1 and row["floor_ratio_fwd_ms"] == 3.0 and row["ratio_fwd_ms"] == 2.0
    assert row["floor_fwdbwd_ms"] == 0.25 and row["floor_ratio_fwdbwd_ms"] == 4.0
    table = bench_ops.render_table(report)
    line = next(li for li in table.splitlines() if li.startswith("delta_rule"))
    assert "no plan[1]" in line and f"[1] {no_plan}" in table


def test_autotune_results_are_copied_with_their_hash_dir_and_nothing_else(tmp_path):
    """bench_ops --autotune-cache: only Triton's ``<hash>/<kernel>.autotune.json`` files travel, under
    their hash directory (Triton's cache key), and a file already there is kept."""
    src, dst = tmp_path / "run_cache", tmp_path / "carried"
    for rel, text in {"worker_a/H1/k1.autotune.json": "a", "worker_b/H2/k2.autotune.json": "b",
                      "worker_b/H2/k2.cubin": "binary", "worker_a/H3/k3.json": "metadata"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    (dst / "H2").mkdir(parents=True)
    (dst / "H2" / "k2.autotune.json").write_text("kept")
    assert bench_ops.copy_autotune_results(src, dst) == 1
    assert sorted(str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file()) == ["H1/k1.autotune.json",
                                                                                       "H2/k2.autotune.json"]
    assert (dst / "H2" / "k2.autotune.json").read_text() == "kept"
    assert bench_ops.copy_autotune_results(tmp_path / "missing", dst) == 0
