#!/usr/bin/env python3
"""Issue-7 scoreboard: the latest ours-vs-fla numbers per op and shape, from saved bench_ops.py results.

    python benchmarks/scoreboard.py [--results benchmarks/results] [--ops gla,rwkv7] [--shapes issue7]
                                    [--mode chunk] [--format md|json]

Reads every ``*.json`` in --results and keeps the bench_ops.py reports: a dict whose ``rows`` hold
op / shape / mode with an ``ours`` or ``fla`` result. Everything else is skipped without a word:
gpu_check, sweep, profile and other result files, unreadable JSON, ``"fake": true`` runs, CPU runs.
Reports are ordered by their ``date``, then by file name; "latest" means last in that order.

Table 1, per op (of ``_ops.OPS``) and shape: the latest row in which ours and fla both have a
forward time measured in the same run (the same result file: one bench_ops.py invocation, so the same
inputs, seed, GPU session and library versions). Ratios are fla ms / ours ms: above 1, ours is faster
(issue 7 asks >= 1). A missing number says why, in the JSON's own words (shortened). Where no run
measured both, the latest row with an ours forward is shown and its ratio cells say so. Runs with
non-default settings (quick, gate scale, gate lower bound, g_gamma, dtype) are named next to the file.
Where a run later than the chosen pair timed ours alone, the last such forward is shown too.

Table 2, per op and shape: ours' forward over the memory floor of the latest run that has one
(``floor_fwd_ms``: bytes in + out over the same run's copy bandwidth; issue 7 asks <= 3), and ours'
latest first-call seconds (first forward + first backward in a fresh process with an empty Triton
cache) and warm-cache first call, where measured.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import _ops  # noqa: E402
import bench_ops  # noqa: E402

DEFAULT_RESULTS = HERE / "results"
REASON_WIDTH = 56  # characters of an error text kept in a Markdown cell
NO_PAIR = "no same-run fla"
SAME_RUN_HELP = (
    "same run: ours and fla measured in one result file, i.e. one bench_ops.py invocation (same inputs, "
    "seed, GPU session and library versions); numbers from two files are never paired. "
    "Ratios are fla ms / ours ms: > 1 means ours is faster. Where no file holds both forwards, the "
    f"latest ours-only row is shown and its ratio cells read '{NO_PAIR}'."
)

Row = dict[str, Any]


@dataclass(frozen=True)
class Run:
    """One bench_ops.py report: its file name, date, non-default settings and result rows."""

    file: str
    date: str
    settings: tuple[str, ...]
    rows: tuple[Row, ...]

    @property
    def order(self) -> tuple[str, str]:
        """Sort key: the report's date (ISO form where it parses), then the file name."""
        return date_order(self.date), self.file


# ---------------------------------------------------------------------------------------------
# reading


def date_order(date: str) -> str:
    """A sortable form of bench_ops.py's ``%Y-%m-%d %H:%M:%S %Z`` date (the zone is ignored)."""
    try:
        return datetime.strptime(date[:19], "%Y-%m-%d %H:%M:%S").isoformat()
    except (TypeError, ValueError):
        return str(date or "")


def normal_shape(shape: str) -> str:
    """'4x4096x16x128x128' -> '4x4096x16x128' (_ops.shape_str form); unparsable text unchanged."""
    try:
        return _ops.shape_str(_ops.parse_shape(shape))
    except (ValueError, TypeError, AttributeError):
        return str(shape)


def is_bench_row(row: Any) -> bool:
    """True for a bench_ops.py row: op, shape and mode strings and an 'ours' or 'fla' result dict."""
    return (isinstance(row, dict) and all(isinstance(row.get(k), str) for k in ("op", "shape", "mode"))
            and any(isinstance(row.get(lib), dict) for lib in ("ours", "fla")))


def run_settings(report: dict) -> tuple[str, ...]:
    """The report's settings that differ from bench_ops.py's defaults, as short labels."""
    out = []
    if report.get("quick"):
        out.append("quick")
    if report.get("g_gamma"):
        out.append("g_gamma")
    scale = report.get("gate_scale")
    if isinstance(scale, (int, float)) and scale != 1:
        out.append(f"gate_scale={scale:g}")
    if report.get("dtype") not in (None, "bfloat16"):
        out.append(str(report["dtype"]))
    bound = report.get("gate_lower_bound")
    if bound is None:  # reports older than bench_ops.py's gate_lower_bound field: read the recorded command line
        m = re.search(r"--gate-lower-bound[ =](\S+)", str(report.get("command", "")))
        bound = m.group(1) if m else None
    if bound is not None:
        out.append(f"gate_lower_bound={bound}")
    return tuple(out)


