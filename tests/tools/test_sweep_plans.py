"""benchmarks/sweep_plans.py on the CPU: the variant grid, a --fake sweep end to end (overrides in
the interpreter, a refused variant, a worker crash and its restart), the table and the proposals."""

import json
import os
import subprocess
import sys

from fla_gen.measurements import Source
from fla_gen.tuned import Tuned
from tests.support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import sweep_plans  # noqa: E402

DEFAULT = {"block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 2}


def test_variants_nearest_first_within_the_head_dim():
    vs = sweep_plans.variants(DEFAULT, K=64, V=128, limit=100)
    assert DEFAULT not in vs and len({sweep_plans.vkey(v) for v in vs}) == len(vs)
    assert all(v["block_k"] <= 64 and v["block_v"] <= 128 for v in vs)
    changed = [sum(v[f] != DEFAULT[f] for f in sweep_plans.FIELDS) for v in vs]
    assert changed == sorted(changed) and changed[0] == 1
    assert {sweep_plans.vkey(v) for v in vs if sum(v[f] != DEFAULT[f] for f in sweep_plans.FIELDS) == 1} == {
        "bk32_bv64_w4_s2", "bk64_bv32_w4_s2", "bk64_bv128_w4_s2", "bk64_bv64_w8_s2", "bk64_bv64_w4_s1",
        "bk64_bv64_w4_s3", "bk64_bv64_w4_s4"}
    first = sweep_plans.variants(DEFAULT, K=64, V=64, limit=3, extra=[{"num_warps": 2}, {}])
    assert sweep_plans.vkey(first[0]) == "bk64_bv64_w2_s2" and len(first) == 3  # the default itself is dropped
    small = sweep_plans.variants(DEFAULT, K=20, V=64, limit=100)  # tiles clamp to 32 on K: so does the default
    assert all(v["block_k"] == 32 for v in small) and "bk32_bv64_w4_s2" not in map(sweep_plans.vkey, small)


def test_fake_sweep_records_wins_failures_and_crashes(tmp_path):
    out = tmp_path / "sweep.json"
    # K = 20: the launcher clamps block_k to 32 (the default's 64 too), so bk128 launches as the default.
    # Variants in order: bv48, bk128 (extra), then around (32, 64, 4, 2): s3, s4, bv32, s1 (w8 is the seventh);
    # the worker dies at bv32 and hits a CUDA error at s1.
    env = dict(os.environ, **{sweep_plans.CRASH_ENV: "fwd_o:bk32_bv32_w4_s2,cuda:fwd_o:bk32_bv64_w4_s1"})
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "sweep_plans.py"), "--fake", "--quick",
           "--ops", "linear_attn", "--shapes", "1x20x1x20x64", "--stages", "fwd_o", "--max-variants", "6",
           "--extra-variants", json.dumps({"fwd_o": [{"block_v": 48}, {"block_k": 128}]}), "--budget-s", "200",
           "--out", str(out), "--workdir", str(tmp_path / "wd")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert (row["op"], row["stage"], row["mode"]) == ("linear_attn", "fwd_o", "fwd")
    assert row["default"]["cfg"] == {"block_k": 64, "block_v": 64, "num_warps": 4, "num_stages": 2}
    status = {v["variant"]: v["status"] for v in row["variants"]}
    assert len(status) == len(row["variants"]) == 6  # each once: a restarted worker skips what is done
    assert status["bk32_bv48_w4_s2"] == "error"  # refused by the dispatcher, the sweep goes on
    assert status["bk128_bv64_w4_s2"] == "same_launch"  # not timed: it is the default's launch
    assert status["bk32_bv32_w4_s2"] == "crash"  # the worker died there and was restarted after it
    assert status["bk32_bv64_w4_s1"] == "crash"  # a CUDA error: recorded, then a fresh worker
    ok = [v for v in row["variants"] if v["status"] == "ok"]
    assert [v["variant"] for v in ok] == ["bk32_bv64_w4_s3", "bk32_bv64_w4_s4"]
    # the sweep marks "ok" only under --tol (1e-2); fp32 tiles of one op agree far closer than that
    assert all(v["max_err"] <= 1e-5 and v["op_ms"] > 0 and v["launch"][0][:2] == [32, 64] for v in ok)
    assert report["workers"]["linear_attn_1x20x1x20x64"]["starts"] == 3
    assert row["best"] in {v["variant"] for v in ok} and row["speedup"] > 0
    table = sweep_plans.render_table(report)
    assert "fwd_o" in table and "bk32_bv32_w4_s2: crash" in table and "block_v must be a power of two" in table


