#!/usr/bin/env python
"""Helpers of benchmarks/gpu_check.sh: fallback data, environment record, training budget, report.

    python benchmarks/gpu_check.py check PRESET PRECISION METHOD...        # one-line error on an unknown value
    python benchmarks/gpu_check.py fallback DIR --preset P --images N   # generated images + a toy feature network
    python benchmarks/gpu_check.py env OUT NAME...                      # env.json: versions, device, git, settings
    python benchmarks/gpu_check.py minutes LEFT_S MAX_MIN RUNS RESERVE_S # training minutes per run that fit
    python benchmarks/gpu_check.py report OUT WORK                      # summary.json, README.md, gpu_check.png

Every number in the report is read from the files the sections wrote (throughput.py's results.json, the training
runs' checkpoints and export records, evaluate_fid.py's metrics.json); a section that failed or ran out of time is
reported as such, never filled in.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from adaptive.config import CHOICES, PRESETS, ConfigError
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]

KINDS = {  # throughput.py kind -> row label of the report
    "train-ours": "ours (eager)",
    "train-ours-compile": "ours (--compile)",
    "train-conventional": "conventional (fp32, the example's default)",
    "train-conventional-bf16": "conventional (--mixed_precision bf16)",
}
REFERENCES = ("train-conventional", "train-conventional-bf16")
FALLBACK_RECORD = "fallback.json"  # written when the data or the feature network were generated


# ------------------------------------------------------------------------------------------------ settings


def check_settings(preset: str, precision: str, methods: list[str]) -> None:
    """ConfigError naming the first unknown PRESET, PRECISION or METHODS value (before anything runs)."""
    from adaptive.timesteps import METHODS  # imports torch (seconds): only the `check` subcommand needs it

    if preset not in PRESETS:
        raise ConfigError(f"PRESET {preset!r} is not one of {', '.join(PRESETS)}")
    if precision not in CHOICES["mixed_precision"]:
        raise ConfigError(f"PRECISION {precision!r} is not one of {', '.join(CHOICES['mixed_precision'])}")
    if not methods:
        raise ConfigError("METHODS is empty")
    for m in methods:
        if m not in METHODS:
            raise ConfigError(f"METHODS: {m!r} is not one of {', '.join(METHODS)}")


# ------------------------------------------------------------------------------------------------ fallback inputs


def write_images(folder: Path, count: int, size: int, seed: int = 0) -> Path:
    """`count` smooth random colour fields with noise (PNG, two class folders): data that only exercises the code."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 1, size)[None, :, None]
    for i in range(count):
        (folder / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        img = (rng.integers(0, 256, (1, 1, 3)) + ramp * rng.integers(-80, 80, (1, 1, 3))
               + rng.normal(0, 10, (size, size, 3)))
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(folder / f"c{i % 2}" / f"{i:05d}.png")
    return folder


def write_toy_features(path: Path) -> Path:
    """A TorchScript feature network [N, 3, H, W] in [0, 255] -> [N, 48]: 4x4 average pools (no learned features)."""
    import warnings

    import torch

    class PooledFeatures(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.adaptive_avg_pool2d(x / 255.0, 4).flatten(1)

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script's deprecation notice
        torch.jit.script(PooledFeatures()).save(str(path))
    return path


def fallback(args) -> int:
    """Generate what is missing (images and/or feature network) and record it in OUT/fallback.json."""
    record = {}
    if args.images:
        size = PRESETS[args.preset]["resolution"]
        record["data"] = str(write_images(args.dir / "images", args.images, size))
        record["data_note"] = f"{args.images} generated {size} px images (random colour fields), not CIFAR-10"
    if args.features:
        record["features"] = str(write_toy_features(args.dir / "toy-features.pt"))
        record["features_note"] = "toy TorchScript network (4x4 average pools), not the CIFAR-10 proxy network"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / FALLBACK_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


# ------------------------------------------------------------------------------------------------ environment


def git(*cmd: str) -> str:
    try:
        return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def environment(names: list[str]) -> dict:
    """Versions, the accelerator, the git commit (and whether the tree was clean) and the script's settings."""
    import accelerate
    import diffusers
    import torch

    cuda = torch.cuda.is_available()
    return {
        "command": os.environ.get("GPU_CHECK_COMMAND", ""),
        "git_commit": git("rev-parse", "HEAD") or "unknown (no git repository)",
        "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "settings": {n: os.environ.get(n, "") for n in names},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version() if cuda else None, "diffusers": diffusers.__version__,
                     "accelerate": accelerate.__version__},
        "device": torch.cuda.get_device_name() if cuda else f"CPU ({platform.processor() or platform.machine()})",
        "cuda_available": cuda,
        "bf16_supported": torch.cuda.is_bf16_supported() if cuda else None,
        "cpu_count": os.cpu_count(),
    }


# ------------------------------------------------------------------------------------------------ training budget


def train_minutes(left_s: float, max_minutes: float, runs: int, reserve_s: float) -> float:
    """Minutes of training per run: MAX_MIN, or less so that `runs` runs plus `reserve_s` (their start-up, export and
    evaluation limits, and the report) fit in the `left_s` seconds before the deadline; at least 0.05 (3 s)."""
    return round(max(0.05, min(max_minutes, (left_s - reserve_s) / runs / 60)), 2)


# ------------------------------------------------------------------------------------------------ report


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def read_sections(out: Path) -> dict[str, dict]:
    """sections.jsonl (name, limit_s, seconds, rc) -> {name: record with a 'status'}; the last record of a name wins."""
    sections = {}
    path = out / "sections.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        rec["status"] = {0: "ok", 124: "time limit", 137: "time limit (killed)"}.get(rec["rc"],
                                                                                     f"failed (exit {rec['rc']})")
        sections[rec["name"]] = rec
    return sections


