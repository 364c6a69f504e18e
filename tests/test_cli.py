"""The command line and the golden check: generated/ matches the specs, byte for byte."""

import subprocess
import sys

import pytest

from fla_gen.cli import main
from fla_gen.lower import lower
from fla_gen.transforms import plan_transforms
from tests.support import REPO_ROOT, SPECS, recurrence


def fla_gen(*args, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, "-m", "fla_gen.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def test_committed_generated_code_matches_specs():
    proc = fla_gen("build", "--all", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_is_deterministic(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert main(["build", "--all", "-o", str(out)]) == 0
    files = sorted(p.relative_to(first) for p in first.rglob("*.py"))
    # Five modules per spec, a sixth (transforms.py) for a spec with transforms or slots the lowering derives,
    # and generated/__init__.py.
    with_transforms = sum(plan_transforms(lower(recurrence(s.stem))) is not None for s in SPECS)
    assert len(files) == 1 + 5 * len(SPECS) + with_transforms
    for f in files:
        assert (first / f).read_bytes() == (second / f).read_bytes(), f
        assert (first / f).read_bytes() == (REPO_ROOT / "generated" / f).read_bytes(), f


def test_changing_a_spec_changes_the_output(tmp_path):
    spec = tmp_path / "specs" / "gla.fla"
    spec.parent.mkdir()
    text = (REPO_ROOT / "specs" / "gla.fla").read_text()
    spec.write_text(text)
    out = tmp_path / "out"
    assert main(["build", str(spec), "-o", str(out)]) == 0
    assert main(["build", str(spec), "-o", str(out), "--check"]) == 0
    spec.write_text(text.replace("param scale = K ** -0.5", "param scale = K ** -1"))
    assert main(["build", str(spec), "-o", str(out), "--check"]) == 1
    assert main(["build", str(spec), "-o", str(out)]) == 0
    assert "K ** -1" in (out / "gla" / "chunk.py").read_text()


def test_check_reports_a_diff(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["build", str(SPECS[0]), "-o", str(out)]) == 0
    target = out / SPECS[0].stem / "reference.py"
    target.write_text(target.read_text() + "# edited by hand\n")
    assert main(["build", str(SPECS[0]), "-o", str(out), "--check"]) == 1
    assert "-# edited by hand" in capsys.readouterr().out


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
    assert "chunk size 64" in out and "227 KB" in out
    assert all("#" in line for line in out.splitlines() if "warps=" in line)


def test_plan_rejects_unknown_arch():
    proc = fla_gen("plan", "specs/gla.fla", "--arch", "sm70")
    assert proc.returncode != 0 and "invalid choice" in proc.stderr
