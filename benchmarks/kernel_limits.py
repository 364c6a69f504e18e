#!/usr/bin/env python3
"""What bounds each kernel of one op's call: Nsight Compute's counters, kernel by kernel, against the floor.

    python benchmarks/kernel_limits.py --ops gla,dplr_delta_rule --libs ours,fla --shape 4x4096x16x128 \
        --fwd-only --out limits.json --table limits.txt

Per (op, lib) the script runs itself under ``ncu --clock-control none --profile-from-start off`` (a worker):
two warm-up calls, then one call between cudaProfilerStart and Stop, so ncu sees exactly one call's kernels.
Per kernel it records the duration, the DRAM bytes read and written, and how busy the GPU's units were (% of
their peak over the kernel's time): DRAM, the SMs (Nsight's "Compute (SM) Throughput", the busiest SM unit),
the tensor pipe, the XU pipe (exp, log, sin, cos: the special-function unit) and the issue slots.
Each kernel gets a verdict:
- ``memory``: DRAM >= 60% of peak: it moves bytes about as fast as the GPU can;
- ``compute``: the SMs' busiest unit >= 60%;
- ``latency``: neither: the kernel waits (dependent steps of a sequential walk, a small grid, a chain of
  small dots), so neither more bandwidth nor more FLOP/s would speed it up.
The op's row adds them up: the bytes the call moved against the floor's (inputs read once, outputs written
once), and the time of its kernels against the floor's time at the copy bandwidth ``--copy-tbs`` (3.0 TB/s
on the H100 by a device-to-device copy; benchmarks/run.py measures it). That splits "ours / floor" into the extra
bytes the algorithm moves and how far each kernel is from moving its own bytes at full speed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import _ops  # noqa: E402

SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "LaunchStats", "Occupancy")
BYTES = ("dram__bytes_read.sum", "dram__bytes_write.sum")
# Counter prefixes to the table's columns; on a GPU where a name differs, the column reads '-'.
COLUMNS = {
    "time_us": ("gpu__time_duration.sum",),
    "dram_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                 "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "tensor_pct": ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active",
                   "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
                   "sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active"),
    "xu_pct": ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",),
    "issue_pct": ("sm__issue_active.avg.pct_of_peak_sustained_elapsed",
                  "sm__issue_active.avg.pct_of_peak_sustained_active",
                  "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    # achieved occupancy (warps resident per SM against its maximum) and what the launch allows
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "registers": ("launch__registers_per_thread",),
}
# How many of the kernel's blocks one SM can hold, by each resource; the smallest is the limit.
BLOCK_LIMITS = ("launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
                "launch__occupancy_limit_warps", "launch__occupancy_limit_blocks")
BUSY = 60.0


def verdict(row: dict) -> str:
    """'memory', 'compute' or 'latency' for one kernel's counters (see the module docstring)."""
    if (row.get("dram_pct") or 0) >= BUSY:
        return "memory"
    if (row.get("sm_pct") or 0) >= BUSY:
        return "compute"
    return "latency"


def parse_raw_csv(text: str) -> list[dict]:
    """The kernels of ``ncu --csv --page raw --print-units base``: one dict per kernel, the table's columns."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if len(lines) < 3:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, data = rows[0], rows[2:]  # rows[1]: the units

    def number(s: str) -> float | None:
        try:
            return float(s.replace(",", ""))
        except ValueError:
            return None

    kernels = []
    for r in data:
        rec = dict(zip(header, r, strict=False))
        row = {"kernel": rec.get("Kernel Name", "?"), "grid": rec.get("Grid Size", ""),
               "block": rec.get("Block Size", "")}
        for col, names in COLUMNS.items():
            row[col] = next((number(rec[n]) for n in names if n in rec and number(rec[n]) is not None), None)
        if row["time_us"] is not None:
            row["time_us"] /= 1e3  # ns in base units
        row["read_mb"] = (number(rec.get(BYTES[0], "")) or 0) / 1e6
        row["write_mb"] = (number(rec.get(BYTES[1], "")) or 0) / 1e6
        limits = [number(rec[n]) for n in BLOCK_LIMITS if n in rec and number(rec[n]) is not None]
        row["blocks_per_sm"] = min(limits) if limits else None
        row["verdict"] = verdict(row)
        # every pipe's utilisation as ncu named it, for the JSON (the table shows the tensor and XU pipes)
        row["pipes"] = {n: number(v) for n, v in rec.items()
                        if "pipe" in n and n.endswith("pct_of_peak_sustained_active") and number(v) is not None}
        kernels.append(row)
    return kernels


def run_worker(args: argparse.Namespace) -> int:
    """Two warm-up calls, then one call inside cudaProfilerStart/Stop; prints the floor's bytes as JSON."""
    import torch

    op = _ops.OPS[args.op]
    shape = _ops.parse_shape(args.shape)
    fn = (_ops.resolve_ours if args.lib == "ours" else _ops.resolve_fla)(op, "chunk")
    _, leaves, kwargs = _ops.make_inputs(op, shape, torch.bfloat16, "cuda", seed=0)
    scale = _ops.scale_for(op, shape[3])
    step = _ops.op_step(fn, leaves, {"scale": scale, **kwargs}, args.fwd_only)

    for _ in range(2):
        o = step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    inputs = sum(t.numel() * t.element_size() for t in leaves)
    outputs = o.numel() * o.element_size()
    print("FLOOR_BYTES " + json.dumps({"inputs": inputs, "outputs": outputs}))
    return 0


