#!/usr/bin/env bash
# One device call: every generated op's kernels under compute-sanitizer (memcheck), through gpu_check.py's
# cases (dense with an initial state, gradients, and varlen with uneven sequences, one of 3 tokens), at small
# shapes so that the instrumented run fits a call. Then the fused forward walks (fwd_fused), pinned by a plan
# override so that they run at these small grids too, where the launcher would take fwd_h + fwd_o.
#
# Device tool: command `bash benchmarks/sanitize_ops.sh`, timeout_s 600. Knobs, as env vars before `bash`:
#   OPS (all ops)   FUSED_OPS (the ops with a fused walk)   SHAPES=2x512x4x128 (all ops)
#   FUSED_SHAPES="2x512x4x128 1x384x2x64" (empty: none; gla's walk is planned at head dim 64 only)   GRAD_T=200
# Writes under $OUT: sanitize.log and one sanitize_<case>.txt per run; the summary is printed last. A run
# passes when compute-sanitizer reports no error (its exit code 9 says it found one) and gpu_check passes.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OPS=${OPS:-linear_attn,simple_gla,gla,delta_rule,gated_delta_rule,dplr_delta_rule,rwkv7}
FUSED_OPS=${FUSED_OPS:-linear_attn,simple_gla,gla,delta_rule,gated_delta_rule}
SHAPES=${SHAPES:-2x512x4x128}
FUSED_SHAPES=${FUSED_SHAPES-"2x512x4x128 1x384x2x64"}  # set it empty to skip the fused runs
GRAD_T=${GRAD_T:-200}
summary=()

run_case() {  # name, then the gpu_check arguments
  local name=$1 rc
  shift
  timeout -k 10 280 compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
    python3 benchmarks/gpu_check.py --grad-T "$GRAD_T" --out "$OUT/sanitize_$name.json" "$@" \
    >"$OUT/sanitize_$name.txt" 2>&1
  rc=$?
  tail -n 3 "$OUT/sanitize_$name.txt" | tee -a "$OUT/sanitize.log"
  summary+=("$name: rc=$rc, $(grep -c 'Invalid\|out of bounds\|misaligned' "$OUT/sanitize_$name.txt") memcheck reports")
}

for shape in $SHAPES; do
  run_case "all_$shape" --ops "$OPS" --shape "$shape"
done
for shape in $FUSED_SHAPES; do
  FLA_GEN_PLAN_OVERRIDE='{"fwd_fused": {"num_stages": 2}}' run_case "fused_$shape" --ops "$FUSED_OPS" \
    --modes chunk --shape "$shape"
done
echo "== summary (rc 0: clean; 9: compute-sanitizer found an error; 124: time limit)"
printf '%s\n' "${summary[@]}" | tee -a "$OUT/sanitize.log"
