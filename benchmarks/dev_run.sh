#!/usr/bin/env bash
# One development run of the adaptive method for docs/adaptive.md's log: cpu-tiny16 on the protocol's data, a
# training seed (SEED, default 0) and the DEVELOPMENT evaluation seeds (2,000,000 + i - never the protocol's
# 1,000,000 + i), proxy FD at 500, 750, 1000, ... steps; stopped (SIGTERM: it checkpoints) once STOP_STEP is evaluated.
#
#   SEED=1 bash benchmarks/dev_run.sh NAME STOP_STEP [extra train_accelerate.py flags]
#
# Output: $WORK/NAME (the run), $WORK/NAME.log, and a line "NAME [(step, proxy_fd), ...]" appended to
# $WORK/results.txt. Reruns resume. Runs use one thread each, so two can share a 2-core machine.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=$1; STOP=$2; shift 2
SHARED=${SHARED:-../shared}
WORK=${WORK:-benchmarks/_work/dev}
OUT=$WORK/$NAME
mkdir -p "$WORK"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-python}
$PY train_accelerate.py --preset cpu-tiny16 --train_data_dir "$SHARED/datasets/cifar10-jpeg/train.zip" \
  --output_dir "$OUT" --seed "${SEED:-0}" --logger none --max_train_steps 2000 \
  --eval_at_steps 500,750,1000,1250,1500,1750,2000 --eval_seed_offset 2000000 \
  --eval_feature_extractor "$SHARED/eval/cifar10-proxy-features.pt" \
  --checkpointing_steps 250 --checkpoints_total_limit 1 --save_images_steps 100000 --resume_from_checkpoint latest \
  --timestep_sampler adaptive "$@" > "$WORK/$NAME.log" 2>&1 &
PID=$!
while kill -0 $PID 2>/dev/null; do
  sleep 20
  if grep -q "\"step\": $STOP,.*proxy_fd\|proxy_fd.*\"step\": $STOP[,}]" "$OUT/stats.jsonl" 2>/dev/null; then
    kill -TERM $PID 2>/dev/null || true  # it checkpoints and exits; a second kill would find no process
    break
  fi
done
while kill -0 $PID 2>/dev/null; do sleep 2; done
grep proxy_fd "$OUT/stats.jsonl" | $PY -c "
import sys, json
print('$NAME', [(r['step'], round(r['proxy_fd'], 3)) for r in map(json.loads, sys.stdin)])" >> "$WORK/results.txt"
