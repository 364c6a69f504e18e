"""Misuse of the command line: each case ends in its documented exit status and one line on stderr, never a
traceback. Exit status (fla_gen.cli.EXIT_STATUS_DOC): 2 a spec has errors, 3 usage error."""

import subprocess
import sys
from pathlib import Path

import pytest

from fla_gen.cli import main
from tests.support import REPO_ROOT

GLA = str(REPO_ROOT / "specs" / "gla.fla")
DIVIDES = "op t\ninput q: [B, T, H, K]\ninput k: [B, T, H, K]\ninput v: [B, T, H, V]\nstate S: [K, V]\n" \
          "param scale = 1 / 0\nupdate S = S + outer(k, v)\noutput o = scale * S^T @ q\n"


@pytest.fixture
def files(tmp_path):
    """Paths the cases name: {tmp} the temp dir, {file} an existing file, {bad} a spec with an error."""
    (tmp_path / "file").write_text("not a directory\n")
    (tmp_path / "bad.fla").write_text(DIVIDES)
    return {"tmp": str(tmp_path), "file": str(tmp_path / "file"), "bad": str(tmp_path / "bad.fla"), "gla": GLA}


CASES = [
    # (id, argv, exit status, words in the message)
    ("no command", [], 3, "name a command"),
    ("unknown command", ["compile", "{gla}"], 3, "invalid choice"),
    ("unknown option", ["build", "--bogus", "{gla}"], 3, "unrecognized arguments: --bogus"),
    ("build without specs", ["build", "-o", "{tmp}/out"], 3, "name one or more spec files"),
    ("build a missing spec", ["build", "{tmp}/nope.fla", "-o", "{tmp}/out"], 3, "no such spec file"),
    ("build a directory", ["build", "{tmp}", "-o", "{tmp}/out"], 3, "is a directory"),
    ("build a device", ["build", "/dev/zero", "-o", "{tmp}/out"], 3, "is not a regular file"),
    ("build -o a file", ["build", "{gla}", "-o", "{file}"], 3, "is not a directory"),
    ("build -o below a file", ["build", "{gla}", "-o", "{file}/sub"], 3, "cannot write"),
    ("build -o without a value", ["build", "{gla}", "-o"], 3, "expected one argument"),
    ("build a bad spec", ["build", "{bad}", "-o", "{tmp}/out"], 2, "divides by zero"),
    ("plan a missing spec", ["plan", "{tmp}/nope.fla"], 3, "no such spec file"),
    ("plan a directory", ["plan", "{tmp}"], 3, "is a directory"),
    ("plan a bad spec", ["plan", "{bad}"], 2, "divides by zero"),
    ("plan two specs", ["plan", "{gla}", "{gla}"], 3, "unrecognized arguments"),
    ("plan an unknown arch", ["plan", "{gla}", "--arch", "sm70"], 3, "invalid choice: 'sm70'"),
    ("plan an unknown dtype", ["plan", "{gla}", "--dtype", "fp64"], 3, "invalid choice: 'fp64'"),
    ("plan head dim zero", ["plan", "{gla}", "--head-dim", "0"], 3, "not a positive integer"),
    ("plan head dim negative", ["plan", "{gla}", "--head-dim", "-8"], 3, "not a positive integer"),
    ("plan head dim not a number", ["plan", "{gla}", "--head-dim", "inf"], 3, "not an integer"),
    ("plan head dim too large", ["plan", "{gla}", "--head-dim", "1000"], 3, "outside 1..256"),
    ("run a missing spec", ["run", "{tmp}/nope.fla", "-o", "{tmp}/out"], 3, "no such spec file"),
    ("run a directory", ["run", "{tmp}", "-o", "{tmp}/out"], 3, "is a directory"),
    ("run a bad spec", ["run", "{bad}", "-o", "{tmp}/out"], 2, "divides by zero"),
    ("run size zero", ["run", "{gla}", "--shape", "0", "8", "1", "16", "16"], 3, "not a positive integer"),
    ("run size negative", ["run", "{gla}", "--shape", "1", "-8", "1", "16", "16"], 3, "not a positive integer"),
    ("run size infinite", ["run", "{gla}", "--shape", "1", "inf", "1", "16", "16"], 3, "not an integer"),
    ("run size nan", ["run", "{gla}", "--shape", "1", "8", "nan", "16", "16"], 3, "not an integer"),
    ("run three sizes", ["run", "{gla}", "--shape", "1", "8", "1"], 3, "expected 5 arguments"),
    ("run an unknown dtype", ["run", "{gla}", "--dtype", "fp8"], 3, "invalid choice"),
    ("run -o a file", ["run", "{gla}", "-o", "{file}"], 3, "is not a directory"),
]