def throughput_rows(out: Path, preset: str) -> dict[str, dict]:
    """kind -> {img_per_s, peak_memory_mb, first_call_seconds, mixed_precision, batch} from both throughput runs."""
    rows = {}
    for part in ("eager", "compile"):
        res = read_json(out / "throughput" / part / "results.json") or {}
        per_preset = res.get("train", {}).get(preset, {})
        for kind, v in per_preset.items():
            if isinstance(v, dict):
                rows[kind] = {k: v[k] for k in ("img_per_s", "peak_memory_mb", "first_call_seconds", "mixed_precision",
                                                "device")} | {"batch": per_preset["batch"]}
    for ref in REFERENCES:  # speed-ups against each conventional loop measured
        if ref in rows:
            for v in rows.values():
                v[f"vs_{ref.replace('train-', '').replace('-', '_')}"] = v["img_per_s"] / rows[ref]["img_per_s"]
    return rows


def method_row(work: Path, out: Path, method: str) -> dict | None:
    """Steps, training seconds and img/s from the run's final checkpoint; proxy FD from its evaluation."""
    from adaptive.checkpoint import STATE_FILE, list_checkpoints, load_object_state  # imports torch: `report` only

    run = work / "train" / method
    exported = read_json(run / "export.json")
    ckpts = list_checkpoints(run) if run.is_dir() else []
    if not exported or not ckpts:
        return None
    progress = load_object_state(ckpts[-1] / STATE_FILE)["progress"]
    cfg = read_json(run / "config.json") or {}
    metrics = read_json(out / "eval" / method / "metrics.json") or {}
    key = "fid" if "fid" in metrics else "proxy_fd"
    return {"steps": exported["step"], "train_seconds": progress["train_seconds"], "images": progress["images_seen"],
            "img_per_s": progress["images_seen"] / max(progress["train_seconds"], 1e-9),
            "budget_minutes": cfg.get("max_train_minutes"), "batch": cfg.get("train_batch_size"),
            "fd": metrics.get(key), "fd_metric": key, "eval_images": metrics.get("num_images"),
            "eval_steps": metrics.get("num_inference_steps"), "feature_extractor": metrics.get("feature_extractor")}


def summarize(out: Path, work: Path) -> dict:
    env = read_json(out / "env.json") or {}
    settings = env.get("settings", {})
    preset, methods = settings.get("PRESET", "ddpm-cifar10"), settings.get("METHODS", "uniform adaptive").split()
    memory = read_json(out / "memory" / "results.json") or {}
    return {"env": env, "sections": read_sections(out), "fallback": read_json(out / FALLBACK_RECORD),
            "preset": preset, "throughput": throughput_rows(out, preset), "memory": memory.get("memory", []),
            "methods": {m: method_row(work, out, m) for m in methods}}


