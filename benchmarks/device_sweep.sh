#!/usr/bin/env bash
# One device call: plan-variant sweep (sweep_plans.py) of generated chunk ops, table last.
#
# Device tool: command `bash benchmarks/device_sweep.sh`, timeout_s 600 (no wheels needed: fla-core is
# not called). Knobs, as env vars before `bash`:
#   OPS=gla,delta_rule   SHAPES=4x4096x16x128   SWEEP_S=540 (wall limit of the sweep)
#   SWEEP_STAGES= (kernels, e.g. fwd_o,bwd_dv; default all but cumsum)   MAX_VARIANTS=8
#   EXTRA_VARIANTS='{"fwd_o": [{"num_warps": 8}]}' (tried first, as one argument)   SWEEP_ARGS=--quick (more flags)
# Writes under $OUT: sweep.log, sweep.json (rewritten after every variant), sweep_table.txt,
# sweep_proposals.txt (fla_gen/tuned.py entries for wins >= 3%).
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
LOG="$OUT/sweep.log"
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OPS=${OPS:-gla,delta_rule}
SHAPES=${SHAPES:-4x4096x16x128}
SWEEP_S=${SWEEP_S:-540}
MAX_VARIANTS=${MAX_VARIANTS:-8}
T0=$SECONDS

{
  echo "== device_sweep $(date -u +%FT%TZ)  OPS=$OPS SHAPES=$SHAPES SWEEP_S=$SWEEP_S MAX_VARIANTS=$MAX_VARIANTS"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1 | head -2
  python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], '| torch', torch.__version__,
'| triton', triton.__version__)"
} 2>&1 | tee "$LOG"

stage_args=()
[[ -n "$SWEEP_STAGES" ]] && stage_args+=(--stages "$SWEEP_STAGES")
[[ -n "$EXTRA_VARIANTS" ]] && stage_args+=(--extra-variants "$EXTRA_VARIANTS")
# The sweep stops starting variants 15 s before its budget; `timeout` is the backstop.
# shellcheck disable=SC2086
timeout -k 10 "$SWEEP_S" python3 benchmarks/sweep_plans.py --ops "$OPS" --shapes "$SHAPES" \
  --budget-s $((SWEEP_S - 25)) --max-variants "$MAX_VARIANTS" "${stage_args[@]}" \
  --out "$OUT/sweep.json" --table "$OUT/sweep_table.txt" $SWEEP_ARGS 2>&1 | tee -a "$LOG"
rc=$?

{
  echo
  echo "== done in $((SECONDS - T0))s  sweep_plans rc=$rc (124 = limit hit; sweep.json holds every finished variant)"
  if [[ ! -s "$OUT/sweep_table.txt" && -s "$OUT/sweep.json" ]]; then
    python3 benchmarks/sweep_plans.py --render "$OUT/sweep.json" > "$OUT/sweep_table.txt" 2>&1
  fi
  cat "$OUT/sweep_table.txt" 2>/dev/null || echo "(sweep_table.txt not written)"
} 2>&1 | tee -a "$LOG"
# Proposals need the specs' parser (lark), which the GPU image may lack: best effort.
python3 benchmarks/sweep_plans.py --propose "$OUT/sweep.json" > "$OUT/sweep_proposals.txt" 2>&1 \
  || echo "(proposals: run 'python benchmarks/sweep_plans.py --propose sweep.json' on the CPU machine)" \
  >> "$OUT/sweep_proposals.txt"
