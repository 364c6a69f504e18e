"""Measured plan choices (fla_gen/tuned.py) and the compact plan tables of generated packages."""

import pytest

from fla_gen import tuned
from fla_gen.cli import main
from fla_gen.emit import emit_package
from fla_gen.plan import ALGORITHMS, ARCHS, DTYPES, plan_algorithm, plan_table, select_algorithms
from fla_gen.runtime.plan_types import HEAD_DIM_BUCKETS, LaunchConfig
from fla_gen.tuned import TunedPlan
from tests.support import REPO_ROOT, SPECS, recurrence


def _plans_text(rec) -> str:
    return next(f.text for f in emit_package(rec) if f.path.endswith("plans.py"))


def _plans_module(rec) -> dict:
    """The namespace of the emitted plans.py (executed, not imported: the test may patch the planner)."""
    text = _plans_text(rec)
    ns: dict = {}
    exec(compile(text, "plans.py", "exec"), ns)  # noqa: S102 - our own emitted file
    return ns


def test_every_entry_names_a_known_target():
    for e in tuned.TUNED:
        algo = ALGORITHMS[e.algorithm]
        assert e.arch in ARCHS and e.dtype in DTYPES and e.head_dim in HEAD_DIM_BUCKETS, e.key
        assert e.stage in [k.stage for k in algo.kernels], e.key
        assert "measured on" in e.reason and "ms" in e.reason, e.key
    tuned.index()  # no two entries for one key


def test_two_entries_for_one_key_are_refused():
    e = TunedPlan("sm90", "chunk_scalar_gate", "fwd_o", "bf16", 128, 64, 64, 8, 2, "measured on x: 1 ms vs 2 ms")
    with pytest.raises(ValueError, match="two tuned plans"):
        tuned.index((e, e))


def test_an_entry_changes_the_emitted_plan_and_its_reason(monkeypatch, capsys):
    rec = recurrence("linear_attn")
    chunk = select_algorithms(rec)[0]
    entry = TunedPlan("sm80", chunk.name, "fwd_o", "fp16", 64, 32, 32, 8, 1,
                      "measured on H100 2099-01-01: 0.5 ms vs 0.6 ms (test entry)")
    before = plan_algorithm(rec, chunk, "sm80", "fp16", 64)
    monkeypatch.setattr(tuned, "TUNED", (entry,))
    after = plan_algorithm(rec, chunk, "sm80", "fp16", 64)
    cfg = after.config("fwd_o")
    assert (cfg.block_k, cfg.block_v, cfg.num_warps, cfg.num_stages) == (32, 32, 8, 1)
    assert before.config("fwd_o") != cfg and "(test entry)" in cfg.reason
    assert [s for s, _ in after.kernels] == [s for s, _ in before.kernels]
    assert all(after.config(s) == before.config(s) for s, _ in before.kernels if s != "fwd_o")
    # only that target: bf16 and other buckets keep the rule
    assert plan_algorithm(rec, chunk, "sm80", "bf16", 64).config("fwd_o") == before.config("fwd_o")
    assert "(test entry)" not in plan_algorithm(rec, chunk, "sm80", "fp16", 128).config("fwd_o").reason

    ns = _plans_module(rec)
    assert ns["CHUNK_PLANS"][("sm80", "fp16", 64)] == after
    assert ns["CHUNK_PLANS"][("sm80", "bf16", 64)].config("fwd_o") == before.config("fwd_o")

    assert main(["plan", str(REPO_ROOT / "specs" / "linear_attn.fla"), "--arch", "sm80", "--dtype", "fp16",
                 "--head-dim", "64"]) == 0
    out = capsys.readouterr().out
    line = next(li for li in out.splitlines() if li.strip().startswith("fwd_o"))
    assert "BK=32" in line and "warps=8" in line and "tuned (fla_gen/tuned.py): measured on H100 2099-01-01" in line


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_compact_tables_hold_every_plan(spec):
    """The fp16 aliases rebuild exactly the rows the planner made: same keys, same plans."""
    rec = recurrence(spec.stem)
    ns = _plans_module(rec)
    for name, algo in zip(("CHUNK_PLANS", "RECURRENT_PLANS"), select_algorithms(rec), strict=True):
        expected = {(p.arch, p.dtype, p.head_dim): p for p in plan_table(rec, algo)}
        assert ns[name] == expected
        assert all(isinstance(c, LaunchConfig) for p in ns[name].values() for _, c in p.kernels)
    written = _plans_text(rec).count("): Plan(")
    assert written < len(ns["CHUNK_PLANS"]) + len(ns["RECURRENT_PLANS"])  # the fp16 rows are aliases