def fmt(x, digits: int = 1, suffix: str = "") -> str:
    return "-" if x is None else f"{x:.{digits}f}{suffix}"


def section_note(summary: dict, *names: str) -> str:
    """Why a table is empty: the status of the sections that fill it."""
    secs = summary["sections"]
    return "; ".join(f"`{n}`: {secs[n]['status']} after {secs[n]['seconds']} s" if n in secs else f"`{n}`: not run"
                     for n in names)


def missing_kind_reason(summary: dict, kind: str) -> str:
    if kind == "train-ours-compile" and summary["env"].get("settings", {}).get("COMPILE") == "0":
        return "COMPILE=0"
    return section_note(summary, "throughput-compile" if kind.endswith("-compile") else "throughput-eager")


def readme(summary: dict) -> str:
    env, secs, fb = summary["env"], summary["sections"], summary["fallback"]
    s, v = env.get("settings", {}), env.get("versions", {})
    L = [f"# GPU check ({env.get('device', '?')}, preset {summary['preset']})", ""]
    if fb:
        L += ["**WARNING: GENERATED INPUTS - " + "; ".join(fb[k] for k in ("data_note", "features_note") if k in fb)
              + ". The proxy FD below measures nothing about sample quality; it only shows that evaluation runs.**", ""]
    if not env.get("cuda_available"):
        L += ["**Not a GPU run**: CUDA was not available; the numbers are CPU numbers at the sizes set below.", ""]
    L += [f"Command: `{env.get('command', '?')}`; commit `{env.get('git_commit', '?')}`"
          f"{' (uncommitted changes)' if env.get('git_dirty') else ''}; torch {v.get('torch')}, CUDA {v.get('cuda')}, "
          f"cuDNN {v.get('cudnn')}, diffusers {v.get('diffusers')}, accelerate {v.get('accelerate')}, "
          f"python {v.get('python')}. Settings: " + ", ".join(f"`{k}={val}`" for k, val in s.items()) + ". "
          "`nvidia-smi.txt`, `env.json`, `log.txt` and each section's own output are in this folder.", "",
          "| section | limit s | took s | status |", "|---|---|---|---|"]
    L += [f"| {n} | {r['limit_s']} | {r['seconds']} | {r['status']} |" for n, r in secs.items()]

    tp = summary["throughput"]
    L += ["", "## Training throughput: our loop vs the conventional Diffusers-example loop", "",
          "One process, fresh worker per row (`benchmarks/throughput.py --only train`); img/s = median of windows "
          "after warm-up; `--compile`'s one-off compilation is the first-call column, not part of img/s; peak MB = "
          "`torch.cuda.max_memory_allocated` on a GPU (process peak RSS on a CPU).", "",
          "| loop | batch | precision | img/s | vs conventional fp32 | vs conventional bf16 | first call s | peak MB |",
          "|---|---|---|---|---|---|---|---|"]
    for kind, label in KINDS.items():
        r = tp.get(kind)
        L.append(f"| {label} | {r['batch']} | {r['mixed_precision']} | {r['img_per_s']:.1f} | "
                 f"{fmt(r.get('vs_conventional'), 2, 'x')} | {fmt(r.get('vs_conventional_bf16'), 2, 'x')} | "
                 f"{r['first_call_seconds']:.1f} | {r['peak_memory_mb']:.0f} |" if r else
                 f"| {label} | - | - | not measured ({missing_kind_reason(summary, kind)}) | - | - | - | - |")

    L += ["", f"## Peak memory ({summary['preset']}, `throughput.py --only memory`)", ""]
    if summary["memory"]:
        L += ["| batch | precision | gradient checkpointing | peak MB | img/s (1 step) |", "|---|---|---|---|---|"]
        L += [f"| {m['batch']} | {m['mixed_precision']} | {m['gradient_checkpointing']} | {m['peak_memory_mb']:.0f} | "
              f"{m['img_per_s']:.1f} |" for m in summary["memory"]]
    else:
        L.append("Not measured: " + section_note(summary, "memory") + ".")

    L += ["", "## uniform vs adaptive at the same wall-clock training budget", "",
          "`train_accelerate.py --max_train_minutes` per method (evaluation excluded), then the exported EMA pipeline "
          "is sampled (`sample.py`, DDPM ancestral, seeds 0..N-1) and scored (`evaluate_fid.py` against the training "
          "images). img/s = images / training seconds of the whole run (start-up steps included).", "",
          "| method | budget min | steps reached | training s | img/s | FD | images x sampling steps "
          "| feature network |",
          "|---|---|---|---|---|---|---|---|"]
    for m, r in summary["methods"].items():
        if r is None:
            L.append(f"| {m} | - | not trained | - | - | - | - | {section_note(summary, f'train-{m}')} |")
            continue
        label = "FID" if r["fd_metric"] == "fid" else "proxy FD"
        fd = (f"{label} {r['fd']:.3f}" if r["fd"] is not None
              else "not evaluated (" + section_note(summary, f"eval-{m}") + ")")
        L.append(f"| {m} | {fmt(r['budget_minutes'], 2)} | {r['steps']} | {r['train_seconds']:.0f} | "
                 f"{r['img_per_s']:.0f} | {fd} | {r['eval_images']} x {r['eval_steps']} | {r['feature_extractor']} |")
    L += ["", "Training this short is a check that the GPU paths run, not a comparison of the methods: the preset's "
          "learning-rate warm-up is not over and one seed says nothing about the spread."]
    return "\n".join(L) + "\n"


