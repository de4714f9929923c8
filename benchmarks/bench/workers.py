"""throughput.py's measurements: one fresh worker process per measurement (clean peak-memory numbers), our loop or
sampler and the reference (the conventional Diffusers-example loop, DDPMPipeline) side by side in rotating order;
inside a worker, warm-up steps, then windows of steps, img/s per window."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from diffusers import DDPMPipeline
from PIL import Image

from adaptive.attention import configure_attention
from adaptive.build import setup
from adaptive.config import parse_train_args, resolve_config
from adaptive.image_sampler import compile_for_sampling, ddpm_sample
from adaptive.loop import optimizer_step
from adaptive.model import build_noise_scheduler, build_unet
from benchmarks.conventional_loop import ConventionalLoop

from .provenance import ROOT

CLI = ["-m", "benchmarks.throughput"]  # runs a worker with --worker KIND (in ROOT: this tree's code)
PROTOCOL_DATA = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg" / "train.zip"

# Ablations: our loop with one of its choices switched back (label -> worker kind + flags), to measure each one's
# effect.
VARIANTS = {
    "train-ours-fp32": ("train-ours", ["--mixed_precision", "no"]),
    "train-ours-sdpa": ("train-ours", ["--attention_impl", "sdpa"]),
    "train-ours-classic": ("train-ours", ["--attention_impl", "classic"]),
    "train-ours-channels_last": ("train-ours", ["--channels_last"]),
}

# CPU batch per preset for the training comparison (ddpm-cifar10's 128 would take minutes per step on a CPU).
CPU_BATCH = {"cpu-tiny16": 128, "cpu-tiny": 128, "ddpm-cifar10": 16}

# Training kinds of the side-by-side comparison. The conventional loop runs as the Diffusers example does by default
# (fp32) or with the example's --mixed_precision bf16; the reference is the fp32 one if measured, else the bf16 one.
TRAIN_KINDS = ("train-ours", "train-ours-compile", "train-conventional", "train-conventional-bf16")
CONVENTIONAL_PRECISION = {"train-conventional": "no", "train-conventional-bf16": "bf16"}


def peak_memory_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS (Linux: KiB)


def timed_windows(step, batch: int, warmup: int, windows: int, window_steps: int, sync) -> tuple[list[float], float]:
    """img/s of each window after warm-up, and the duration of the very first call (includes any compilation)."""
    t0 = time.perf_counter()
    step()
    sync()
    first = time.perf_counter() - t0
    for _ in range(warmup - 1):
        step()
    sync()
    rates = []
    for _ in range(windows):
        t0 = time.perf_counter()
        for _ in range(window_steps):
            step()
        sync()
        rates.append(batch * window_steps / (time.perf_counter() - t0))
    return rates, first


def make_cfg(preset: str, data: Path, batch: int, extra: list[str]):
    """A training config of `preset` on `data` with `batch`, writing to a scratch folder."""
    work = ROOT / "benchmarks" / "_work" / "throughput" / f"{preset}-{os.getpid()}"
    return resolve_config(parse_train_args(["--preset", preset, "--train_data_dir", str(data), "--output_dir", str(work),
                                      "--overwrite_output_dir", "--logger", "none", "--train_batch_size", str(batch),
                                      "--max_train_samples", "4096", *extra]))


def sampling_step(kind: str, cfg, args, compile_: bool):
    """(device, one call) of sampling: ours (sample.py's path) or DDPMPipeline out of the box, same model and steps."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    unet = build_unet(cfg).to(device).eval()
    sched = build_noise_scheduler(cfg)
    if kind != "sample-ours":
        pipe = DDPMPipeline(unet=unet, scheduler=sched).to(device)
        pipe.set_progress_bar_config(disable=True)
        return device, lambda: pipe(batch_size=args.batch, num_inference_steps=args.sample_steps, output_type="np")
    configure_attention(unet, "auto", device.type)  # as sample.py
    if compile_:
        unet = compile_for_sampling(unet)  # as sample.py --compile
    dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else None
    autocast = {"autocast": lambda: torch.autocast(device.type, dtype=dtype)} if dtype else {}
    seeds = iter(range(10**9))
    return device, lambda: ddpm_sample(unet, sched.config, [next(seeds) for _ in range(args.batch)],
                                       args.sample_steps, args.batch, device, **autocast)


def worker(args) -> dict:
    """One measurement in this process; returns img/s windows, peak memory and timings."""
    compile_ = args.worker.endswith("-compile")
    kind = args.worker.removesuffix("-compile")
    precision = CONVENTIONAL_PRECISION.get(kind, "no")
    kind = "train-conventional" if kind in CONVENTIONAL_PRECISION else kind
    cfg = make_cfg(args.preset, args.data, args.batch,
                   args.extra + (["--compile"] if compile_ and kind == "train-ours" else []))
    t_build = time.perf_counter()
    if kind == "train-ours":
        run = setup(cfg, lambda m: None)
        device, batches, counter = run.accelerator.device, run.data.batches(0), iter(range(10**9))
        step = lambda: optimizer_step(run, next(counter), next(batches))  # noqa: E731
    elif kind == "train-conventional":
        loop = ConventionalLoop(cfg, args.data, mixed_precision=precision)
        device, step = loop.accelerator.device, loop.step
    else:
        device, step = sampling_step(kind, cfg, args, compile_)
    t_build = time.perf_counter() - t_build
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rates, first = timed_windows(step, args.batch, args.warmup, args.windows, args.window_steps, sync)
    return {"img_per_s": statistics.median(rates), "windows": rates, "peak_memory_mb": peak_memory_mb(device),
            "build_seconds": t_build, "first_call_seconds": first, "device": str(device),
            "threads": torch.get_num_threads(),
            "mixed_precision": precision if kind in ("train-conventional", "sample-pipeline") else cfg.mixed_precision}


def run_worker(kind: str, preset: str, data: Path, batch: int, args, extra=()) -> dict:
    """One measurement in a fresh `throughput.py --worker` process."""
    warmup = max(args.warmup, 2) if kind.endswith("-compile") else args.warmup
    cmd = [sys.executable, *CLI, "--worker", kind, "--preset", preset, "--data", str(data), "--batch", str(batch),
           "--warmup", str(warmup), "--windows", str(args.windows), "--window_steps", str(args.window_steps),
           "--sample_steps", str(args.sample_steps), "--", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"worker {kind} {preset} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def side_by_side(kinds: list[str], reference: str, preset: str, data: Path, batch: int, args, rounds: int) -> dict:
    """Fresh worker processes of each kind in rotating order, `rounds` times; median img/s of each kind over all its
    windows, and its speed-up over the reference kind."""
    res = {k: [] for k in kinds}
    for r in range(rounds):
        for kind in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
            worker_kind, flags = VARIANTS.get(kind, (kind, []))
            res[kind].append(run_worker(worker_kind, preset, data, batch, args, ours_flags(args, worker_kind) + flags))
    out = {}
    for kind, runs in res.items():
        windows = [w for r in runs for w in r["windows"]]
        out[kind] = {"img_per_s": statistics.median(windows), "windows": windows,
                     "peak_memory_mb": max(r["peak_memory_mb"] for r in runs),
                     "mixed_precision": runs[0]["mixed_precision"],
                     "first_call_seconds": statistics.median(r["first_call_seconds"] for r in runs),
                     "device": runs[0]["device"], "threads": runs[0]["threads"]}
    for kind in kinds:
        out[kind]["speedup"] = out[kind]["img_per_s"] / out[reference]["img_per_s"]
    return out


def ours_flags(args, worker_kind: str) -> list[str]:
    """Training flags every worker of our loop or sampler gets (--mixed_precision); the reference kinds get none."""
    ours = worker_kind.startswith(("train-ours", "sample-ours"))
    return ["--mixed_precision", args.mixed_precision] if ours and getattr(args, "mixed_precision", None) else []


def train_plan(args, preset: str) -> tuple[int, list[str], str]:
    """(batch, kinds, reference kind) of the training comparison of one preset: --train_batch / --train_kinds, else
    the CPU defaults (ours, compiled ours and the conventional loop; no compilation of ddpm-cifar10 or in --quick)."""
    batch = args.train_batch or (8 if args.quick else CPU_BATCH.get(preset, 32))
    kinds = args.train_kinds or (["train-ours", "train-conventional"] if args.quick or preset == "ddpm-cifar10" else
                                 ["train-ours", "train-ours-compile", "train-conventional"])
    reference = next((k for k in CONVENTIONAL_PRECISION if k in kinds), kinds[0])
    return batch, kinds, reference


def memory_table(data: Path, args) -> list[dict]:
    """--memory_preset (ddpm-cifar10): per-device batch x precision x gradient checkpointing -> peak memory and img/s
    (1 step windows)."""
    rows = []
    for batch in args.memory_batches:
        for mp in ("no", "bf16"):
            for ckpt in (False, True):
                extra = ["--mixed_precision", mp] + (["--gradient_checkpointing"] if ckpt else [])
                mini = argparse.Namespace(**{**vars(args), "warmup": 1, "windows": 1, "window_steps": 1})
                r = run_worker("train-ours", args.memory_preset, data, batch, mini, extra)
                rows.append({"batch": batch, "mixed_precision": mp, "gradient_checkpointing": ckpt,
                             "peak_memory_mb": r["peak_memory_mb"], "img_per_s": r["img_per_s"], "device": r["device"]})
    return rows


def generated_data(folder: Path) -> Path:
    """256 random 32 px JPEGs (when the shared CIFAR-10 is absent)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(256):
        p = folder / f"{i:04d}.jpg"
        if not p.exists():
            Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(p, quality=75)
    return folder


def default_data(args_data: Path | None) -> Path:
    """--data, else the shared CIFAR-10, else generated images."""
    return args_data or (PROTOCOL_DATA if PROTOCOL_DATA.exists() else generated_data(ROOT / "benchmarks" / "_work"
                                                                                     / "images"))
