"""A non-editable install works: the wheel carries the grammar and the templates (fla_gen/_data/), and
``fla-gen build`` from another directory finds them and writes ./generated."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO_ROOT

SOURCES = ("fla_gen", "generated", "grammars", "templates", "setup.py", "pyproject.toml", "README.md")


def run(cmd, cwd, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=300, env=env,
                          **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (so the build leaves nothing in the checkout)."""
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO_ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    proc = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, src],
               cwd=src)
    assert proc.returncode == 0, proc.stderr
    (whl,) = out.glob("fla_gen-*.whl")
    return whl


def test_the_wheel_carries_the_grammar_and_every_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "fla_gen/_data/grammars/fla.lark" in names
    templates = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "templates").rglob("*.jinja")}
    assert templates and {f"fla_gen/_data/{t}" for t in templates} <= names
    assert "fla_gen/cli.py" in names and "fla_gen/runtime/validate.py" in names


def test_an_installed_copy_builds_from_another_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", "--system-site-packages", venv], cwd=tmp_path).returncode == 0
    python = venv / "bin" / "python"
    proc = run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(REPO_ROOT / "specs" / "gla.fla", work / "gla.fla")
    where = run([python, "-c", "import fla_gen.resources as r; print(r.data_dir('templates'))"], cwd=work)
    assert where.stdout.strip().startswith(str(venv)), where.stdout + where.stderr
    proc = run([python, "-m", "fla_gen.cli", "build", "gla.fla"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "wrote generated/gla" in proc.stdout, proc.stdout
    for module in ("chunk.py", "reference.py"):
        assert (work / "generated" / "gla" / module).read_bytes() == \
            (REPO_ROOT / "generated" / "gla" / module).read_bytes().replace(b"specs/gla.fla", b"gla.fla")
    proc = run([python, "-m", "fla_gen.cli", "build", "--all"], cwd=work)
    assert proc.returncode == 3 and "source checkout" in proc.stderr and "Traceback" not in proc.stderr
