"""benchmarks/scoreboard.py: row choice and ratios on synthetic result files, and a run on the saved results."""

import json
import sys

import pytest

from tests.support import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import _ops  # noqa: E402
import scoreboard  # noqa: E402

OPS = list(_ops.OPS)
SHAPES = [_ops.shape_str(s) for s in _ops.parse_shapes("issue7")]
OP_A, OP_B, OP_C = OPS[:3]
SHAPE, SHAPE_TIE, SHAPE_NONE = SHAPES[0], SHAPES[1], SHAPES[3]
BWD_ERROR = ("RuntimeError: Triton refuses the gated backward on this GPU (see #1). "
             "Please upgrade Triton to a much newer release or install something else")


def lib(fwd=None, fwdbwd=None, peak=None, **extra) -> dict:
    """One library's result as bench_ops.py's worker writes it."""
    res: dict = {"errors": {}, **extra}
    for key, v in (("fwd_ms", fwd), ("fwdbwd_ms", fwdbwd), ("peak_mb", peak)):
        if v is not None:
            res[key] = v
    return res


def row(op: str, shape: str, **fields) -> dict:
    return {"op": op, "shape": shape, "mode": "chunk", **fields}


def report(date: str, rows: list, **top) -> dict:
    return {"command": "python3 benchmarks/bench_ops.py", "date": date, "seed": 1, "device": "cuda",
            "fake": False, "quick": False, "versions": {}, "baseline": {}, "rows": rows, "notes": [], **top}


# the inputs the checks below compute their expectations from
OLD_A = {"ours": lib(1.0, 3.0, 100.0, first_fwd_s=2.0, first_bwd_s=3.5), "fla": lib(1.5, 4.5, 120.0)}
OLD_B = {"ours": lib(2.0, 5.0, 200.0), "fla": lib(2.5, 6.0, 210.0)}
NEW_A = {"ours": lib(0.8, 2.4, 90.0), "fla": lib(1.2, errors={"fwd_bwd": BWD_ERROR})}
NEW_B = {"ours": lib(1.6, 4.0, 190.0)}  # fla absent from this run
LATEST_C = {"ours": lib(3.0, 9.0, 300.0), "fla": {"skipped": "budget"}}
TIE_A = {"ours": lib(1.0, 2.0, 10.0), "fla": lib(1.1, 2.2, 11.0)}
TIE_B = {"ours": lib(0.9, 1.9, 10.0), "fla": lib(1.3, 2.7, 11.0)}


