"""Measured plan choices (fla_gen/tuned.py), their sources (fla_gen/measurements.py) and the compact plan tables
of generated packages: every row cites known ids, a measurement only on the arch it was taken on."""

import pytest

from fla_gen import measurements, tuned
from fla_gen.cli import main
from fla_gen.emit import emit_package
from fla_gen.plan import ALGORITHMS, ARCHS, DTYPES, plan_algorithm, plan_table, select_algorithms
from fla_gen.runtime.plan_types import HEAD_DIM_BUCKETS, LaunchConfig
from fla_gen.tuned import FusedWalk, Tuned
from tests.support import REPO_ROOT, SPECS, recurrence


def _plans_text(rec) -> str:
    return next(f.text for f in emit_package(rec) if f.path.endswith("plans.py"))


def _plans_module(rec) -> dict:
    """The namespace of the emitted plans.py (executed, not imported: the test may patch the planner)."""
    ns: dict = {}
    exec(compile(_plans_text(rec), "plans.py", "exec"), ns)  # noqa: S102 - our own emitted file
    return ns


def _tables(rec) -> dict:
    ns = _plans_module(rec)
    return {name: ns[name] for name in ("CHUNK_PLANS", "RECURRENT_PLANS", "BOUNDED_CHUNK_PLANS") if name in ns}


def test_every_entry_names_a_known_target_and_a_measurement_of_that_target():
    for table in (tuned.TUNED, tuned.FUSED_WALK):
        for arch, entries in table.items():
            assert arch in ARCHS
            for key, e in entries.items():
                algorithm, stage_or_gated, *rest = key
                assert algorithm in ALGORITHMS, key
                if isinstance(e, Tuned):
                    dtype, head_dim = rest
                    assert stage_or_gated in [k.stage for k in ALGORITHMS[algorithm].kernels], key
                    assert dtype in DTYPES and head_dim in HEAD_DIM_BUCKETS, key
                else:
                    assert isinstance(e, FusedWalk) and rest[0] in HEAD_DIM_BUCKETS, key
                assert e.source in measurements.SOURCES, key
                assert measurements.SOURCES[e.source].archs == (arch,), key


def test_every_source_is_cited_and_unknown_ids_are_refused():
    from fla_gen.cli import load_recurrence

    variants = sorted((SPECS[0].parent.parent / "tests" / "variants").glob("*.fla"))
    recurrences = [recurrence(spec.stem) for spec in SPECS] + [load_recurrence(v) for v in variants]
    cited = {sid for rec in recurrences for t in _tables(rec).values() for p in t.values()
             for _, c in p.kernels for sid in c.source.split(",")}
    assert cited == set(measurements.SOURCES)
    with pytest.raises(KeyError, match="unknown plan source id 'nope'"):
        measurements.explain("tiles,nope")


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_rows_cite_known_ids_and_only_their_own_arch_measurements(spec):
    for name, table in _tables(recurrence(spec.stem)).items():
        for (arch, _, _), p in table.items():
            for stage, c in p.kernels:
                ids = c.source.split(",")
                assert ids and all(i in measurements.SOURCES for i in ids), (name, arch, stage, c.source)
                assert all(measurements.speaks_for(i, arch) for i in ids), (name, arch, stage, c.source)


def test_an_entry_changes_the_emitted_plan_and_its_source(monkeypatch, capsys):
    rec = recurrence("linear_attn")
    chunk = select_algorithms(rec)[0]
    monkeypatch.setitem(measurements.SOURCES, "test-sm80", measurements.Source("TEST-PROSE-7", ("sm80",)))
    before = plan_algorithm(rec, chunk, "sm80", "fp16", 64)
    monkeypatch.setattr(tuned, "TUNED", {"sm80": {(chunk.name, "fwd_o", "fp16", 64): Tuned(32, 32, 8, 1, "test-sm80")}})
    after = plan_algorithm(rec, chunk, "sm80", "fp16", 64)
    cfg = after.config("fwd_o")
    assert (cfg.block_k, cfg.block_v, cfg.num_warps, cfg.num_stages, cfg.source) == (32, 32, 8, 1, "test-sm80")
    assert before.config("fwd_o") != cfg
    assert [s for s, _ in after.kernels] == [s for s, _ in before.kernels]
    assert all(after.config(s) == before.config(s) for s, _ in before.kernels if s != "fwd_o")
    # only that target: bf16 and other buckets keep the rule
    assert plan_algorithm(rec, chunk, "sm80", "bf16", 64).config("fwd_o") == before.config("fwd_o")
    assert plan_algorithm(rec, chunk, "sm80", "fp16", 128).config("fwd_o").source != "test-sm80"

    tables = _tables(rec)
    assert tables["CHUNK_PLANS"][("sm80", "fp16", 64)] == after
    assert tables["CHUNK_PLANS"][("sm80", "bf16", 64)].config("fwd_o") == before.config("fwd_o")
    assert "TEST-PROSE-7" not in _plans_text(rec)  # the table holds the id, not the prose

    assert main(["plan", str(REPO_ROOT / "specs" / "linear_attn.fla"), "--arch", "sm80", "--dtype", "fp16",
                 "--head-dim", "64"]) == 0
    line = next(li for li in capsys.readouterr().out.splitlines() if li.strip().startswith("fwd_o"))
    assert "BK=32" in line and "warps=8" in line and "TEST-PROSE-7" in line


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.stem)
def test_compact_tables_hold_every_plan(spec):
    """The arch and fp16 aliases rebuild exactly the rows the planner made: same keys, same configs and ids."""
    rec = recurrence(spec.stem)
    ns = _plans_module(rec)
    for name, algo in zip(("CHUNK_PLANS", "RECURRENT_PLANS"), select_algorithms(rec), strict=True):
        expected = {(p.arch, p.dtype, p.head_dim): p for p in plan_table(rec, algo)}
        assert ns[name] == expected
        assert all(p.kernels == expected[k].kernels and p.arch == k[0] and p.dtype == k[1]
                   for k, p in ns[name].items())
        assert all(isinstance(c, LaunchConfig) and c.source for p in ns[name].values() for _, c in p.kernels)
    written = _plans_text(rec).count("): Plan(")
    assert written < sum(len(t) for t in _tables(rec).values()) / 2  # most rows are aliases


def test_generated_plan_tables_are_short():
    for path in sorted((REPO_ROOT / "generated").glob("*/plans.py")):
        lines = path.read_text().splitlines()
        assert max(len(li) for li in lines) <= 120, path