def parse_run(file: str, data: Any) -> Run | None:
    """A Run from one JSON document, or None when it is not a real-device bench_ops.py report."""
    if not isinstance(data, dict) or data.get("fake") is True:
        return None
    if str(data.get("device", "")).lower().startswith("cpu"):
        return None
    rows = data.get("rows")
    if not isinstance(rows, list):
        return None
    kept = tuple({**r, "shape": normal_shape(r["shape"])} for r in rows if is_bench_row(r))
    if not kept:
        return None
    return Run(file=file, date=str(data.get("date") or ""), settings=run_settings(data), rows=kept)


def load_runs(results: Path) -> list[Run]:
    """Every bench_ops.py report in results (``*.json``), oldest first; other files are skipped."""
    runs = []
    for path in sorted(results.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        run = parse_run(path.name, data)
        if run is not None:
            runs.append(run)
    return sorted(runs, key=lambda r: r.order)


# ---------------------------------------------------------------------------------------------
# choosing


def measured(res: Any, key: str) -> float | None:
    """res[key] where res is a result dict and the value a finite number, else None."""
    if not isinstance(res, dict):
        return None
    v = res.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def why_missing(res: Any, phase: str) -> str:
    """Why a library's result has no number for phase 'fwd' or 'fwd_bwd', in the JSON's own words."""
    if not isinstance(res, dict):
        return "not in this run"
    if res.get("missing"):
        return f"missing: {res['missing']}"
    if error := bench_ops.phase_error(res, phase):
        return str(error)
    if res.get("ended"):
        return f"worker ended: {res['ended']}"
    if res.get("skipped"):
        return f"skipped ({res['skipped']})"
    return "not measured"


def lib_summary(res: Any) -> dict[str, Any]:
    """fwd_ms, fwdbwd_ms and peak_mb of one library's result, with the reason where a time is missing."""
    out: dict[str, Any] = {k: measured(res, k) for k in ("fwd_ms", "fwdbwd_ms", "peak_mb")}
    for key, phase in (("fwd_ms", "fwd"), ("fwdbwd_ms", "fwd_bwd")):
        if out[key] is None:
            out[key.replace("_ms", "_why")] = why_missing(res, phase)
    return out


def ratio(ours: float | None, fla: float | None) -> float | None:
    """fla / ours (> 1: ours is faster), None unless both are there."""
    return round(fla / ours, 3) if ours and fla else None


def history(runs: list[Run], op: str, shape: str, mode: str) -> list[tuple[Run, Row]]:
    """Every (run, row) for one op, shape and mode, oldest first."""
    return [(run, row) for run in runs for row in run.rows
            if (row["op"], row["shape"], row["mode"]) == (op, shape, mode)]


def latest(hist: list[tuple[Run, Row]], keep: Callable[[Row], Any]) -> tuple[Run, Row] | None:
    """The last (run, row) of hist for which keep(row) is true."""
    return next((item for item in reversed(hist) if keep(item[1])), None)


def has_pair(row: Row) -> bool:
    """Both ours and fla have a forward time in this row (so in the same run)."""
    return measured(row.get("ours"), "fwd_ms") is not None and measured(row.get("fla"), "fwd_ms") is not None


def has_ours(row: Row) -> bool:
    """Ours has a forward time in this row."""
    return measured(row.get("ours"), "fwd_ms") is not None


def target_entry(hist: list[tuple[Run, Row]], op: str, shape: str) -> dict[str, Any]:
    """Table 1's entry for one op and shape: the latest same-run pair, else the latest ours-only row."""
    entry: dict[str, Any] = {"op": op, "shape": shape}
    chosen = latest(hist, has_pair)
    status = "same-run"
    if chosen is None:
        chosen = latest(hist, has_ours) or latest(hist, lambda row: True)
        status = "ours-only" if chosen and has_ours(chosen[1]) else "no ours forward"
    if chosen is None:
        return {**entry, "status": "no data"}
    run, row = chosen
    ours, fla = lib_summary(row.get("ours")), lib_summary(row.get("fla"))
    entry.update(status=status, file=run.file, date=run.date, settings=list(run.settings), ours=ours, fla=fla,
                 ratio_fwd=ratio(ours["fwd_ms"], fla["fwd_ms"]) if status == "same-run" else None,
                 ratio_fwdbwd=ratio(ours["fwdbwd_ms"], fla["fwdbwd_ms"]) if status == "same-run" else None)
    later = latest([item for item in hist if item[0].order > run.order], has_ours)
    entry["later_ours"] = None if later is None or status != "same-run" else {
        "fwd_ms": measured(later[1]["ours"], "fwd_ms"), "fwdbwd_ms": measured(later[1]["ours"], "fwdbwd_ms"),
        "file": later[0].file, "date": later[0].date, "settings": list(later[0].settings)}
    return entry


def first_call_s(res: Any, prefix: str = "") -> float | None:
    """First forward + first backward seconds (the forward alone where no backward was timed)."""
    fwd = measured(res, prefix + "first_fwd_s")
    return None if fwd is None else round(fwd + (measured(res, prefix + "first_bwd_s") or 0.0), 3)


def floor_entry(hist: list[tuple[Run, Row]], op: str, shape: str) -> dict[str, Any]:
    """Table 2's entry: latest ours forward over the memory floor, latest ours first and warm first calls."""
    entry: dict[str, Any] = {"op": op, "shape": shape, "floor": None, "first_call": None, "warm_call": None}
    got = latest(hist, lambda row: has_ours(row) and measured(row, "floor_fwd_ms"))
    if got:
        run, row = got
        fwd, floor = measured(row["ours"], "fwd_ms"), measured(row, "floor_fwd_ms")
        entry["floor"] = {"ours_over_floor": round(fwd / floor, 2), "floor_fwd_ms": floor, "ours_fwd_ms": fwd,
                          "file": run.file, "settings": list(run.settings)}
    for key, prefix in (("first_call", ""), ("warm_call", "warm_")):
        got = latest(hist, lambda row, p=prefix: first_call_s(row.get("ours"), p) is not None)
        if got:
            run, row = got
            ours = row["ours"]
            entry[key] = {"s": first_call_s(ours, prefix), "file": run.file, "settings": list(run.settings),
                          "fwd_only": measured(ours, prefix + "first_bwd_s") is None,
                          # reports before session 6 timed torch's own first-backward import (~3 s, any op)
                          # inside the call; later ones prime it first and report it apart
                          "torch_import_inside": prefix + "torch_autograd_init_s" not in ours}
    return entry


def scoreboard(runs: list[Run], ops: list[str], shapes: list[str], mode: str) -> dict[str, Any]:
    """Both tables as one JSON-ready dict."""
    targets, floors = [], []
    for op in ops:
        for shape in shapes:
            hist = history(runs, op, shape, mode)
            targets.append(target_entry(hist, op, shape))
            floors.append(floor_entry(hist, op, shape))
    return {"mode": mode, "files_read": [r.file for r in runs], "targets": targets, "floors": floors}


# ---------------------------------------------------------------------------------------------
# Markdown


def fmt(x: float | None, nd: int = 3) -> str:
    """A number with nd decimals, '-' for None."""
    return "-" if x is None else f"{x:.{nd}f}"


def shorten(text: str, width: int = REASON_WIDTH) -> str:
    """text on one line, cut to width characters with an ellipsis."""
    line = " ".join(str(text).split())
    return line if len(line) <= width else line[: width - 1].rstrip() + "…"


def md_cell(text: str) -> str:
    """text made safe inside a Markdown table cell."""
    return text.replace("|", "\\|").replace("`", "'")


def source(file: str, settings: list[str]) -> str:
    """A file name with the run's non-default settings in brackets."""
    return file + (f" [{', '.join(settings)}]" if settings else "")


def time_cell(lib: dict[str, Any], key: str, name: str) -> str:
    """A library's time, or why it has none."""
    if lib[key] is not None:
        return fmt(lib[key])
    return f"{name}: {shorten(lib[key.replace('_ms', '_why')])}"


def target_cells(e: dict[str, Any]) -> list[str]:
    """One Markdown row of table 1."""
    if e["status"] == "no data":
        return [e["op"], e["shape"], *["-"] * 8, "no run measured this op and shape"]
    ours, fla, paired = e["ours"], e["fla"], e["status"] == "same-run"
    later = e.get("later_ours")
    return [
        e["op"], e["shape"],
        time_cell(ours, "fwd_ms", "ours"), time_cell(fla, "fwd_ms", "fla"),
        fmt(e["ratio_fwd"], 2) if paired else NO_PAIR,
        time_cell(ours, "fwdbwd_ms", "ours"), time_cell(fla, "fwdbwd_ms", "fla"),
        fmt(e["ratio_fwdbwd"], 2) if paired else NO_PAIR,
        f"{fmt(ours['peak_mb'], 0)} / {fmt(fla['peak_mb'], 0)}",
        f"{fmt(later['fwd_ms'])} ({source(later['file'], later['settings'])})" if later else "-",
        source(e["file"], e["settings"]),
    ]


def floor_cells(e: dict[str, Any]) -> list[str]:
    """One Markdown row of table 2."""
    fl, first, warm = e["floor"], e["first_call"], e["warm_call"]

    def call(c: dict[str, Any] | None) -> list[str]:
        if not c:
            return ["-", "-"]
        note = " (fwd only)" if c["fwd_only"] else (" (incl. torch's import)" if c.get("torch_import_inside") else "")
        return [fmt(c["s"], 2) + note, source(c["file"], c["settings"])]

    return [e["op"], e["shape"],
            fmt(fl["ours_over_floor"], 2) if fl else "-", fmt(fl["floor_fwd_ms"], 4) if fl else "-",
            source(fl["file"], fl["settings"]) if fl else "-", *call(first), *call(warm)]


def md_table(header: list[str], body: list[list[str]], numeric: set[int]) -> list[str]:
    """Markdown table lines, the columns numbered in numeric right-aligned."""
    align = ["---:" if i in numeric else "---" for i in range(len(header))]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(md_cell(c) for c in row) + " |" for row in body]
    return lines


