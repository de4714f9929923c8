"""Golden runs for the refactor guard (tests/test_golden.py): a short cpu-tiny16 run of every timestep method, then
the sha256 of what training produced - parameters, EMA, optimizer state, timestep-sampler state, logged losses and
the in-training proxy FD.

    python -m tests.helpers.golden_runs DATA FEATURES OUT PRECISION [METHOD ...]  # 1 process; PRECISION: bf16 | no
    accelerate launch --num_processes 2 -m tests.helpers.golden_runs ...         # 2 gloo ranks

All runs share one process group: train() would tear the group down at its end (end_training), so this test driver
replaces end_training by its tracker part and tears the group down once, at the very end. Prints one JSON line
"GOLDEN {...}" on rank 0.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch

from accelerate import Accelerator
from accelerate.state import PartialState
from safetensors.torch import load_file

from adaptive.checkpoint import load_ema_weights
from adaptive.timesteps import METHODS as REGISTERED

import train_accelerate

# past its warm-up within the run; --adaptive_balance 0.5: the default every record was made with (issue 54 set it to
# 0), pinned like --norm_num_groups below - the guard is for the code, not the defaults
EXTRA_FLAGS = {"adaptive": ["--adaptive_warmup_steps", "5", "--adaptive_balance", "0.5"]}
FIRST = ["uniform", "iddpm", "speed", "edm2_uncertainty", "kim2025", "adaptive"]  # the recorded order; new ones after
METHODS = {  # every registered method (and uniform under the two other objectives)
    "uniform": [],
    "min_snr": ["--loss_weighting", "min_snr"],
    "p2": ["--loss_weighting", "p2"],
    **{name: ["--timestep_sampler", name, *EXTRA_FLAGS.get(name, [])]
       for name in sorted(REGISTERED, key=lambda n: (FIRST.index(n) if n in FIRST else len(FIRST), n))
       if name != "uniform"},
}
STEPS = 42  # past kim2025's first policy update (every 40 optimizer steps)


def args(data: str, features: str, out: Path, precision: str) -> list[str]:
    """A few seconds per method: batch 4 x 2 accumulation, 42 steps, an 8-image evaluation at the end."""
    # --norm_num_groups 32: the model every record was made with (cpu-tiny16 before PROTOCOL.md v4 gave it 8 groups);
    # pinned, so that the records of every platform stay valid - the guard is for the code, not the preset.
    return ["--preset", "cpu-tiny16", "--norm_num_groups", "32", "--mixed_precision", precision, "--train_data_dir", data,
            "--output_dir", str(out), "--logger", "none",
            "--max_train_steps", str(STEPS), "--ddpm_num_inference_steps", "4",
            "--train_batch_size", "4", "--gradient_accumulation_steps", "2", "--lr_warmup_steps", "5",
            "--logging_steps", "7", "--checkpointing_steps", "21", "--save_images_steps", "none",
            "--num_grid_images", "2", "--eval_at_steps", str(STEPS), "--eval_num_images", "8",
            "--eval_inference_steps", "4", "--eval_batch_size", "8", "--eval_feature_extractor", features,
            "--eval_ref_num_images", "16", "--cache_dir", str(out.parent / "cache"), "--seed", "3"]


def digest(tensors: dict) -> str:
    """sha256 over names, dtypes, shapes and bytes, in name order (nested dicts flattened with '/')."""
    h = hashlib.sha256()

    def walk(prefix, v):
        if isinstance(v, dict):
            for k in sorted(v, key=str):
                walk(f"{prefix}/{k}", v[k])
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(f"{prefix}/{i}", x)
        elif isinstance(v, torch.Tensor):
            t = v.detach().cpu().contiguous()
            h.update(f"{prefix}:{t.dtype}:{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        else:
            h.update(f"{prefix}={v!r}".encode())

    walk("", tensors)
    return h.hexdigest()[:16]


def summary(tensors: dict) -> float:
    """sum |x| over every floating tensor: a platform-tolerant fingerprint of the same state."""
    total = 0.0
    for v in tensors.values():
        if isinstance(v, torch.Tensor) and v.is_floating_point():
            total += v.double().abs().sum().item()
    return total


def record(out: Path) -> dict:
    """The state of the run's final checkpoint, as hashes and sums."""
    ckpt = out / f"checkpoint-{STEPS}"
    model = load_file(str(ckpt / "model.safetensors"))
    ema = load_ema_weights(ckpt)
    opt = torch.load(ckpt / "optimizer.bin", weights_only=True)["state"]
    opt = {f"{i}/{k}": v for i, s in opt.items() for k, v in s.items()}
    state = torch.load(ckpt / "training_state.pt", weights_only=True)
    recs = [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines()]
    logged = {f"{r['step']}/{k}": torch.tensor(float(r[k])) for r in recs
              for k in ("loss", "grad_norm", "proxy_fd") if k in r}
    return {"model": digest(model), "ema": digest(ema), "optimizer": digest(opt),
            "sampler": digest(state["sampler"]), "logged": digest(logged),
            "sums": {"model": summary(model), "ema": summary(ema), "optimizer": summary(opt),
                     "proxy_fd": next(float(r["proxy_fd"]) for r in recs if "proxy_fd" in r)}}


def main() -> int:
    data, features, root, precision = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4]
    methods = sys.argv[5:] or list(METHODS)
    torch.set_num_threads(1)
    Accelerator.end_training = lambda self: [t.finish() for t in self.trackers]  # one process group for every run
    results = {}
    for name in methods:
        out = root / name
        code = train_accelerate.main([*args(data, features, out, precision), *METHODS[name]])
        assert code == 0, (name, code)
        results[name] = record(out) if PartialState().is_main_process else None
    PartialState().wait_for_everyone()
    if PartialState().is_main_process:
        print("GOLDEN " + json.dumps({"world_size": int(os.environ.get("WORLD_SIZE", "1")), "runs": results}))
    PartialState().destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
