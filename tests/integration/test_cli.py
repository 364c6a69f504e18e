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
    assert all("#" in line for line in out.splitlines() if "warps=" in line)


def test_plan_rejects_unknown_arch():
    proc = fla_gen("plan", "specs/gla.fla", "--arch", "sm70")
    assert proc.returncode != 0 and "invalid choice" in proc.stderr