@pytest.fixture
def results(tmp_path):
    files = {
        "old.json": report("2026-01-01 10:00:00 UTC", [row(OP_A, SHAPE, floor_fwd_ms=0.25, **OLD_A),
                                                       row(OP_B, SHAPE, **OLD_B)]),
        # a later date than old.json but a name that sorts before it: the date decides
        "a_new.json": report("2026-01-02 09:00:00 UTC", [row(OP_A, SHAPE, floor_fwd_ms=0.2, **NEW_A),
                                                         row(OP_B, SHAPE, **NEW_B)]),
        "c.json": report("2026-01-03 09:00:00 UTC", [row(OP_C, SHAPE, **LATEST_C)], quick=True),
        # same date: the file name decides
        "tie_a.json": report("2026-01-04 09:00:00 UTC", [row(OP_A, SHAPE_TIE, **TIE_A)]),
        "tie_b.json": report("2026-01-04 09:00:00 UTC", [row(OP_A, SHAPE_TIE, **TIE_B)]),
        # latest of all, but not real-device bench_ops.py results
        "zz_fake.json": report("2026-02-01 00:00:00 UTC", [row(OP_A, SHAPE, **TIE_A)], fake=True),
        "zz_cpu.json": report("2026-02-01 00:00:00 UTC", [row(OP_A, SHAPE, **TIE_A)], device="cpu"),
        "zz_check.json": report("2026-02-01 00:00:00 UTC", [{"op": OP_A, "mode": "chunk", "case": "fwd",
                                                             "err": 1e-3, "status": "ok"}]),
        "zz_sweep.json": report("2026-02-01 00:00:00 UTC", [row(OP_A, SHAPE, best=0.1, default=0.2)]),
        "zz_list.json": [1, 2, 3],
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    (tmp_path / "zz_broken.json").write_text("{not json")
    (tmp_path / "zz_profile.txt").write_text("not JSON at all")
    return tmp_path


def board(results, capsys) -> dict:
    assert scoreboard.main(["--results", str(results), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def entry(entries: list, op: str, shape: str) -> dict:
    return next(e for e in entries if (e["op"], e["shape"]) == (op, shape))


def test_only_real_bench_reports_are_read_in_date_then_name_order(results, capsys):
    assert board(results, capsys)["files_read"] == ["old.json", "a_new.json", "c.json", "tie_a.json", "tie_b.json"]


def test_latest_same_run_pair_and_its_ratios(results, capsys):
    b = board(results, capsys)
    a = entry(b["targets"], OP_A, SHAPE)
    assert (a["status"], a["file"]) == ("same-run", "a_new.json")
    assert a["ours"]["fwd_ms"] == NEW_A["ours"]["fwd_ms"] and a["fla"]["fwd_ms"] == NEW_A["fla"]["fwd_ms"]
    assert a["ratio_fwd"] == round(NEW_A["fla"]["fwd_ms"] / NEW_A["ours"]["fwd_ms"], 3)
    assert a["ratio_fwdbwd"] is None and a["fla"]["fwdbwd_why"] == BWD_ERROR
    assert a["ours"]["peak_mb"] == NEW_A["ours"]["peak_mb"] and a["later_ours"] is None

    # OP_B's newest run has no fla: the pair comes from the older file, the newer ours time is noted
    b_ = entry(b["targets"], OP_B, SHAPE)
    assert (b_["status"], b_["file"]) == ("same-run", "old.json")
    assert b_["ratio_fwd"] == round(OLD_B["fla"]["fwd_ms"] / OLD_B["ours"]["fwd_ms"], 3)
    assert b_["ratio_fwdbwd"] == round(OLD_B["fla"]["fwdbwd_ms"] / OLD_B["ours"]["fwdbwd_ms"], 3)
    assert b_["later_ours"]["fwd_ms"] == NEW_B["ours"]["fwd_ms"] and b_["later_ours"]["file"] == "a_new.json"

    tie = entry(b["targets"], OP_A, SHAPE_TIE)
    assert tie["file"] == "tie_b.json"
    assert tie["ratio_fwd"] == round(TIE_B["fla"]["fwd_ms"] / TIE_B["ours"]["fwd_ms"], 3)


def test_ours_only_fallback_and_no_data(results, capsys):
    b = board(results, capsys)
    c = entry(b["targets"], OP_C, SHAPE)
    assert (c["status"], c["file"], c["settings"]) == ("ours-only", "c.json", ["quick"])
    assert c["ours"]["fwd_ms"] == LATEST_C["ours"]["fwd_ms"] and c["ratio_fwd"] is None
    assert "budget" in c["fla"]["fwd_why"]
    assert entry(b["targets"], OP_A, SHAPE_NONE)["status"] == "no data"
    assert {e["op"] for e in b["targets"]} == set(OPS) and {e["shape"] for e in b["targets"]} == set(SHAPES)


def test_floor_ratio_and_first_call(results, capsys):
    b = board(results, capsys)
    a = entry(b["floors"], OP_A, SHAPE)
    assert a["floor"]["file"] == "a_new.json"
    assert a["floor"]["ours_over_floor"] == round(NEW_A["ours"]["fwd_ms"] / 0.2, 2)
    assert a["first_call"]["file"] == "old.json" and not a["first_call"]["fwd_only"]
    assert a["first_call"]["s"] == pytest.approx(OLD_A["ours"]["first_fwd_s"] + OLD_A["ours"]["first_bwd_s"])
    assert a["warm_call"] is None and entry(b["floors"], OP_B, SHAPE)["floor"] is None


def test_markdown_cells(results, capsys):
    assert scoreboard.main(["--results", str(results), "--ops", f"{OP_A},{OP_C}", "--shapes", SHAPE]) == 0
    out = capsys.readouterr().out
    line_a = next(li for li in out.splitlines() if li.startswith(f"| {OP_A} | {SHAPE} |"))
    cells = [c.strip() for c in line_a.strip("|").split("|")]
    ours, fla = NEW_A["ours"], NEW_A["fla"]
    assert cells[2:5] == [f"{ours['fwd_ms']:.3f}", f"{fla['fwd_ms']:.3f}", f"{fla['fwd_ms'] / ours['fwd_ms']:.2f}"]
    assert cells[6].startswith("fla: RuntimeError: Triton refuses") and cells[6].endswith("…")
    assert len(cells[6]) < len(BWD_ERROR) and cells[-1] == "a_new.json"
    line_c = next(li for li in out.splitlines() if li.startswith(f"| {OP_C} | {SHAPE} |"))
    assert line_c.count(scoreboard.NO_PAIR) == 2 and "budget" in line_c and "c.json [quick]" in line_c
    assert OP_B not in out


def test_help_explains_same_run_and_ratio(capsys):
    with pytest.raises(SystemExit):
        scoreboard.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "same run" in text and "one result file" in text and "> 1 means ours is faster" in text


def test_saved_results_render_every_op(capsys):
    results = REPO_ROOT / "benchmarks" / "results"
    assert scoreboard.main(["--results", str(results)]) == 0
    out = capsys.readouterr().out
    for op in OPS:
        assert f"| {op} |" in out
    assert scoreboard.main(["--results", str(results), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["files_read"]
