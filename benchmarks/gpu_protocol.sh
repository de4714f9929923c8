#!/usr/bin/env bash
# The mission's protocol at GPU scale: preset ddpm-cifar10 (35.7M U-Net, CIFAR-10 32 px), uniform vs adaptive under
# the SAME wall-clock training budget, then 10,000 images each with 1000-step DDPM ancestral sampling (not DDIM) and
# clean-fid FID against CIFAR-10 train statistics. Results: $OUT/<method>/samples/metrics.json and $OUT/summary.md.
#
#   HOURS=10 bash benchmarks/gpu_protocol.sh                       # one 8-GPU node, 10 h per method
#   HOURS=0.2 STEPS=2000 EVAL_IMAGES=2000 bash benchmarks/gpu_protocol.sh   # a short smoke version
#
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
DATA_FLAGS=${DATA:+--train_data_dir $DATA}
DATA_FLAGS=${DATA_FLAGS:---dataset_name cifar10}
MINUTES=$(python -c "print(float('$HOURS') * 60)")

for method in $METHODS; do
  accelerate launch --config_file "$CONFIG" train_accelerate.py --preset ddpm-cifar10 $DATA_FLAGS \
    --output_dir "$OUT/$method" --timestep_sampler "$method" --train_batch_size "$BATCH" \
    --max_train_minutes "$MINUTES" --max_train_steps "$STEPS" --checkpointing_steps 5000 --checkpoints_total_limit 2 \
    --eval_steps "$EVAL_STEPS" --eval_num_images "$EVAL_IMAGES" --eval_inference_steps 100 \
    --resume_from_checkpoint latest
  accelerate launch --config_file "$CONFIG" sample.py --model_path "$OUT/$method" --num_images "$EVAL_IMAGES" \
    --num_inference_steps 1000 --output_dir "$OUT/$method/samples" --batch_size 1000
  for mode in clean legacy_tensorflow; do
    python evaluate_fid.py --samples "$OUT/$method/samples" --num_images "$EVAL_IMAGES" --mode "$mode" \
      --output "$OUT/$method/metrics_$mode.json"
  done
done

python - "$OUT" $METHODS <<'PY'
import json, sys
from pathlib import Path
out, methods = Path(sys.argv[1]), sys.argv[2:]
lines = ["| method | steps | training hours | FID clean | FID legacy_tensorflow |", "|---|---|---|---|---|"]
for m in methods:
    recs = [json.loads(l) for l in (out / m / "stats.jsonl").read_text().splitlines()]
    last = max(recs, key=lambda r: r["step"])
    fid = {mode: json.loads((out / m / f"metrics_{mode}.json").read_text()).get("fid") for mode in ("clean", "legacy_tensorflow")}
    lines.append(f"| {m} | {last['step']} | {last['train_seconds'] / 3600:.2f} | {fid['clean']:.2f} | {fid['legacy_tensorflow']:.2f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
