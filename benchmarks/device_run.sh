#!/usr/bin/env bash
# One device call: GPU correctness (gpu_check.py), then benchmarks (bench_ops.py), tables last.
#
# Device tool: command `bash benchmarks/device_run.sh`, carry [".whl"], timeout_s 600.
# (.whl holds fla_core-0.6.0 + einops; see benchmarks/README.md.) Knobs, as env vars before `bash`:
#   OPS=linear_attn,simple_gla,gla   SHAPES=4x4096x16x128 (or issue7: its four shapes)   STAGES="check bench"
#   (also: field, the RWKV-7 + cu_seqlens call of benchmarks/rwkv7_field_call.py, run first; transforms,
#   benchmarks/bench_transforms.py with TRANSFORMS_ARGS, run second)
#   CHECK_S=120 (gpu_check wall limit)   BENCH_S=450 (bench_ops wall limit); keep their sum <= ~570
#   FLA_JOBS=3 (fla first calls = compile + autotune, run 3 at a time: ~5 min instead of ~8)
#   FLA_AUTOTUNE=.fla_autotune (fla's autotune results: seeded from this dir, this run's added to it and
#   returned as $OUT/fla_autotune.tgz; unpack it into .fla_autotune here and carry [".whl", ".fla_autotune"]
#   so the next call skips fla's minutes of autotune; see bench_ops.py --autotune-cache)
#   LIBS=sdpa,ours,fla   CHECK_ARGS=... BENCH_ARGS=... (extra flags, e.g. BENCH_ARGS=--quick)
# Writes under $OUT (at most 8 files come back): device_run.log, check.json, check_table.txt,
# bench.json, bench_table.txt.
set -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-/tmp/device_out}
mkdir -p "$OUT"
LOG="$OUT/device_run.log"
export PYTHONUNBUFFERED=1
OPS=${OPS:-linear_attn,simple_gla,gla}
SHAPES=${SHAPES:-4x4096x16x128}
STAGES=${STAGES:-check bench}
CHECK_S=${CHECK_S:-120}
BENCH_S=${BENCH_S:-450}
FLA_JOBS=${FLA_JOBS:-3}
LIBS=${LIBS:-sdpa,ours,fla}
FLA_AUTOTUNE=${FLA_AUTOTUNE:-.fla_autotune}
T0=$SECONDS

{
  echo "== device_run $(date -u +%FT%TZ)  OPS=$OPS SHAPES=$SHAPES STAGES=$STAGES CHECK_S=$CHECK_S BENCH_S=$BENCH_S"
  if ls .whl/*.whl >/dev/null 2>&1; then
    if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl >/tmp/pip_install.log 2>&1; then
      echo "installed into /tmp/site: $(cd .whl && ls ./*.whl | tr '\n' ' ')"
    else
      cat /tmp/pip_install.log
      echo "WARNING: wheel install failed: fla-core will show as missing"
    fi
  else
    echo "WARNING: no .whl/ carried: fla-core will show as missing"
  fi
} 2>&1 | tee "$LOG"
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,clocks.mem \
    --format=csv 2>&1 | head -3
  python3 - <<'EOF'
import sys, importlib.metadata as md
import torch, triton
print("python", sys.version.split()[0], "| torch", torch.__version__, "| triton", triton.__version__,
      "| cuda", torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"sm_{p.major}{p.minor}", p.multi_processor_count, "SMs",
          f"{p.total_memory / 2**30:.0f} GiB")
for n in ("fla-core", "einops", "numpy"):
    try:
        print(n, md.version(n))
    except md.PackageNotFoundError:
        print(n, "not installed")
try:
    import fla  # noqa: F401
    print("fla import ok from", fla.__file__)
except Exception as e:
    print("fla import FAILED:", type(e).__name__, e)
EOF
  ls generated 2>/dev/null | tr '\n' ' '; echo "<- generated packages"
} 2>&1 | tee -a "$LOG"

rc_check=skipped
rc_bench=skipped
rc_field=skipped
if [[ " $STAGES " == *" field "* ]]; then
  echo "== rwkv7_field_call (limit 300s) at $((SECONDS - T0))s" | tee -a "$LOG"
  timeout -k 10 300 python3 benchmarks/rwkv7_field_call.py $FIELD_ARGS --out "$OUT/rwkv7_field.json" 2>&1 | tee -a "$LOG"
  rc_field=$?
fi
rc_transforms=skipped
if [[ " $STAGES " == *" transforms "* ]]; then
  echo "== bench_transforms (limit 240s) at $((SECONDS - T0))s" | tee -a "$LOG"
  # shellcheck disable=SC2086
  timeout -k 10 240 python3 benchmarks/bench_transforms.py $TRANSFORMS_ARGS --out "$OUT/transforms.json" 2>&1 \
    | tee "$OUT/transforms_table.txt" | tee -a "$LOG"
  rc_transforms=$?
fi
if [[ " $STAGES " == *" check "* ]]; then
  echo "== gpu_check (limit ${CHECK_S}s) at $((SECONDS - T0))s" | tee -a "$LOG"
  # shellcheck disable=SC2086
  timeout -k 10 "$CHECK_S" python3 benchmarks/gpu_check.py --ops "$OPS" --budget-s $((CHECK_S - 20)) \
    --out "$OUT/check.json" --table "$OUT/check_table.txt" $CHECK_ARGS 2>&1 | tee -a "$LOG"
  rc_check=$?
fi
if [[ " $STAGES " == *" bench "* ]]; then
  echo "== bench_ops (limit ${BENCH_S}s) at $((SECONDS - T0))s" | tee -a "$LOG"
  # shellcheck disable=SC2086
  timeout -k 15 "$BENCH_S" python3 benchmarks/bench_ops.py --ops "$OPS" --shapes "$SHAPES" --libs "$LIBS" \
    --fla-jobs "$FLA_JOBS" --budget-s $((BENCH_S - 30)) --timeout 400 --autotune-cache "$FLA_AUTOTUNE" \
    --out "$OUT/bench.json" --table "$OUT/bench_table.txt" $BENCH_ARGS 2>&1 | tee -a "$LOG"
  rc_bench=$?
  tar czf "$OUT/fla_autotune.tgz" -C "$FLA_AUTOTUNE" . 2>/dev/null \
    && echo "fla autotune results: $(find "$FLA_AUTOTUNE" -name '*.autotune.json' | wc -l) files -> fla_autotune.tgz" | tee -a "$LOG"
fi

{
  echo
  echo "== done in $((SECONDS - T0))s  gpu_check rc=$rc_check  bench_ops rc=$rc_bench  rwkv7_field rc=$rc_field  transforms rc=$rc_transforms (124 = stage limit hit)"
  for t in transforms_table check_table bench_table; do
    echo
    cat "$OUT/$t.txt" 2>/dev/null || echo "($t.txt not written)"
  done
} 2>&1 | tee -a "$LOG"
