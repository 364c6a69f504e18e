#!/usr/bin/env bash
# One device call for the gla kernel split and the transform-kernel launch (2026-11-23, session 3):
# bf16 correctness of gla at T=4096, gla ours vs fla at 8x2048x32x64 (same run), ours at the other
# issue-7 shapes, gla's per-kernel profile, and the transform-kernel (BR, warps) sweep.
# Device tool: command `bash benchmarks/device_gla_split.sh`, carry [".whl"], timeout_s 600.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
STAGES="check bench" OPS=gla SHAPES=8x2048x32x64 LIBS=ours,fla CHECK_S=120 CHECK_ARGS="--modes chunk --grad-T 4096" \
  BENCH_S=280 FLA_JOBS=1 BENCH_ARGS=--skip-first-call bash benchmarks/device_run.sh > "$OUT/run.log" 2>&1
export PYTHONPATH=/tmp/site:$PWD
timeout 100 python3 benchmarks/bench_ops.py --ops gla --shapes 4x4096x16x128,1x16384x16x128,2x8192x8x256 \
  --libs ours --skip-first-call --out "$OUT/bench_ours.json" --table "$OUT/bench_ours.txt" > "$OUT/bench_ours.log" 2>&1
timeout 60 python3 benchmarks/profile_op.py --op gla --shape 4x4096x16x128 > "$OUT/profile_gla.txt" 2>&1
timeout 120 python3 benchmarks/sweep_transform_tile.py --out "$OUT/transform_tile.json" > "$OUT/transform_tile.txt" 2>&1
cat "$OUT/check_table.txt" "$OUT/bench_table.txt" "$OUT/bench_ours.txt" "$OUT/profile_gla.txt" "$OUT/transform_tile.txt"