def render_markdown(board: dict[str, Any], results: str) -> str:
    """Both tables as Markdown."""
    mode = board["mode"]
    lines = [f"## Issue 7 scoreboard ({mode} mode): ours vs fla, latest same-run pair", "",
             f"{len(board['files_read'])} bench_ops.py reports read from {results}. {SAME_RUN_HELP} "
             "Times in ms (do_bench median), peak MB of one forward+backward.", ""]
    hdr = ["op", "shape", "fwd ours", "fwd fla", "fla/ours", "f+b ours", "f+b fla", "fla/ours",
           "peak MB ours / fla", "later ours-only fwd", "source"]
    lines += md_table(hdr, [target_cells(e) for e in board["targets"]], set(range(2, 9)))
    lines += ["", "## Memory floor and first call (ours)", "",
              "ours/floor: ours forward over bytes in + out at the same run's copy bandwidth (issue 7: <= 3). "
              "1st call: first forward + first backward in a fresh process, empty Triton cache; "
              "warm: the same on the Triton cache a measured run left (issue 7: < 2 s).", ""]
    hdr = ["op", "shape", "ours/floor", "floor fwd ms", "source", "1st call s", "source", "warm 1st s", "source"]
    lines += md_table(hdr, [floor_cells(e) for e in board["floors"]], {2, 3, 5, 7})
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=SAME_RUN_HELP)
    p.add_argument("--results", default=str(DEFAULT_RESULTS), metavar="DIR",
                   help="folder of result JSON files (default: benchmarks/results)")
    p.add_argument("--ops", default=",".join(_ops.OPS), help=f"comma-separated, from: {','.join(_ops.OPS)}")
    p.add_argument("--shapes", default="issue7",
                   help="comma-separated BxTxHxD or BxTxHxKxV, or a preset: "
                        + ", ".join(f"{k} = {','.join(v)}" for k, v in _ops.SHAPE_PRESETS.items()))
    p.add_argument("--mode", default="chunk", help="rows of this mode only (default chunk)")
    p.add_argument("--format", default="md", choices=["md", "json"], help="Markdown tables or JSON")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Print the scoreboard of --results."""
    args = parse_args(argv)
    ops = _ops.parse_ops(args.ops)
    shapes = [_ops.shape_str(s) for s in _ops.parse_shapes(args.shapes)]
    board = scoreboard(load_runs(Path(args.results)), ops, shapes, args.mode)
    print(json.dumps(board, indent=1) if args.format == "json" else render_markdown(board, args.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
