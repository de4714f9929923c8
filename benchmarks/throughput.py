#!/usr/bin/env python
"""Training and sampling throughput: our loop vs the conventional Diffusers-example loop, side by side.

    python benchmarks/throughput.py                      # presets cpu-tiny16 cpu-tiny ddpm-cifar10, sampling, methods
    python benchmarks/throughput.py --quick              # a smoke run (CI)

Each measurement is a fresh worker process (clean peak-memory numbers); ours and the reference alternate
(A B A B ...) so that load changes on a shared machine hit both. Inside a worker: warm-up steps, then windows of
steps, img/s per window, median. Outputs docs/benchmarks/throughput/<date>/{results.json,README.md}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
PROTOCOL_DATA = ROOT.parent / "shared" / "datasets" / "cifar10-jpeg" / "train.zip"

# Ablations: our loop with one of its choices switched back (label -> worker kind + flags), to measure each one's effect.
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
    import torch

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
    from adaptive.config import resolve_config
    from train_accelerate import parse_args

    work = ROOT / "benchmarks" / "_work" / "throughput" / f"{preset}-{os.getpid()}"
    return resolve_config(parse_args(["--preset", preset, "--train_data_dir", str(data), "--output_dir", str(work),
                                      "--overwrite_output_dir", "--logger", "none", "--train_batch_size", str(batch),
                                      "--max_train_samples", "4096", *extra]))


def worker(args) -> dict:
    """One measurement in this process; returns img/s windows, peak memory and timings."""
    import torch

    compile_ = args.worker.endswith("-compile")
    kind = args.worker.removesuffix("-compile")
    precision = CONVENTIONAL_PRECISION.get(kind, "no")
    kind = "train-conventional" if kind in CONVENTIONAL_PRECISION else kind
    cfg = make_cfg(args.preset, args.data, args.batch, args.extra + (["--compile"] if compile_ and kind == "train-ours" else []))
    t_build = time.perf_counter()
    if kind == "train-ours":
        from adaptive.build import setup
        from adaptive.loop import optimizer_step

        run = setup(cfg, lambda m: None)
        device, batches, counter = run.accelerator.device, run.data.batches(0), iter(range(10**9))
        step = lambda: optimizer_step(run, next(counter), next(batches))  # noqa: E731
    elif kind == "train-conventional":
        from conventional_loop import ConventionalLoop

        loop = ConventionalLoop(cfg, args.data, mixed_precision=precision)
        device, step = loop.accelerator.device, loop.step
    else:  # sampling: ours (sample.py's path) vs DDPMPipeline out of the box, same model and steps
        from diffusers import DDPMPipeline

        from adaptive.attention import configure_attention
        from adaptive.model import build_noise_scheduler, build_unet
        from adaptive.image_sampler import compile_for_sampling, ddpm_sample

        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        unet = build_unet(cfg).to(device).eval()
        sched = build_noise_scheduler(cfg)
        if kind == "sample-ours":
            configure_attention(unet, "auto", device.type)  # as sample.py
            if compile_:
                unet = compile_for_sampling(unet)  # as sample.py --compile
            dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else None
            autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else None
            seeds = iter(range(10**9))
            step = lambda: ddpm_sample(unet, sched.config, [next(seeds) for _ in range(args.batch)], args.sample_steps,  # noqa: E731
                                       args.batch, device, **({"autocast": autocast} if autocast else {}))
        else:
            pipe = DDPMPipeline(unet=unet, scheduler=sched).to(device)
            pipe.set_progress_bar_config(disable=True)
            step = lambda: pipe(batch_size=args.batch, num_inference_steps=args.sample_steps, output_type="np")  # noqa: E731
    t_build = time.perf_counter() - t_build
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    rates, first = timed_windows(step, args.batch, args.warmup, args.windows, args.window_steps, sync)
    return {"img_per_s": statistics.median(rates), "windows": rates, "peak_memory_mb": peak_memory_mb(device),
            "build_seconds": t_build, "first_call_seconds": first, "device": str(device),
            "threads": torch.get_num_threads(),
            "mixed_precision": precision if kind in ("train-conventional", "sample-pipeline") else cfg.mixed_precision}


def run_worker(kind: str, preset: str, data: Path, batch: int, args, extra=()) -> dict:
    warmup = max(args.warmup, 2) if kind.endswith("-compile") else args.warmup
    cmd = [sys.executable, __file__, "--worker", kind, "--preset", preset, "--data", str(data), "--batch", str(batch),
           "--warmup", str(warmup), "--windows", str(args.windows), "--window_steps", str(args.window_steps),
           "--sample_steps", str(args.sample_steps), "--", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
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
                     "peak_memory_mb": max(r["peak_memory_mb"] for r in runs), "mixed_precision": runs[0]["mixed_precision"],
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


def write_plot(res: dict, path: Path, ylabel: str = "img/s vs reference (conventional loop / DDPMPipeline = 1)") -> None:
    """Bar chart of every kind's speed-up over its reference (conventional loop / DDPMPipeline), per preset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"train\n{p}\n{k.replace('train-', '')}", v["speedup"]) for p, r in res.get("train", {}).items()
            for k, v in r.items() if isinstance(v, dict)]
    bars += [(f"sample\n{p}\n{k.replace('sample-', '')}", v["speedup"]) for p, r in res.get("sample", {}).items()
             for k, v in r.items() if isinstance(v, dict)]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(bars)), 4.5), dpi=110)
    ax.bar(range(len(bars)), [b[1] for b in bars], color=["tab:gray" if b[1] == 1.0 else "tab:blue" for b in bars])
    ax.set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=7)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(f"Throughput {res['date']} ({res['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def fmt_load(load) -> str:
    return "/".join(f"{x:.1f}" for x in load) if load else "?"


def kept_presets(res: dict, section: str, commit: str) -> str:
    """' (P: commit c, ...)' for the presets of a section kept from an earlier run (`--only` re-measured the others)."""
    per_preset = res.get(section) if isinstance(res.get(section), dict) else {}  # train, sample (not methods, memory)
    kept = [f"{p}: commit `{r['git_commit'][:7]}`" for p, r in per_preset.items()
            if isinstance(r, dict) and r.get("git_commit", commit) != commit]
    return f" ({', '.join(kept)} kept from an earlier run)" if kept else ""


def write_readme(res: dict, path: Path) -> None:
    L = [f"# Throughput ({res['date']}, {res['machine']})", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`; torch {res['versions']['torch']}. "
         "img/s = median over windows after warm-up; the kinds ran in fresh processes in rotating order (so load changes "
         "on this shared machine hit all of them). `-compile` = `--compile` (torch.compile); its one-off compilation is "
         "the 'first call' column, not part of img/s. Peak memory = process peak RSS on the CPU (includes the Python "
         "runtime and the dataset), CUDA max allocated on a GPU. Plot: `throughput.png`. Load average (1/5/15 min) at start "
         f"{fmt_load(res.get('load_average_start'))}, at end {fmt_load(res.get('load_average_end'))} on "
         f"{os.cpu_count()} CPUs.", "",
         *(["Sections measured separately (`--only`): " + "; ".join(
             f"{name}: commit `{v['git_commit'][:7]}`{kept_presets(res, name, v['git_commit'])}, load "
             f"{fmt_load(v.get('load_average_start'))} -> {fmt_load(v.get('load_average_end'))}"
             for name, v in res["sections"].items()), ""]
           if len({v["git_commit"] for v in res.get("sections", {}).values()}) > 1
           or any(v.get("command") != res["command"] for v in res.get("sections", {}).values()) else []),
         *([] if res.get("complete", True) else ["**Partial run**: the sections below are those measured before it "
                                                   "was stopped.", ""]),
         "## Training: our loop vs the conventional Diffusers-example loop", "",
         "| preset | batch | loop | precision | img/s | vs conventional | first call s | peak MB |", "|---|---|---|---|---|---|---|---|"]
    for preset, r in res["train"].items():
        for kind, v in r.items():
            if isinstance(v, dict):
                L.append(f"| {preset} | {r['batch']} | {kind.replace('train-', '')} | {v['mixed_precision']} | "
                         f"{v['img_per_s']:.1f} | {v['speedup']:.2f}x | {v['first_call_seconds']:.1f} | {v['peak_memory_mb']:.0f} |")
    L += ["", "## Sampling: sample.py's path vs `DDPMPipeline(...)()` out of the box (same model, steps, batch)", "",
          "| preset | batch | steps | sampler | precision | img/s | vs pipeline | first call s |", "|---|---|---|---|---|---|---|---|"]
    for preset, r in res["sample"].items():
        for kind, v in r.items():
            if isinstance(v, dict):
                L.append(f"| {preset} | {r['batch']} | {r['steps']} | {kind.replace('sample-', '')} | {v['mixed_precision']} | "
                         f"{v['img_per_s']:.1f} | {v['speedup']:.2f}x | {v['first_call_seconds']:.1f} |")
    if res.get("methods"):
        src = f" (measured by `{res['methods_source']}`, same code)" if res.get("methods_source") else ""
        clock = next(iter(res["methods"].values())).get("clock", "wall")
        L += ["", f"## Per-step cost of each timestep method relative to uniform (cpu-tiny16, one process, interleaved "
                  f"blocks, {'CPU' if clock == 'cpu' else 'wall-clock'} time){src}", "",
              "| method | s/step | cost ratio (median of blocks) | ratio per block |", "|---|---|---|---|"]
        for m, c in res["methods"].items():
            per_block = ", ".join(f"{r:.3f}" for r in c.get("block_ratios", []))
            L.append(f"| {m} | {c['seconds_per_step']:.4f} | {c['cost_ratio']:.3f} | {per_block} |")
    if res.get("memory"):
        L += ["", f"## Memory: {res.get('memory_preset', 'ddpm-cifar10')} on {res['memory'][0]['device']}", "",
              "| batch per device | precision | gradient checkpointing | peak MB | img/s |", "|---|---|---|---|---|"]
        for m in res["memory"]:
            L.append(f"| {m['batch']} | {m['mixed_precision']} | {m['gradient_checkpointing']} | "
                     f"{m['peak_memory_mb']:.0f} | {m['img_per_s']:.2f} |")
    path.write_text("\n".join(L) + "\n")


SECTIONS = ("train", "sample", "methods", "memory")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--presets", nargs="+", default=["cpu-tiny16", "cpu-tiny", "ddpm-cifar10"])
    p.add_argument("--data", type=Path, default=None, help="folder/.zip of images (default: shared CIFAR-10 or generated)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=3, help="rounds of fresh worker processes per kind")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--window_steps", type=int, default=5)
    p.add_argument("--sample_steps", type=int, default=50)
    p.add_argument("--sample_batch", type=int, default=256)
    p.add_argument("--memory_batches", type=int, nargs="*", default=[8, 32])
    p.add_argument("--memory_preset", default="ddpm-cifar10", help="preset of the memory table")
    p.add_argument("--train_batch", type=int, default=None,
                   help="batch of the training comparison (default: per preset, small enough for a CPU)")
    p.add_argument("--train_kinds", nargs="+", choices=TRAIN_KINDS, default=None,
                   help="kinds of the training comparison (default: ours, compiled ours except for ddpm-cifar10, "
                        "conventional fp32); the reference is train-conventional if given, else train-conventional-bf16")
    p.add_argument("--mixed_precision", choices=("no", "fp16", "bf16"), default=None,
                   help="precision of our loop and sampler (default: the preset's); the conventional kinds keep theirs")
    p.add_argument("--no_methods", action="store_true")
    p.add_argument("--only", nargs="+", choices=SECTIONS, default=None,
                   help="measure only these sections and merge them into --out's existing results.json")
    p.add_argument("--report_only", action="store_true", help="rewrite README.md and throughput.png from results.json")
    p.add_argument("--ablations", nargs="*", default=None, metavar="PRESET",
                   help="only the ablation table (each of our choices switched back) for these presets")
    p.add_argument("--costs", type=Path, default=None,
                   help="reuse the method cost ratios of compare_methods.py (its costs.json) if measured on this code")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--preset", default=None, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def ablations(args, data: Path, out: Path, res: dict) -> int:
    """Our training step with each optimisation switched back, side by side with the default: ablations.json/.md."""
    res["ablations"] = {}
    for preset in args.ablations or ["cpu-tiny16", "cpu-tiny"]:
        batch = 8 if args.quick else CPU_BATCH.get(preset, 32)
        print(f"ablations {preset} batch {batch}", flush=True)
        kinds = ["train-ours", *VARIANTS]
        res["ablations"][preset] = {"batch": batch, **side_by_side(kinds, "train-ours", preset, data, batch, args, args.rounds)}
        print("  " + ", ".join(f"{k} {res['ablations'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
    res["load_average_end"] = os.getloadavg()
    (out / "ablations.json").write_text(json.dumps(res, indent=1))
    L = [f"# Ablations of our training step ({res['date']}, {res['machine']})", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`. img/s relative to our default step (bf16 autocast, `--attention_impl "
         "auto`: `matmul_attention` under CPU autocast, NCHW), each variant in fresh processes in rotating order. Load average "
         f"at start {fmt_load(res['load_average_start'])}, at end {fmt_load(res['load_average_end'])} on {os.cpu_count()} CPUs.",
         "", "| preset | batch | variant | flags | img/s | vs default |", "|---|---|---|---|---|---|"]
    for preset, r in res["ablations"].items():
        for kind, v in r.items():
            if isinstance(v, dict):
                flags = " ".join(VARIANTS.get(kind, ("", []))[1]) or "(default)"
                L.append(f"| {preset} | {r['batch']} | {kind.replace('train-', '')} | `{flags}` | {v['img_per_s']:.1f} | {v['speedup']:.2f}x |")
    (out / "ablations.md").write_text("\n".join(L) + "\n")
    write_plot({**res, "train": res["ablations"]}, out / "ablations.png", ylabel="img/s vs our default step (= 1)")
    print(f"report: {out / 'ablations.md'}", flush=True)
    return 0


def generated_data(folder: Path) -> Path:
    import numpy as np
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(256):
        p = folder / f"{i:04d}.jpg"
        if not p.exists():
            Image.fromarray((rng.random((32, 32, 3)) * 255).astype("uint8")).save(p, quality=75)
    return folder


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0
    if args.quick:
        # one round of fresh processes (the rotation over rounds is unit-tested)
        args.presets, args.rounds, args.warmup, args.windows, args.window_steps = ["cpu-tiny16"], 1, 1, 2, 1
        args.sample_steps, args.sample_batch, args.memory_batches, args.no_methods = 3, 8, [], True
    data = args.data or (PROTOCOL_DATA if PROTOCOL_DATA.exists() else generated_data(ROOT / "benchmarks" / "_work" / "images"))
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "throughput" / date
    out.mkdir(parents=True, exist_ok=True)
    import compare_methods as cm

    saved_costs = None
    if args.costs:
        try:
            saved_costs = json.loads(args.costs.read_text())
        except (OSError, ValueError) as e:
            print(f"error: cannot read --costs {args.costs}: {e}", file=sys.stderr)
            return 2
        if saved_costs.get("code_hash") != cm.code_hash():
            print(f"error: {args.costs} was measured on other code; drop --costs to measure again", file=sys.stderr)
            return 2
    command, commit = " ".join(["python", "benchmarks/throughput.py", *(argv or sys.argv[1:])]), cm.git("rev-parse", "HEAD")
    res = {"date": date, "command": command, "git_commit": commit, "machine": cm.machine()["cpu"], "versions": cm.versions(),
           "data": str(data), "train": {}, "sample": {}, "load_average_start": os.getloadavg()}
    if args.report_only:
        res = json.loads((out / "results.json").read_text())
        write_readme(res, out / "README.md")
        write_plot(res, out / "throughput.png")
        return 0
    if args.ablations is not None:
        return ablations(args, data, out, res)
    sections = set(args.only or SECTIONS)
    if args.only and (out / "results.json").exists():  # refresh some sections of an existing run, keep the rest
        res = {**json.loads((out / "results.json").read_text()), "date": date}
    runs = res.setdefault("sections", {})  # when, on what code and under what load each section was measured
    started = {"command": command, "git_commit": commit, "load_average_start": os.getloadavg()}

    def save(complete: bool, section: str | None = None) -> None:  # after every section: an interrupted run keeps it
        res["complete"], res["load_average_end"] = complete, os.getloadavg()
        if section:
            runs[section] = {**started, "load_average_end": os.getloadavg()}
        (out / "results.json").write_text(json.dumps(res, indent=1))
        write_readme(res, out / "README.md")
        write_plot(res, out / "throughput.png")

    for preset in args.presets if "train" in sections else []:
        batch, kinds, reference = train_plan(args, preset)
        print(f"training {preset} batch {batch}: {', '.join(kinds)}", flush=True)
        res["train"][preset] = {"batch": batch, "git_commit": commit, "reference": reference, **side_by_side(
            kinds, reference, preset, data, batch, args, args.rounds)}
        print("  " + ", ".join(f"{k} {res['train'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
        save(False, "train")
    sample_presets = args.presets[:1] if args.quick else [p for p in args.presets if p != "ddpm-cifar10"]
    for preset in sample_presets if "sample" in sections else []:
        print(f"sampling {preset}: ours vs DDPMPipeline", flush=True)
        kinds = ["sample-ours", "sample-ours-compile", "sample-pipeline"] if not args.quick else ["sample-ours", "sample-pipeline"]
        steps = args.sample_steps if preset == "cpu-tiny16" or args.quick else max(1, args.sample_steps // 5)
        res["sample"][preset] = {"batch": args.sample_batch, "steps": steps, "git_commit": commit, **side_by_side(
            kinds, "sample-pipeline", preset, data, args.sample_batch,
            argparse.Namespace(**{**vars(args), "window_steps": 1, "windows": 2, "warmup": 1, "sample_steps": steps}),
            args.rounds)}
        print("  " + ", ".join(f"{k} {res['sample'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
        save(False, "sample")
    if "methods" in sections and saved_costs and not args.no_methods:
        res["methods"], res["methods_source"] = saved_costs["costs"], str(args.costs)
        save(False, "methods")
    elif "methods" in sections and not args.no_methods:
        print("timestep-method overheads (one process, one thread, CPU time, interleaved)", flush=True)
        res["methods"] = cm.measure_costs(list(cm.METHODS), data, block_steps=40, blocks=5, warmup=20, threads=1,
                                          extra=["--max_train_samples", "4096"], clock="cpu")
        res.pop("methods_source", None)
        save(False, "methods")
    if "memory" in sections and args.memory_batches:
        print(f"memory table {args.memory_preset}", flush=True)
        res["memory"], res["memory_preset"] = memory_table(data, args), args.memory_preset
        save(False, "memory")
    save(True)
    print(f"report: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
