#!/usr/bin/env bash
# One GPU, under 8 minutes: every GPU path of the project, measured once, with everything written under $OUT.
#   1. training throughput of our loop vs the conventional Diffusers-example loop (fp32 and --mixed_precision bf16),
#      eager and with --compile (compilation excluded from img/s)               benchmarks/throughput.py --only train
#   2. peak GPU memory (torch.cuda.max_memory_allocated) at BATCH, fp32/bf16 x gradient checkpointing  --only memory
#   3. uniform vs adaptive: the same wall-clock budget each (train_accelerate.py --max_train_minutes), then the exported
#      EMA pipeline is sampled (sample.py) and scored with the proxy feature network (evaluate_fid.py)
#   4. $OUT: README.md (tables), summary.json, env.json (versions, device, commit, settings), nvidia-smi.txt,
#      log.txt, gpu_check.png, and each section's own JSON
#
#   bash benchmarks/gpu_check.sh                               # one GPU: ddpm-cifar10, batch 128, bf16
#   MINUTES=1 COMPILE=0 bash benchmarks/gpu_check.sh           # shorter
#
# Time: every section has a limit (below) and none runs past the deadline TOTAL_SECONDS; the training runs get what
# is left, MINUTES at most and the same for every method. The report follows the deadline (seconds).
# Data: $SHARED/datasets/cifar10-jpeg/train.zip and $SHARED/eval/cifar10-proxy-features.pt (SHARED=../shared) when
# they exist (or DATA / FEATURES); otherwise generated images and a toy feature network, said loudly in the log and the README
# (the FD then measures nothing). tests/test_benchmarks.py runs the whole script on a CPU at toy size.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-docs/benchmarks/gpu/$(date +%F)}   # what comes back: README.md, summary.json, env.json, log.txt, ...
WORK=${WORK:-benchmarks/_work/gpu_check}     # training runs, checkpoints, samples (large; not under OUT)
PYTHON=${PYTHON:-python}
PRESET=${PRESET:-ddpm-cifar10}               # 35.7M U-Net, 32 px
PRECISION=${PRECISION:-bf16}                 # our loop, the training runs and sampling
BATCH=${BATCH:-128}                          # per step, every section (the DDPM paper's batch)
SHARED=${SHARED:-../shared}                   # where the default DATA and FEATURES are looked for
DATA=${DATA:-}                               # folder/.zip of images at the preset's resolution; default: SHARED's CIFAR-10
FEATURES=${FEATURES:-}                       # TorchScript [N,3,H,W] in [0,255] -> [N,D]; default: SHARED's proxy network
TOTAL_SECONDS=${TOTAL_SECONDS:-460}          # deadline of all sections (the report takes seconds more)
TP_SECONDS=${TP_SECONDS:-70}                 # ours eager, conventional fp32, conventional bf16 (a fresh process each)
COMPILE=${COMPILE:-1}                        # 0: no --compile row
COMPILE_SECONDS=${COMPILE_SECONDS:-100}      # ours with --compile, compilation included
MEMORY_SECONDS=${MEMORY_SECONDS:-60}         # 4 processes: fp32/bf16 x gradient checkpointing
REF_SECONDS=${REF_SECONDS:-40}               # reference statistics of REF_IMAGES images of DATA (cached for the evaluations)
TP_FLAGS=${TP_FLAGS:---rounds 1 --warmup 5 --windows 3 --window_steps 10}   # throughput.py's measurement windows
METHODS=${METHODS:-"uniform adaptive"}
MINUTES=${MINUTES:-3}                        # training per method at most (the deadline may shorten it)
STEPS=${STEPS:-800000}                       # step cap; the minutes end first
TRAIN_SLACK=${TRAIN_SLACK:-30}               # per run beyond its minutes: start-up, data, final checkpoint and export
EVAL_IMAGES=${EVAL_IMAGES:-1000}             # generated images per method (more than the features' dimensions)
SAMPLE_STEPS=${SAMPLE_STEPS:-100}            # respaced DDPM ancestral steps (evaluation samples and the final grid)
REF_IMAGES=${REF_IMAGES:-5000}               # reference: a fixed random subset of DATA
EVAL_SECONDS=${EVAL_SECONDS:-35}             # per method: sample.py + evaluate_fid.py (reference already built)
TRAIN_FLAGS=${TRAIN_FLAGS:-}                 # extra train_accelerate.py flags
EVAL_FLAGS=${EVAL_FLAGS:-}                   # extra evaluate_fid.py flags
SETTINGS="PRESET PRECISION BATCH DATA FEATURES TOTAL_SECONDS TP_SECONDS COMPILE COMPILE_SECONDS MEMORY_SECONDS
          REF_SECONDS TP_FLAGS METHODS MINUTES STEPS TRAIN_SLACK EVAL_IMAGES SAMPLE_STEPS REF_IMAGES EVAL_SECONDS
          TRAIN_FLAGS EVAL_FLAGS"