def profile(args: argparse.Namespace, op: str, lib: str) -> dict:
    """One (op, lib): ncu over a worker; its kernels and the floor's bytes."""
    cmd = ["ncu", "--clock-control", "none", "--profile-from-start", "off", "--csv", "--page", "raw",
           "--print-units", "base", *[a for s in SECTIONS for a in ("--section", s)], "--metrics", ",".join(BYTES),
           sys.executable, __file__, "--worker", "--op", op, "--lib", lib, "--shape", args.shape]
    if args.fwd_only:
        cmd.append("--fwd-only")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
    rec = {"op": op, "lib": lib, "shape": args.shape, "what": "fwd" if args.fwd_only else "fwd+bwd",
           "rc": res.returncode, "kernels": parse_raw_csv(res.stdout)}
    for line in res.stdout.splitlines():
        if line.startswith("FLOOR_BYTES "):
            rec["floor_bytes"] = json.loads(line.split(" ", 1)[1])
    if res.returncode != 0 or not rec["kernels"]:
        rec["error"] = (res.stderr or res.stdout)[-1500:]
    return rec


def fmt(x, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(recs: list[dict], copy_tbs: float) -> str:
    """Per kernel, then per call: time, bytes, units busy, verdict; the call against the floor."""
    out = [f"{'op/lib/kernel':58s} {'us':>8s} {'read MB':>8s} {'write MB':>8s} {'TB/s':>5s} {'DRAM%':>6s} "
           f"{'SM%':>5s} {'TC%':>5s} {'XU%':>5s} {'issue%':>6s} {'regs':>4s} {'blk/SM':>6s} {'occ%':>5s}  verdict"]
    for rec in recs:
        head = f"{rec['op']} {rec['lib']} {rec['shape']} {rec['what']}"
        if rec.get("error"):
            out.append(f"{head}: no counters (rc {rec['rc']}): {rec['error'].strip().splitlines()[-1:]}")
            continue
        out.append(head)
        for k in rec["kernels"]:
            t = k["time_us"] or 0
            tbs = (k["read_mb"] + k["write_mb"]) / t if t else None  # MB per us = TB/s
            out.append(f"  {k['kernel'][:56]:56s} {fmt(k['time_us']):>8s} {k['read_mb']:8.1f} {k['write_mb']:8.1f} "
                       f"{fmt(tbs, '.2f'):>5s} {fmt(k['dram_pct']):>6s} {fmt(k['sm_pct']):>5s} "
                       f"{fmt(k['tensor_pct']):>5s} {fmt(k['xu_pct']):>5s} {fmt(k['issue_pct']):>6s} "
                       f"{fmt(k.get('registers'), '.0f'):>4s} {fmt(k.get('blocks_per_sm'), '.0f'):>6s} "
                       f"{fmt(k.get('occupancy_pct')):>5s}  {k['verdict']}")
        total_us = sum(k["time_us"] or 0 for k in rec["kernels"])
        moved = sum(k["read_mb"] + k["write_mb"] for k in rec["kernels"])
        fb = rec.get("floor_bytes")
        if fb:
            floor_mb = (fb["inputs"] + fb["outputs"]) / 1e6
            floor_us = floor_mb / copy_tbs
            at_copy_us = moved / copy_tbs
            out.append(f"  = kernels {total_us:.1f} us, {moved:.0f} MB moved; floor {floor_mb:.0f} MB "
                       f"({floor_us:.1f} us at {copy_tbs} TB/s): bytes x{moved / floor_mb:.2f}, "
                       f"time x{total_us / floor_us:.2f}; "
                       f"this call's bytes at the copy bandwidth {at_copy_us:.1f} us")
            rec["summary"] = {"kernels_us": total_us, "moved_mb": moved, "floor_mb": floor_mb,
                              "bytes_ratio": moved / floor_mb, "time_ratio": total_us / floor_us}
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="gla")
    p.add_argument("--libs", default="ours")
    p.add_argument("--shape", default="4x4096x16x128")
    p.add_argument("--fwd-only", action="store_true", help="the forward alone, without autograd")
    p.add_argument("--copy-tbs", type=float, default=3.0, help="copy bandwidth for the floor, TB/s")
    p.add_argument("--timeout", type=float, default=280.0, help="seconds per (op, lib)")
    p.add_argument("--out", default=None)
    p.add_argument("--table", default=None)
    p.add_argument("--render", default=None, metavar="JSON", help="only print a saved result's table")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--op", default=None, help=argparse.SUPPRESS)
    p.add_argument("--lib", default="ours", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return run_worker(args)
    if args.render:
        with open(args.render) as f:
            saved = json.load(f)
        print(table(saved["runs"], saved["copy_tbs"]))
        return 0
    recs = []
    for op in _ops.parse_ops(args.ops):
        for lib in args.libs.split(","):
            try:
                recs.append(profile(args, op, lib))
            except subprocess.TimeoutExpired:
                recs.append({"op": op, "lib": lib, "shape": args.shape, "rc": 124, "kernels": [],
                             "what": "fwd" if args.fwd_only else "fwd+bwd", "error": "timeout"})
            text = table(recs, args.copy_tbs)
            if args.out:
                _ops.write_json(args.out, {"copy_tbs": args.copy_tbs, "runs": recs})
    print(text)
    if args.table:
        with open(args.table, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
