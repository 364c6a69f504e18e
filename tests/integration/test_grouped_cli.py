"""`fla-gen run --value-heads`: a grouped spec runs with HV value heads; a bad HV is a usage error."""

from __future__ import annotations

import pytest

from fla_gen.cli import EXIT_OK, EXIT_USAGE, main
from tests.support import REPO_ROOT


@pytest.mark.parametrize(("spec", "value_heads", "words"), [
    ("linear_attn", "4", "the spec declares no input on HV"),
    ("gated_delta_rule", "3", "not a positive multiple of H = 2"),
])
def test_bad_value_heads_are_refused_before_anything_is_written(spec, value_heads, words, tmp_path, capsys):
    argv = ["run", str(REPO_ROOT / "specs" / f"{spec}.fla"), "--shape", "1", "8", "2", "16", "16",
            "--value-heads", value_heads, "-o", str(tmp_path)]
    assert main(argv) == EXIT_USAGE
    assert words in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_run_a_grouped_spec(tmp_path, capsys):
    argv = ["run", str(REPO_ROOT / "specs" / "gated_delta_rule.fla"), "--shape", "1", "12", "1", "16", "16",
            "--value-heads", "2", "-o", str(tmp_path), "--cpu"]
    assert main(argv) == EXIT_OK
    out = capsys.readouterr().out
    assert "HV=2" in out and out.count(" ok") == 4, out
