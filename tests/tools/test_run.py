"""benchmarks/run.py without a GPU: shapes and presets, the floor arithmetic, the worst-of-rounds rule, the
Markdown and JSON it writes, and one --fake run end to end (CPU stand-ins, one subprocess per shape)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "benchmarks"))

import _ops  # noqa: E402
import run  # noqa: E402


def test_dense_varlen_and_decode_shapes_parse():
    assert run.parse_shape("4x4096x16x128") == run.Shape("dense", 4, 4096, 16, 128, 128)
    assert run.parse_shape("2x64x2x16x32") == run.Shape("dense", 2, 64, 2, 16, 32)
    v = run.parse_shape("varlen:32x256-8192x16x128")
    assert (v.kind, v.B, v.H, v.K, len(v.lengths)) == ("varlen", 1, 16, 128, 32)
    assert all(256 <= n <= 8192 for n in v.lengths) and v.T == sum(v.lengths)
    assert v.name == "varlen:32x256-8192x16x128"
    one_long = run.parse_shape("varlen:16384+31x256-1024x16x128")
    assert one_long.lengths == (16384, *run.varlen_lengths(31, 256, 1024)) and one_long.T == sum(one_long.lengths)
    assert one_long.name == "varlen:16384+31x256-1024x16x128"
    assert run.parse_shape(one_long.name) == one_long
    d = run.parse_shape("decode:64x16x128")
    assert (d.kind, d.B, d.T, d.H, d.K, d.V) == ("decode", 64, 1, 16, 128, 128)


def test_varlen_lengths_are_fixed_by_the_seed():
    assert run.varlen_lengths(32, 256, 8192) == run.varlen_lengths(32, 256, 8192)
    assert run.varlen_lengths(32, 256, 8192, seed=1) != run.varlen_lengths(32, 256, 8192, seed=0)


@pytest.mark.parametrize("bad", ["4x4096", "varlen:32x8192-256x16x128", "decode:64", "foo:1x2x3x4", "axbxcxd",
                                 "varlen:0+31x256-1024x16x128", "varlen:+31x256-1024x16x128",
                                 "varlen:-5+31x256-1024x16x128"])
def test_bad_shapes_are_refused_by_name(bad):
    with pytest.raises(ValueError, match="shape"):
        run.parse_shape(bad)


def test_presets_expand_in_order_without_duplicates():
    shapes = run.parse_shapes("standard,long", "4x4096x16x128")
    names = [s.name for s in shapes]
    assert names == ["4x4096x16x128", "8x2048x32x64", "1x16384x16x128", "2x8192x8x256", "1x65536x16x128",
                     "1x131072x16x128"]
    with pytest.raises(ValueError, match="unknown preset 'nope'"):
        run.parse_shapes("nope", "")


def test_arguments():
    args = run.parse_args(["--ops", "gla,rwkv7", "--presets", "decode", "--libs", "ours", "--rounds", "2"])
    assert args.ops == ["gla", "rwkv7"] and args.libs == ["ours"] and args.rounds == 2
    assert [s.kind for s in args.shape_list] == ["decode"]
    for bad in (["--libs", "ours,flash"], ["--rounds", "0"], ["--presets", "", "--shapes", ""],
                ["--presets", "huge"]):
        with pytest.raises(SystemExit):
            run.parse_args(bad)
    with pytest.raises(SystemExit, match="unknown op"):
        run.parse_args(["--ops", "retnet"])
    # --shapes alone runs those shapes; without either, every preset
    assert [s.name for s in run.parse_args(["--shapes", "1x64x2x32"]).shape_list] == ["1x64x2x32"]
    assert run.parse_args([]).shape_list == run.parse_shapes(",".join(run.PRESETS), "")
    # the GPU unless told otherwise; --fake's stand-ins run on the CPU
    assert run.parse_args([]).device == "cuda" and run.parse_args(["--fake"]).device == "cpu"
    assert run.parse_args(["--fake", "--device", "cuda:1"]).device == "cuda:1"


def test_floor_arithmetic():
    # 1 GiB copied in 0.7158 ms moves 2 GiB: 3.0 TB/s
    assert run.copy_tbs(1 << 30, 0.7158) == pytest.approx(3.0, rel=1e-3)
    # 4x4096x16x128 bf16 q, k, v in and o out: 4 tensors of 64 MiB at 3.0 TB/s
    nbytes = 4 * 4 * 4096 * 16 * 128 * 2
    assert run.floor_ms(nbytes, 3.0) == pytest.approx(0.08948, rel=1e-3)


def test_the_reported_ratio_is_the_worst_round():
    ours, fla = [0.30, 0.20, 0.25], [0.45, 0.18, 0.50]
    assert run.worst_ratio(ours, fla) == pytest.approx(0.9)  # round 2, not the best (2.0) nor the medians' 1.8
    assert run.worst_ratio([0.3], []) is None
    assert run.worst_ratio([0.3, 0.3], [0.4]) is None  # an incomplete series has no ratio


def test_each_mode_times_both_libraries_in_alternating_slices():
    order = _ops.timing_order(["ours", "fla"], [["fwd", "fwdbwd"], ["fwd"]], 2, slices=2)
    assert order == [(0, "ours", "fwd"), (0, "fla", "fwd"), (0, "fla", "fwd"), (0, "ours", "fwd"),
                     (0, "ours", "fwdbwd"), (0, "ours", "fwdbwd"),
                     (1, "fla", "fwd"), (1, "ours", "fwd"), (1, "ours", "fwd"), (1, "fla", "fwd"),
                     (1, "ours", "fwdbwd"), (1, "ours", "fwdbwd")]
    assert _ops.timing_order(["ours"], [["fwd"]], 2) == [(0, "ours", "fwd"), (1, "ours", "fwd")]


def test_a_round_is_the_median_of_its_slices():
    def ours():
        pass

    def fla():
        pass

    # the settling round's time first, then the round's three slices
    times = {ours: iter([9.0, 0.3, 0.1, 0.2]), fla: iter([9.0, 0.5, 0.4, 0.6])}
    row = {}
    run._time_rounds({"ours": {"fwd": (ours, None)}, "fla": {"fwd": (fla, None)}}, row,
                     {"rounds": 1, "slices": 3, "device": "cpu"}, lambda fn, grads: next(times[fn]))
    assert row["ours"]["fwd"] == [0.2] and row["fla"]["fwd"] == [0.5]
    assert row["slices"] == {"ours": {"fwd": [[0.3, 0.1, 0.2]]}, "fla": {"fwd": [[0.5, 0.4, 0.6]]}}


def test_summarize_reports_medians_worst_ratio_and_floor():
    row = {"ours": {"fwd": [0.2, 0.4, 0.3], "fwdbwd": [1.0, 1.2, 1.1]}, "fla": {"fwd": [0.3, 0.5, 0.6]},
           "bytes_fwd": 3_000_000_000, "copy_tbs": 3.0}
    s = run.summarize(row)
    assert s["ours_fwd_ms"] == pytest.approx(0.3) and s["fla_fwd_ms"] == pytest.approx(0.5)
    assert s["ratio_fwd"] == pytest.approx(1.25)  # min(1.5, 1.25, 2.0)
    assert s["ratio_fwdbwd"] is None and s["fla_fwdbwd_ms"] is None
    assert s["floor_fwd_ms"] == pytest.approx(1.0) and s["ours_over_floor"] == pytest.approx(0.3)
    assert s["ratio_fwd_kernels"] is None  # no kernel times (not a CUDA run): no ratio of them


def test_summarize_reports_the_kernel_time_ratio():
    # fla's wall time host-bound (0.5 ms over 0.3 of kernels): the kernel ratio is the GPU work's alone
    row = {"ours": {"fwd": [0.2, 0.2]}, "fla": {"fwd": [0.5, 0.5]},
           "kernels": {"ours": {"fwd": 0.19}, "fla": {"fwd": 0.3}}}
    s = run.summarize(row)
    assert s["ratio_fwd"] == pytest.approx(2.5)
    assert s["ours_fwd_kernels_ms"] == pytest.approx(0.19) and s["ratio_fwd_kernels"] == pytest.approx(0.3 / 0.19)
    assert s["ratio_fwdbwd_kernels"] is None


def test_a_call_whose_host_time_reaches_its_kernel_time_is_host_bound():
    row = {"ours": {"fwd": [0.3, 0.3], "fwdbwd": [1.0, 1.0]}, "fla": {"fwd": [0.4, 0.4], "fwdbwd": [1.2, 1.2]},
           "kernels": {"ours": {"fwd": 0.16, "fwdbwd": 0.72}, "fla": {"fwd": 0.22, "fwdbwd": 0.90}},
           "host": {"ours": {"fwd": 0.29, "fwdbwd": 0.70}, "fla": {"fwd": 0.21, "fwdbwd": 1.10}}}
    s = run.summarize(row)
    assert s["host_bound_fwd"] == ["ours"] and s["host_bound_fwdbwd"] == ["fla"]
    assert run.summarize({"ours": {"fwd": [0.3]}, "host": {"ours": {"fwd": 0.5}}})["host_bound_fwd"] == []  # no kernels
    assert run.host_bound(0.2, 0.2) and not run.host_bound(0.19, 0.2)


def _report():
    rows = [{"op": "gla", "shape": "1x16384x16x128", "kind": "dense", "ours": {"fwd": [0.30, 0.31]},
             "fla": {"fwd": [0.27, 0.29]}, "kernels": {"ours": {"fwd": 0.30}, "fla": {"fwd": 0.24}},
             "bytes_fwd": 300_000_000, "copy_tbs": 3.0,
             "notes": {"fla fwdbwd": "RuntimeError: refused"}},
            {"op": "gla", "shape": "decode:64x16x128", "kind": "decode", "ours": {"fwd": [0.05, 0.05]},
             "bytes_fwd": 150_000_000, "copy_tbs": 3.0}]
    return run.build_report([{"shape": "x", "rows": rows, "device_name": "GPU X"}],
                            {"torch": "2.13", "triton": "3.6", "fla": None, "dtype": "bfloat16", "rounds": 2,
                             "command": "python benchmarks/run.py"})


def test_markdown_table():
    md = run.render_markdown(_report())
    assert "# Benchmark: GPU X" in md and "fla-core not installed" in md
    assert "## dense" in md and "## decode" in md and "## varlen" not in md
    dense = next(ln for ln in md.splitlines() if ln.startswith("| gla | 1x16384x16x128"))
    cells = [c.strip() for c in dense.strip("|").split("|")]
    assert cells[2:6] == ["0.305", "0.28", "**0.90**", "**0.80**"]  # worst round 0.27 / 0.30; kernels 0.24 / 0.30
    assert cells[6:10] == ["-", "-", "-", "-"]  # no forward+backward: no times, no ratios
    assert cells[12:] == ["0.1", "3.05"]
    assert "- gla 1x16384x16x128, fla fwdbwd: RuntimeError: refused" in md
    assert ": host-bound, " not in md and " h |" not in md  # no host times: nothing marked


def test_markdown_marks_a_host_bound_wall_ratio():
    report = _report()
    report["rows"][0]["host"] = {"ours": {"fwd": 0.42}, "fla": {"fwd": 0.1}}
    report["rows"][0].update(run.summarize(report["rows"][0]))
    md = run.render_markdown(report)
    dense = next(ln for ln in md.splitlines() if ln.startswith("| gla | 1x16384x16x128"))
    cells = [c.strip() for c in dense.strip("|").split("|")]
    assert cells[4:6] == ["**0.90** h", "**0.80**"]  # the wall ratio marked, the kernel ratio not
    assert "- gla 1x16384x16x128 fwd: host-bound, ours 0.42 ms of host over 0.3 of kernels" in md


def test_breakdown_lists_the_largest_kernels():
    report = _report()
    assert "Where the kernel time goes" not in run.render_markdown(report)  # not asked for: no section
    per_kernel = {f"k{i}": 0.1 * (12 - i) for i in range(10)}  # as kernel_breakdown returns it, largest first
    report["rows"][0]["per_kernel"] = {"ours": {"fwd": per_kernel}}
    report["rows"][0]["host"] = {"ours": {"fwd": 0.42}}
    md = run.render_markdown(report)
    line = next(ln for ln in md.splitlines() if ln.startswith("- gla 1x16384x16x128 ours fwd"))
    assert line.startswith("- gla 1x16384x16x128 ours fwd, 7.5 ms of kernels, host 0.42 ms: k0 1.2, k1 1.1,")
    assert line.endswith("k7 0.5, the rest 0.7")  # k8 and k9
    assert run.parse_args(["--breakdown"]).breakdown and not run.parse_args([]).breakdown


def test_fake_run_end_to_end(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "run.py"), "--fake", "--device", "cpu", "--presets", "",
           "--shapes", "1x32x2x16,decode:2x2x16", "--ops", "linear_attn,simple_gla,delta_rule", "--rounds", "2",
           "--out", str(out)]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "results.json").read_text())
    rows = {(r["op"], r["shape"]): r for r in report["rows"]}
    la = rows[("linear_attn", "1x32x2x16")]
    assert len(la["ours"]["fwd"]) == len(la["fla"]["fwd"]) == 2 and la["ratio_fwd"] > 0
    # one untimed settling round per library and mode, apart from the timed ones
    assert set(la["settle"]) == {"ours", "fla"} and set(la["settle"]["ours"]) == {"fwd", "fwdbwd"}
    assert la["sdpa"]["fwd"] and la["ours_over_floor"] > 0
    # the host's time per call, for every library and mode that was timed (on the CPU, the whole call)
    both = {"fwd", "fwdbwd"}
    assert {lib: set(modes) for lib, modes in la["host"].items()} == {"ours": both, "fla": both}
    assert la["ours_fwd_host_ms"] > 0
    assert "fwdbwd" not in rows[("linear_attn", "decode:2x2x16")]["ours"]
    assert "no stand-in" in rows[("delta_rule", "1x32x2x16")]["notes"]["ours fwd"]
    # a library whose backward raises (fla's gated chunk_simple_gla on Hopper) still has its forward timed
    sg = rows[("simple_gla", "1x32x2x16")]
    assert len(sg["fla"]["fwd"]) == 2 and "fwdbwd" not in sg["fla"] and "refused" in sg["notes"]["fla fwdbwd"]
    assert sg["ratio_fwd"] > 0 and sg["ratio_fwdbwd"] is None and len(sg["ours"]["fwdbwd"]) == 2
    assert (out / "results.md").read_text().startswith("# Benchmark: cpu")
    assert sorted(p.name for p in (out / "shapes").iterdir()) == ["1x32x2x16.json", "decode_2x2x16.json"]
