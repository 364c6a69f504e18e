"""benchmarks/kernel_limits.py: Nsight Compute's raw CSV into per-kernel rows, verdicts and the call's sum
against the floor. The GPU run itself needs ncu; these tests feed it a CSV shaped like ncu's."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import kernel_limits  # noqa: E402

HEADER = ["ID", "Kernel Name", "Grid Size", "Block Size", "dram__bytes_read.sum", "dram__bytes_write.sum",
          "gpu__time_duration.sum", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__throughput.avg.pct_of_peak_sustained_elapsed",
          "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
          "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
          "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
          "launch__occupancy_limit_blocks"]
UNITS = ["", "", "", "", "byte", "byte", "nsecond", "%", "%", "%", "%", "register/thread", "block", "block", "block",
         "block"]
KERNELS = [
    ["0", "walk_kernel", "(2,64,1)", "(128,1,1)", "200,000,000", "100,000,000", "120,000", "82.5", "20.0", "1.0",
     "6.2", "255", "2", "1", "16", "32"],
    ["1", "intra_kernel", "(64,64,1)", "(64,1,1)", "50,000,000", "10,000,000", "300,000", "10.0", "71.0", "45.0",
     "40.0", "96", "5", "4", "32", "32"],
    ["2", "inverse_kernel", "(64,64,1)", "(64,1,1)", "30,000,000", "30,000,000", "200,000", "15.0", "30.0", "n/a",
     "n/a", "40", "n/a", "n/a", "n/a", "n/a"],
]
RAW = "\n".join(["==PROF== Connected to process 1",
                 *(",".join(f'"{c}"' for c in row) for row in (HEADER, UNITS, *KERNELS)),
                 "==PROF== Disconnected"])


def test_raw_csv_rows_units_and_verdicts():
    rows = kernel_limits.parse_raw_csv(RAW)
    assert [r["kernel"] for r in rows] == ["walk_kernel", "intra_kernel", "inverse_kernel"]
    walk, intra, inverse = rows
    assert walk["time_us"] == pytest.approx(120.0)  # ns -> us
    assert walk["read_mb"] == pytest.approx(200.0) and walk["write_mb"] == pytest.approx(100.0)
    assert [r["verdict"] for r in rows] == ["memory", "compute", "latency"]
    assert intra["xu_pct"] == pytest.approx(45.0)
    assert inverse["xu_pct"] is None  # a value ncu did not give reads as missing, not as 0
    assert walk["tensor_pct"] is None  # a counter this CSV lacks
    # occupancy: the launch's tightest limit (shared memory: 1 block per SM) and the warps that were resident
    assert walk["blocks_per_sm"] == 1 and intra["blocks_per_sm"] == 4 and inverse["blocks_per_sm"] is None
    assert walk["occupancy_pct"] == pytest.approx(6.2) and walk["registers"] == 255


def test_call_sum_against_the_floor():
    rec = {"op": "x", "lib": "ours", "shape": "1x1x1x1", "what": "fwd", "rc": 0,
           "kernels": kernel_limits.parse_raw_csv(RAW), "floor_bytes": {"inputs": 300e6, "outputs": 100e6}}
    text = kernel_limits.table([rec], copy_tbs=2.0)
    s = rec["summary"]
    assert s["kernels_us"] == pytest.approx(620.0)
    assert s["moved_mb"] == pytest.approx(420.0)
    assert s["bytes_ratio"] == pytest.approx(420.0 / 400.0)
    assert s["time_ratio"] == pytest.approx(620.0 / 200.0)  # the floor: 400 MB at 2 TB/s = 200 us
    assert "walk_kernel" in text and "latency" in text


def test_a_failed_run_is_reported_not_summed():
    rec = {"op": "x", "lib": "fla", "shape": "s", "what": "fwd", "rc": 1, "kernels": [], "error": "ncu: no GPU"}
    assert "no counters (rc 1)" in kernel_limits.table([rec], copy_tbs=3.0)
    assert "summary" not in rec
    assert kernel_limits.parse_raw_csv("==PROF== nothing profiled\n") == []