DEFAULT_DATA=$SHARED/datasets/cifar10-jpeg/train.zip
DEFAULT_FEATURES=$SHARED/eval/cifar10-proxy-features.pt

die() { echo "gpu_check.sh: error: $*" >&2; exit 2; }
for v in BATCH TOTAL_SECONDS TP_SECONDS COMPILE_SECONDS MEMORY_SECONDS REF_SECONDS STEPS TRAIN_SLACK EVAL_IMAGES \
         SAMPLE_STEPS REF_IMAGES EVAL_SECONDS; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[[ $MINUTES =~ ^[0-9]*\.?[0-9]+$ ]] && [[ ! $MINUTES =~ ^[0.]+$ ]] || die "MINUTES must be a positive number (got '$MINUTES')"
[[ $COMPILE == 0 || $COMPILE == 1 ]] || die "COMPILE must be 0 or 1 (got '$COMPILE')"
[[ -z $DATA || -e $DATA ]] || die "DATA $DATA does not exist"
[[ -z $FEATURES || -f $FEATURES ]] || die "FEATURES $FEATURES does not exist"
$PYTHON -m benchmarks.gpu_check check "$PRESET" "$PRECISION" $METHODS

mkdir -p "$OUT" "$WORK"
# An earlier run's results must not stand in for a section that fails this time.
rm -rf "$OUT/throughput" "$OUT/memory" "$OUT/train" "$OUT/eval" "$WORK/train" "$WORK/samples"
rm -f "$OUT"/{sections.jsonl,fallback.json,summary.json,README.md,env.json,gpu_check.png}
exec > >(tee "$OUT/log.txt") 2>&1
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 GPU_CHECK_COMMAND="bash benchmarks/gpu_check.sh" $SETTINGS
START=$SECONDS
FAILED=0

left() { echo $((TOTAL_SECONDS - (SECONDS - START))); }

run_section() {  # run_section NAME LIMIT_S CMD...: CMD under min(LIMIT_S, time to the deadline); sections.jsonl
  local name=$1 limit=$2 t0=$SECONDS rc=0
  shift 2
  if ((limit > $(left))); then limit=$(left); fi
  if ((limit < 1)); then
    echo "== $name: skipped, the deadline has passed"
    limit=0 rc=124
  else
    echo "== $name (limit ${limit}s, $(left)s to the deadline)"
    timeout -k 10 "$limit" "$@" || rc=$?
  fi
  echo "{\"name\": \"$name\", \"limit_s\": $limit, \"seconds\": $((SECONDS - t0)), \"rc\": $rc}" >> "$OUT/sections.jsonl"
  echo "== $name: exit $rc after $((SECONDS - t0))s"
  if ((rc != 0)); then FAILED=$((FAILED + 1)); fi
}

train_method() {  # train_method METHOD MINUTES: one training run on the wall-clock budget, exported at its end
  $PYTHON train_accelerate.py --preset "$PRESET" --train_data_dir "$DATA" --output_dir "$WORK/train/$1" \
    --overwrite_output_dir --timestep_sampler "$1" --mixed_precision "$PRECISION" --train_batch_size "$BATCH" \
    --max_train_minutes "$2" --max_train_steps "$STEPS" --checkpointing_steps none --save_images_steps none \
    --num_grid_images 16 --ddpm_num_inference_steps "$SAMPLE_STEPS" --logger none $TRAIN_FLAGS
}

evaluate_method() {  # evaluate_method METHOD: sample its exported pipeline, score the samples against DATA
  rm -rf "$WORK/samples/$1"  # samples of an earlier run at the same path would be reused by sample.py
  $PYTHON sample.py --model_path "$WORK/train/$1" --output_dir "$WORK/samples/$1" --num_images "$EVAL_IMAGES" \
    --num_inference_steps "$SAMPLE_STEPS" --mixed_precision "$PRECISION"
  $PYTHON evaluate_fid.py --samples "$WORK/samples/$1" --num_images "$EVAL_IMAGES" --feature_extractor "$FEATURES" \
    --ref_dir "$DATA" --ref_num_images "$REF_IMAGES" --output "$OUT/eval/$1/metrics.json" $EVAL_FLAGS
}
export -f train_method evaluate_method
export OUT WORK PYTHON

# Inputs: the shared CIFAR-10 and proxy feature network, or generated stand-ins (said loudly).
GEN_IMAGES=0 GEN_FEATURES=()
if [[ -z $DATA ]]; then
  if [[ -e $DEFAULT_DATA ]]; then DATA=$DEFAULT_DATA; else GEN_IMAGES=$((REF_IMAGES > BATCH ? REF_IMAGES : BATCH)); fi
