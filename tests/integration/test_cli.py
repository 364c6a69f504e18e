"""The command line end to end: errors, help, the plan explanation (tests/golden: generated/ is up to date)."""

import subprocess
import sys

import pytest

from fla_gen.cli import main
from fla_gen.plan import ARCHS
from tests.support import REPO_ROOT


def fla_gen(*args, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, "-m", "fla_gen.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_spec_errors_exit_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.fla"
    bad.write_text("op bad\ninput q: [B, T, H, K]\nstate S: [K, V]\nupdate S = S + outer(q, q)\n")
    proc = fla_gen("build", str(bad), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "bad.fla:4:14: error:" in proc.stderr and "^" in proc.stderr


def test_missing_spec_file_is_a_clear_error(tmp_path):
    proc = fla_gen("build", str(tmp_path / "nope.fla"))
    assert proc.returncode == 3 and "no such spec file" in proc.stderr


@pytest.mark.parametrize("command", [[], ["build"], ["plan"], ["run"], ["aot"]])
def test_help_on_every_command(command):
    proc = fla_gen(*command, "--help")
    assert proc.returncode == 0 and "usage: fla-gen" in proc.stdout


def test_plan_explains_every_choice(capsys):
    assert main(["plan", str(REPO_ROOT / "specs" / "gla.fla"), "--arch", "sm90", "--dtype", "bf16",
                 "--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "chunk size 64" in out and f"{ARCHS['sm90'].smem_per_block // 1024} KB" in out
    kernel_lines = [line for line in out.splitlines() if "warps=" in line]
    assert kernel_lines and all("#" in line for line in kernel_lines), out


def test_plan_rejects_unknown_arch():
    proc = fla_gen("plan", "specs/gla.fla", "--arch", "sm70")
    assert proc.returncode != 0 and "invalid choice" in proc.stderr


@pytest.mark.parametrize(("spec", "call", "expected"), [
    # 16 walks of at most 4 programs (V / 32) are fewer than half the H100's 132 SMs: 2 x 132 (segment, head)
    # walks wanted over 256 chunks -> segments of 16 chunks, 16 of them
    # ... whose 256 (segment, head) walks make 512 programs at BV 64: the walk's two-per-SM launch
    ("simple_gla", "1x16384x16", ["split into segments of 16 chunks", "16 segments of 1024 tokens",
                                  "fwd_fused    taken, BV=64, 2 stages (two programs per SM): 512 programs"]),
    ("gla", "1x65536x16", ["split into segments of 64 chunks", "16 segments of 4096 tokens", "not taken"]),
    # 64 walks make 256 programs: no split
    ("linear_attn", "4x4096x16", ["not split: 64 (sequence, head) walks",
                                  "fwd_fused    taken, BV=64, 3 stages: 128 programs",
                                  "backward     three fwd_fused walks (no gate"]),
    # 2 walks of 2 chunks: too short to split, too few programs for the fused walk, forward or backward
    ("linear_attn", "1x128x2", ["not taken: fwd_h + fwd_o", "backward     fwd_h, bwd_dh and bwd_dqkvg"]),
    # the delta family's rule: at most one (segment, head) walk per SM, 8 segments of 32 chunks; the fused forward
    # walk then has programs enough
    ("gated_delta_rule", "1x16384x16", ["split into segments of 32 chunks", "8 segments of 2048 tokens",
                                        "fwd_fused    taken"]),
    # 1x8192: 8 segments would be too short
    ("gated_delta_rule", "1x8192x16", ["not split", "too short"]),
    # 64 walks: whole; the whole-K walk halves V only, while its programs fill at most half the SMs
    ("gated_delta_rule", "4x4096x16", ["not split: 64 (sequence, head) walks", "fwd_h        [128, 64] tiles",
                                       "256 programs; W and U from fwd_wu"]),
    # Qwen3-Next's grouped value heads: the walks run over the 32 value heads, and the walk reads the inverse
    ("gated_delta_rule", "4x4096x16x32", ["v [4, 4096, 32, 128]", "not split: 128 (sequence, head) walks",
                                          "512 programs; v_new from fwd_solve's inverse, no fwd_wu"]),
    # DPLR's rule: two (segment, head) walks per SM, 16 segments of 64 of its 16-token chunks; 64 walks: whole
    ("rwkv7", "1x16384x16", ["split into segments of 64 chunks", "16 segments of 1024 tokens"]),
    ("dplr", "4x4096x16", ["not split: 64 (sequence, head) walks"]),
    # packed batches (h200-walk-packed): 32 sequences whose work per SM at BV 64 (2 x 504 x 16 / 132 = 122 chunk
    # steps) is below the longest one's 256 chunks: the gated walk keeps the plan's launch ...
    ("simple_gla", "16384," + ",".join(["512"] * 31) + "x16",
     ["packed: 32 sequences of 512-16384 tokens (504 chunks, the longest 256)", "not split: 512 (sequence, head) walks",
      "fwd_fused    taken, BV=32, 3 stages: 2048 programs; at BV 64, 122 chunk steps per SM against the longest "
      "sequence's 256 chunks"]),
    # ... and takes two per SM where that work is the larger (2 x 64 x 4 x 16 / 132 = 62 against 4 chunks) ...
    ("simple_gla", ",".join(["256"] * 64) + "x16",
     ["fwd_fused    taken, BV=64, 2 stages (two programs per SM): 2048 programs; at BV 64, 62 chunk steps per SM"]),
    # ... which the ungated walk never does on a packed call
    ("linear_attn", ",".join(["256"] * 64) + "x16",
     ["fwd_fused    taken, BV=64, 3 stages: 2048 programs", "but this walk keeps one program per SM on packed calls"]),
    # 2 long sequences over 4 heads: 8 walks split into segments of 32 chunks, up to 2048 tokens each; 32 segments
    # per sequence are more than the ungated walk sums itself
    ("linear_attn", "65536,65536x4", ["packed: 2 sequences", "split into segments of 32 chunks",
                                      "64 segments of 2048 tokens at most",
                                      "after a segment_scan launch (a sequence of no segment, or of more than 16)"]),
    # 16 segments per sequence: the ungated walk sums the earlier ones itself, the gated one after a scan
    ("linear_attn", "1x16384x16", ["16 segments of 1024 tokens", "512 programs; each program sums its sequence's "
                                   "earlier segments itself (no segment_scan launch)"]),
])
def test_plan_call_prints_the_run_time_choices(capsys, spec, call, expected):
    assert main(["plan", str(REPO_ROOT / "specs" / f"{spec}.fla"), "--arch", "sm90", "--call", call]) == 0
    out = capsys.readouterr().out
    assert "on 132 SMs" in out
    for text in expected:
        assert text in out, (text, out[-1500:])


def test_plan_call_gated_backward_is_not_three_walks(capsys):
    """A gate keeps the chunk-state backward (fla_gen.plan.backward_walks_forward): no backward line."""
    assert main(["plan", str(REPO_ROOT / "specs" / "simple_gla.fla"), "--arch", "sm90", "--call", "4x4096x16"]) == 0
    out = capsys.readouterr().out
    assert "fwd_fused    taken" in out
    assert not any(line.startswith("  backward ") for line in out.splitlines()), out


def test_plan_call_gated_walk_keeps_the_scan_launch(capsys):
    """A gate keeps the segment_scan launch before the fused walk (fla_gen.plan.forward_walk_folds_scan)."""
    assert main(["plan", str(REPO_ROOT / "specs" / "simple_gla.fla"), "--arch", "sm90", "--call", "1x16384x16"]) == 0
    out = capsys.readouterr().out
    assert "fwd_fused    taken" in out and "segment_scan launch" not in out and "sums" not in out, out


@pytest.mark.parametrize("args", [["--sms", "132"], ["--call", "1x2"], ["--call", "0x16x2"], ["--call", "1x64x16x24"],
                                  ["--call", "300,0x16"], ["--call", "300,x"], ["--call", "300,400x16x4x2"]])
def test_plan_call_misuse_is_a_usage_error(args):
    proc = fla_gen("plan", "specs/gla.fla", *args)
    assert proc.returncode == 3 and "--call" in proc.stderr and "Traceback" not in proc.stderr
