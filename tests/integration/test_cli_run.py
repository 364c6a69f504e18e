"""``fla-gen run``: the calls it checks (both ops, dense and varlen, sizes the interpreter runs in about a
minute) and what it prints; the kernels themselves are stubbed here (tests/kernels runs them)."""

import torch

import fla_gen.verify as verify
from fla_gen.cli import main
from fla_gen.verify import CaseResult, check_cases
from tests.support import REPO_ROOT

GLA = str(REPO_ROOT / "specs" / "gla.fla")


def test_the_default_cases_run_every_kernel_at_small_sizes():
    for chunk_size in (16, 64):
        cases = check_cases(chunk_size)
        assert {(c.mode, c.cu_seqlens is None) for c in cases} == {
            ("chunk", True), ("chunk", False), ("fused_recurrent", True), ("fused_recurrent", False)}
        for c in cases:
            if c.mode == "chunk":  # a full chunk and a partial one
                assert chunk_size < c.T < 2 * chunk_size
            else:  # the interpreter pays per token and program
                assert c.T * c.B * c.H <= 48
            if c.cu_seqlens:
                cu = c.cu_seqlens
                lengths = [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]
                assert c.B == 1 and cu[0] == 0 and cu[-1] == c.T and 0 in lengths
            assert c.K != c.V  # a transposed state would not go unnoticed
    assert all(c.T >= 32 for c in check_cases(64, long=True))
    assert {(c.B, c.T, c.H, c.K, c.V) for c in check_cases(16, shape=(3, 20, 2, 8, 24)) if not c.cu_seqlens} == {
        (3, 20, 2, 8, 24)}


def test_run_prints_a_line_per_stage_and_fails_over_tolerance(tmp_path, monkeypatch, capsys):
    def fake_checks(pkg, rec, dtype, *, device, shape, long, value_heads=None):
        assert hasattr(pkg, "chunk_gla") and device == "cpu" and not long and value_heads is None
        yield CaseResult("chunk B=2 T=97", torch.float32, {"o": 1e-7, "final_state": 1e-7, "dq": 1e-7}, 1.0)
        yield CaseResult("fused_recurrent B=2 T=12", torch.float32, {"o": 1e-2, "final_state": 1e-7}, 1.0)

    monkeypatch.setattr(verify, "run_checks", fake_checks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["run", GLA, "-o", str(tmp_path / "out")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(f"built {tmp_path / 'out' / 'gla'}") and lines[0].startswith("[")
    assert "imported torch" in lines[1]
    assert lines[-2].rstrip().endswith("ok") and "FAIL {'o': 0.01}" in lines[-1]


def test_run_prints_its_seed_and_repeats_a_draw_with_it(tmp_path, monkeypatch, capsys):
    draws = []

    def fake_checks(pkg, rec, dtype, *, device, shape, long, value_heads=None):
        draws.append(torch.rand(3))  # the inputs come from the global generator, as verify_op's do
        yield CaseResult("chunk B=2 T=97", torch.float32, {"o": 1e-7, "final_state": 1e-7}, 1.0)

    monkeypatch.setattr(verify, "run_checks", fake_checks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "out"
    assert main(["run", GLA, "-o", str(out)]) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if "random inputs of seed" in ln)
    seed = int(header.split("random inputs of seed ")[1].split()[0])
    assert f"(--seed {seed} repeats them)" in header
    assert main(["run", GLA, "-o", str(out), "--seed", str(seed)]) == 0
    assert main(["run", GLA, "-o", str(out), "--seed", str(seed + 1)]) == 0
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