fi
if [[ -z $FEATURES ]]; then
  if [[ -f $DEFAULT_FEATURES ]]; then FEATURES=$DEFAULT_FEATURES; else GEN_FEATURES=(--features); fi
fi
if ((GEN_IMAGES > 0 || ${#GEN_FEATURES[@]} > 0)); then
  echo "!!!!!!!!!! $DEFAULT_DATA or $DEFAULT_FEATURES is missing: GENERATED stand-ins are used."
  echo "!!!!!!!!!! The FD of this run measures NOTHING about sample quality (the pipeline runs, that is all)."
  $PYTHON -m benchmarks.gpu_check fallback "$WORK/generated" --out "$OUT" --preset "$PRESET" --images "$GEN_IMAGES" \
    "${GEN_FEATURES[@]}"
  if ((GEN_IMAGES > 0)); then DATA=$WORK/generated/images; fi
  if ((${#GEN_FEATURES[@]} > 0)); then FEATURES=$WORK/generated/toy-features.pt; fi
fi
echo "data: $DATA   features: $FEATURES"

# Environment: versions, device, commit, settings (DATA and FEATURES as used).
$PYTHON -m benchmarks.gpu_check env "$OUT" $SETTINGS
{ nvidia-smi && nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,clocks.max.sm --format=csv; } \
  > "$OUT/nvidia-smi.txt" 2>&1 || echo "(nvidia-smi not available on this machine)" >> "$OUT/nvidia-smi.txt"
head -n 20 "$OUT/nvidia-smi.txt"

# 1. Training throughput, eager then compiled (fresh processes; img/s after warm-up).
TP=("$PYTHON" -m benchmarks.throughput --only train --presets "$PRESET" --data "$DATA" --train_batch "$BATCH"
    --mixed_precision "$PRECISION")
run_section throughput-eager "$TP_SECONDS" "${TP[@]}" --out "$OUT/throughput/eager" \
  --train_kinds train-ours train-conventional train-conventional-bf16 $TP_FLAGS
if ((COMPILE == 1)); then
  run_section throughput-compile "$COMPILE_SECONDS" "${TP[@]}" --out "$OUT/throughput/compile" \
    --train_kinds train-ours-compile $TP_FLAGS
fi

# 2. Peak memory at BATCH.
run_section memory "$MEMORY_SECONDS" "$PYTHON" -m benchmarks.throughput --only memory --memory_preset "$PRESET" \
  --memory_batches "$BATCH" --data "$DATA" --out "$OUT/memory"

# 3. uniform vs adaptive: the reference statistics first (cached by content: the evaluations reuse them), then the
#    same minutes of training each (what the deadline leaves), each followed by sampling and the FD.
run_section eval-reference "$REF_SECONDS" "$PYTHON" evaluate_fid.py --make_ref --ref_dir "$DATA" \
  --ref_num_images "$REF_IMAGES" --feature_extractor "$FEATURES" $EVAL_FLAGS
read -ra METHOD_LIST <<< "$METHODS"
RESERVE=$((${#METHOD_LIST[@]} * (TRAIN_SLACK + EVAL_SECONDS) + 15))
TRAIN_MINUTES=$($PYTHON -m benchmarks.gpu_check minutes "$(left)" "$MINUTES" "${#METHOD_LIST[@]}" "$RESERVE")
TRAIN_LIMIT=$($PYTHON -c "print(round($TRAIN_MINUTES * 60) + $TRAIN_SLACK)")
echo "training: $TRAIN_MINUTES min per method (MINUTES=$MINUTES), $(left)s to the deadline"
for m in "${METHOD_LIST[@]}"; do
  run_section "train-$m" "$TRAIN_LIMIT" bash -c 'train_method "$1" "$2"' _ "$m" "$TRAIN_MINUTES"
  mkdir -p "$OUT/train/$m" "$OUT/eval/$m"
  for f in config.json run_info.json stats.jsonl export.json timestep_p.png; do
    if [[ -f $WORK/train/$m/$f ]]; then cp "$WORK/train/$m/$f" "$OUT/train/$m/"; fi
  done
  run_section "eval-$m" "$EVAL_SECONDS" bash -c 'evaluate_method "$1"' _ "$m"
  for f in grid.png sampling.json; do
    if [[ -f $WORK/samples/$m/$f ]]; then cp "$WORK/samples/$m/$f" "$OUT/eval/$m/"; fi
  done
done

# 4. Report.
echo "== report ($((SECONDS - START))s since the start)"
$PYTHON -m benchmarks.gpu_check report "$OUT" "$WORK"
echo "gpu_check: $FAILED section(s) failed or ran out of time; $((SECONDS - START))s in all; results in $OUT"
exit $((FAILED > 0))