def write_plot(summary: dict, path: Path) -> None:
    """Left: training img/s per loop; right: FD per method (when evaluated)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tp = summary["throughput"]
    fds = {m: r["fd"] for m, r in summary["methods"].items() if r and r["fd"] is not None}
    if not tp and not fds:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    kinds = [k for k in KINDS if k in tp]
    a.bar(range(len(kinds)), [tp[k]["img_per_s"] for k in kinds], color="tab:blue")
    a.set_xticks(range(len(kinds)), [KINDS[k].replace(" (", "\n(") for k in kinds], fontsize=7)
    a.set_ylabel("training img/s")
    b.bar(range(len(fds)), list(fds.values()), color="tab:orange")
    b.set_xticks(range(len(fds)), list(fds))
    b.set_ylabel("FD (lower is better)")
    fig.suptitle(f"GPU check: {summary['env'].get('device', '?')}, {summary['preset']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report(args) -> int:
    summary = summarize(args.out, args.work)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "README.md").write_text(readme(summary))
    write_plot(summary, args.out / "gpu_check.png")
    print((args.out / "README.md").read_text())
    return 0


# ------------------------------------------------------------------------------------------------ CLI


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help="check PRESET, PRECISION and METHODS")
    c.add_argument("preset")
    c.add_argument("precision")
    c.add_argument("methods", nargs="*")
    f = sub.add_parser("fallback", help="generate images and/or a toy feature network")
    f.add_argument("dir", type=Path)
    f.add_argument("--out", type=Path, required=True, help="where fallback.json goes")
    f.add_argument("--preset", default="ddpm-cifar10", help="images are written at its resolution")
    f.add_argument("--images", type=int, default=0, help="how many images to generate (0: none)")
    f.add_argument("--features", action="store_true", help="write a toy TorchScript feature network")
    e = sub.add_parser("env", help="write OUT/env.json")
    e.add_argument("out", type=Path)
    e.add_argument("names", nargs="*", help="environment variables to record as the settings")
    m = sub.add_parser("minutes", help="print the training minutes per run that fit before the deadline")
    m.add_argument("left_s", type=float)
    m.add_argument("max_minutes", type=float)
    m.add_argument("runs", type=int)
    m.add_argument("reserve_s", type=float)
    r = sub.add_parser("report", help="write OUT/summary.json, README.md and gpu_check.png")
    r.add_argument("out", type=Path)
    r.add_argument("work", type=Path)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.command == "check":
        try:
            check_settings(args.preset, args.precision, args.methods)
        except ConfigError as e:
            print(f"gpu_check.sh: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == "fallback":
        return fallback(args)
    if args.command == "env":
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "env.json").write_text(json.dumps(environment(args.names), indent=1) + "\n")
        return 0
    if args.command == "minutes":
        if args.runs < 1 or args.max_minutes <= 0:
            print("gpu_check.py: error: runs must be >= 1 and max minutes > 0", file=sys.stderr)
            return 2
        print(train_minutes(args.left_s, args.max_minutes, args.runs, args.reserve_s))
        return 0
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
