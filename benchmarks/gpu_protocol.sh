#!/usr/bin/env bash
# The mission's protocol at GPU scale: preset ddpm-cifar10 (35.7M U-Net, CIFAR-10 32 px), uniform vs adaptive under
# the SAME wall-clock training budget, then 10,000 images each with 1000-step DDPM ancestral sampling (not DDIM) and
# clean-fid FID against CIFAR-10 train statistics. Results: $OUT/<method>/samples/metrics.json and $OUT/summary.md.
#
#   HOURS=10 bash benchmarks/gpu_protocol.sh                       # one 8-GPU node, 10 h per method
#   HOURS=0.2 STEPS=2000 EVAL_IMAGES=2000 bash benchmarks/gpu_protocol.sh   # a short smoke version
#
# Every knob is an environment variable (below). PRESET, FEATURES, MODES, SAMPLE_STEPS, TRAIN_FLAGS and EVAL_FLAGS
# exist so that the whole pipeline can be exercised end to end on a CPU without clean-fid's downloads
# (tests/test_benchmarks.py runs it with cpu-tiny16, a few steps and a TorchScript proxy feature network).
# Needs: CIFAR-10 (torchvision download, or DATA=/path/train.zip), clean-fid's Inception weights and CIFAR-10 stats
# (downloaded at first use; offline, see docs/evaluation.md). Everything resumes: rerun the same command.
set -euo pipefail
cd "$(dirname "$0")/.."

HOURS=${HOURS:-10}                                   # training budget per method (evaluation time excluded)
CONFIG=${CONFIG:-accelerate_configs/8gpu_bf16.yaml}  # 8 GPUs, bf16; single_gpu.yaml for one GPU
BATCH=${BATCH:-16}                                   # per GPU: 16 x 8 GPUs = the DDPM paper's global batch of 128
STEPS=${STEPS:-800000}                               # step cap (the paper's 800k); the budget usually ends first
EVAL_STEPS=${EVAL_STEPS:-20000}                      # in-training FID every N steps (FID-vs-wall-clock curve)
EVAL_IMAGES=${EVAL_IMAGES:-10000}
OUT=${OUT:-runs/gpu_protocol}
METHODS=${METHODS:-"uniform adaptive"}
PRESET=${PRESET:-ddpm-cifar10}
SAMPLE_STEPS=${SAMPLE_STEPS:-1000}                  # DDPM ancestral steps for the final samples (the paper's 1000)
SAMPLE_BATCH=${SAMPLE_BATCH:-1000}                  # images per sampling batch (per process)
FEATURES=${FEATURES:-inception}                      # clean-fid Inception (FID), or a TorchScript .pt (proxy FD)
MODES=${MODES:-"clean legacy_tensorflow"}            # clean-fid resize modes to score
TRAIN_FLAGS=${TRAIN_FLAGS:-}                         # extra train_accelerate.py flags
EVAL_FLAGS=${EVAL_FLAGS:-}                           # extra evaluate_fid.py flags (e.g. --ref_dir for a proxy FD)
DATA_FLAGS=${DATA:+--train_data_dir $DATA}
DATA_FLAGS=${DATA_FLAGS:---dataset_name cifar10}
MINUTES=$(python -c "print(float('$HOURS') * 60)")

for method in $METHODS; do
  accelerate launch --config_file "$CONFIG" train_accelerate.py --preset "$PRESET" $DATA_FLAGS \
    --output_dir "$OUT/$method" --timestep_sampler "$method" --train_batch_size "$BATCH" \
    --max_train_minutes "$MINUTES" --max_train_steps "$STEPS" --checkpointing_steps 5000 --checkpoints_total_limit 2 \
    --eval_steps "$EVAL_STEPS" --eval_num_images "$EVAL_IMAGES" --eval_inference_steps 100 \
    --eval_feature_extractor "$FEATURES" --resume_from_checkpoint latest $TRAIN_FLAGS
  accelerate launch --config_file "$CONFIG" sample.py --model_path "$OUT/$method" --num_images "$EVAL_IMAGES" \
    --num_inference_steps "$SAMPLE_STEPS" --output_dir "$OUT/$method/samples" --batch_size "$SAMPLE_BATCH"
  for mode in $MODES; do
    python evaluate_fid.py --samples "$OUT/$method/samples" --num_images "$EVAL_IMAGES" --mode "$mode" \
      --feature_extractor "$FEATURES" --output "$OUT/$method/metrics_$mode.json" $EVAL_FLAGS
  done
done

MODES="$MODES" python - "$OUT" $METHODS <<'PY'
import json, os, sys
from pathlib import Path
out, methods, modes = Path(sys.argv[1]), sys.argv[2:], os.environ["MODES"].split()
metrics = {(m, mode): json.loads((out / m / f"metrics_{mode}.json").read_text()) for m in methods for mode in modes}
key = "fid" if all("fid" in v for v in metrics.values()) else "proxy_fd"  # proxy FD when FEATURES is not Inception
label = "FID" if key == "fid" else "proxy FD"
lines = ["| method | steps | training hours | " + " | ".join(f"{label} {mode}" for mode in modes) + " |",
         "|---|---|---|" + "---|" * len(modes)]
for m in methods:
    recs = [json.loads(l) for l in (out / m / "stats.jsonl").read_text().splitlines()]
    last = max((r for r in recs if "train_seconds" in r), key=lambda r: r["step"])
    scores = " | ".join(f"{metrics[m, mode][key]:.2f}" for mode in modes)
    lines.append(f"| {m} | {last['step']} | {last['train_seconds'] / 3600:.2f} | {scores} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