@pytest.mark.parametrize("argv, status, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_misuse_is_one_line_and_a_status(files, capsys, argv, status, words):
    code = main([a.format(**files) for a in argv])
    captured = capsys.readouterr()
    assert code == status, captured.err
    assert "Traceback" not in captured.err + captured.out
    assert words in captured.err, captured.err
    if status == 3:
        assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_spec_errors_and_usage_errors_in_one_build(files, capsys):
    """A build goes on past a bad spec and exits with the most severe status."""
    code = main(["build", files["bad"], files["gla"], f"{files['tmp']}/nope.fla", "-o", f"{files['tmp']}/out"])
    captured = capsys.readouterr()
    assert code == 3
    assert "divides by zero" in captured.err and "no such spec file" in captured.err
    assert (REPO_ROOT / "specs" / "gla.fla").is_file()
    assert sorted(p.name for p in (REPO_ROOT / "generated" / "gla").glob("*.py")) == \
        sorted(p.name for p in (Path(files["tmp"]) / "out" / "gla").glob("*.py"))


@pytest.mark.parametrize("argv, status, words", [
    (["aot", "--arch", "smXY", GLA], 3, "expected e.g. --arch sm80,sm90"),
    (["aot"], 3, "name one or more spec files"),
    (["aot", "--arch", "sm80", "--override", "x", GLA], 3, "--override 'x' is not JSON"),
    (["aot", "--arch", "sm80", "--override", '{{"fwd_A": {{"warps": 2}}}}', GLA], 3, "unknown field 'warps'"),
    (["aot", "--arch", "sm80", "--override", '{{"fwd_slove": {{"num_warps": 2}}}}', GLA], 3,
     "names kernel(s) ['fwd_slove'] that no plan of this op has"),
    (["build", "{tmp}/nope.fla"], 3, "no such spec file"),
    (["plan", "{tmp}"], 3, "is a directory"),
    (["build", GLA, "-o", "{file}"], 3, "is not a directory"),
])
def test_misuse_in_a_subprocess(files, argv, status, words):
    """The console entry point's status (aot runs here only: it changes TRITON_INTERPRET in its process)."""
    proc = subprocess.run([sys.executable, "-m", "fla_gen.cli", *[a.format(**files) for a in argv]],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and words in proc.stderr, proc.stderr


def test_an_internal_error_is_one_line_unless_debugging(files, capsys, monkeypatch):
    def broken(path):
        raise RuntimeError("a bug\nwith a second line")

    monkeypatch.setattr("fla_gen.cli.compile_spec", broken)
    assert main(["build", GLA, "-o", f"{files['tmp']}/out"]) == 4
    err = capsys.readouterr().err
    assert err.strip() == "fla-gen build: internal error: RuntimeError: a bug (FLA_GEN_DEBUG=1 shows the traceback)"
    monkeypatch.setenv("FLA_GEN_DEBUG", "1")
    with pytest.raises(RuntimeError):
        main(["build", GLA, "-o", f"{files['tmp']}/out"])


def test_the_cli_choices_are_the_planners():
    from fla_gen.cli import ARCH_CHOICES, DTYPE_CHOICES
    from fla_gen.plan import ARCHS, DTYPES

    assert ARCH_CHOICES == tuple(ARCHS) and DTYPE_CHOICES == tuple(DTYPES)