def test_fake_sweep_of_grouped_value_heads(tmp_path):
    """--value-heads: v, g and beta on HV heads, q and k on the shape's H, in the worker's inputs and the report;
    an op without grouped heads, or an HV that is not a multiple of H, is a usage error before any worker."""
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "sweep_plans.py"), "--fake", "--quick",
           "--ops", "gated_delta_rule", "--shapes", "1x32x2x32", "--value-heads", "4", "--stages", "fwd_solve",
           "--max-variants", "1", "--budget-s", "200", "--out", str(out), "--workdir", str(tmp_path / "wd")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["value_heads"] == 4
    inputs = report["workers"]["gated_delta_rule_1x32x2x32"]["inputs"]
    assert inputs == {"q": [1, 32, 2, 32], "k": [1, 32, 2, 32], "v": [1, 32, 4, 32], "g": [1, 32, 4],
                      "beta": [1, 32, 4]}, inputs
    (row,) = report["rows"]
    assert row["stage"] == "fwd_solve" and row["variants"][0]["status"] == "ok", row
    assert "value heads 4" in sweep_plans.render_table(report)
    for bad, words in ((["--ops", "gla"], "gla has no grouped value heads"),
                       (["--ops", "gated_delta_rule", "--shapes", "1x32x3x32"], "is not a multiple of H = 3")):
        proc = subprocess.run([*cmd[:2], "--fake", "--value-heads", "4", *bad], capture_output=True, text=True,
                              timeout=120, cwd=REPO_ROOT)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr


def test_fake_sweep_finds_the_kernels_of_a_package_named_apart_from_its_op(tmp_path):
    """generated.dplr's kernels are dplr_delta_rule_*: the sweep finds the stage's launch there, so a variant that
    launches as the default is recorded as such instead of being timed as a new config."""
    out = tmp_path / "sweep.json"
    cmd = [sys.executable, str(REPO_ROOT / "benchmarks" / "sweep_plans.py"), "--fake", "--quick",
           "--ops", "dplr_delta_rule", "--shapes", "1x32x1x32", "--stages", "fwd_intra", "--max-variants", "1",
           "--extra-variants", '{"fwd_intra": [{"block_v": 32}]}', "--budget-s", "200", "--out", str(out),
           "--workdir", str(tmp_path / "wd")]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    (variant,) = row["variants"]
    # fwd_intra takes no V tile: block_v changes nothing in its launch
    assert variant["status"] == "same_launch" and variant["launch"], variant


def _report(rows):
    return {"arch": "sm90", "dtype": "bfloat16", "versions": {"gpu": "NVIDIA H100 80GB HBM3"}, "workers": {},
            "rows": rows}


def _row(op, stage, best_cfg, default_ms, best_ms):
    best = {"variant": sweep_plans.vkey(best_cfg), "cfg": best_cfg, "status": "ok", "op_ms": best_ms + 1,
            "kernel_ms": best_ms}
    row = {"op": op, "shape": "4x4096x16x128", "stage": stage, "mode": sweep_plans.stage_mode(stage),
           "default": {"cfg": DEFAULT, "op_ms": default_ms + 1, "kernel_ms": default_ms}, "variants": [best]}
    sweep_plans._rank(row)
    return row


def test_proposals_are_tuned_entries():
    win = {**DEFAULT, "num_warps": 8}
    report = _report([_row("gla", "fwd_o", win, 0.5, 0.4), _row("gla", "bwd_dv", win, 0.5, 0.49),
                      _row("linear_attn", "fwd_o", win, 0.3, 0.2), _row("simple_gla", "fwd_o", DEFAULT | {
                          "num_stages": 3}, 0.3, 0.2)])
    text = sweep_plans.propose(report, 1.03, "sweep.json")
    live = [li.strip() for li in text.splitlines() if li.startswith("        (")]
    entries = eval("{" + "\n".join(live) + "}", {"Tuned": Tuned})  # noqa: S307 - our own output
    # bwd_dv (2%) is under the threshold; the scalar-gate pair disagrees and is commented out
    assert entries == {("chunk_channel_gate", "fwd_o", "bf16", 128): Tuned(64, 64, 8, 2, "sm90-channel-gate-fwd-o")}
    sources = eval("{" + "\n".join(li for li in text.splitlines() if li.startswith("    '")) + "}",  # noqa: S307
                   {"Source": Source})
    assert list(sources) == ["sm90-channel-gate-fwd-o"]
    assert sources["sm90-channel-gate-fwd-o"].archs == ("sm90",)
    assert "gla 4x4096x16x128: fwd_o kernel 0.5 -> 0.4 ms, fwd 1.5 -> 1.4 ms" in sources["sm90-channel-gate-fwd-o"].text
    assert "disagree" in text and "#         ('chunk_scalar_gate', 'fwd_o', 'bf16', 128)" in text
