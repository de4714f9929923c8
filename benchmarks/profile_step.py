#!/usr/bin/env python
"""Where the time goes: torch.profiler over our training step (adaptive/loop.py:optimizer_step) and over one
sampling forward of the U-Net (as sample.py runs it), grouped by operator kind.

    python benchmarks/profile_step.py                   # -> docs/benchmarks/throughput/<date>/profile.{json,md}
    python benchmarks/profile_step.py --presets cpu-tiny16 --threads 1

CPU time (process time, not wall clock), so a busy machine changes the totals less than the shares.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity
from torch.profiler import profile as torch_profile

from adaptive.attention import configure_attention
from adaptive.build import setup
from adaptive.config import PRESETS, TrainConfig
from adaptive.loop import optimizer_step
from adaptive.model import build_unet
from benchmarks.bench.provenance import git, machine
from benchmarks.bench.workers import CPU_BATCH, default_data, make_cfg
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]

# operator-name fragments -> group (first match wins); everything else is "other"
GROUPS = [
    ("convolution backward", ("convolution_backward",)),
    ("convolution", ("convolution", "conv2d")),
    ("attention backward", ("attention_for_cpu_backward", "flash_attention_backward", "efficient_attention_backward")),
    ("attention", ("scaled_dot_product", "flash_attention", "efficient_attention", "baddbmm", "softmax")),
    ("linear / matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")),
    ("group norm", ("group_norm",)),
    ("activations", ("silu", "gelu")),
    ("dtype casts and copies", ("aten::copy_", "aten::_to_copy", "aten::to")),
    ("optimizer + EMA", ("Optimizer.step", "_foreach", "lerp")),
    ("elementwise", ("aten::add", "aten::mul", "aten::div", "aten::sub", "aten::pow", "aten::sqrt", "aten::cat")),
]


def group_of(name: str) -> str:
    return next((g for g, keys in GROUPS if any(k in name for k in keys)), "other")


def profile(fn, steps: int) -> dict:
    """Self CPU time per operator group over `steps` calls (after 3 warm-up calls), and CPU seconds per call."""
    for _ in range(3):
        fn()
    t0 = time.process_time()
    for _ in range(steps):
        fn()
    per_call = (time.process_time() - t0) / steps
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
    groups: dict[str, float] = {}
    ops = []
    for e in prof.key_averages():
        groups[group_of(e.key)] = groups.get(group_of(e.key), 0.0) + e.self_cpu_time_total
        ops.append((e.key, e.self_cpu_time_total, e.count))
    total = sum(groups.values()) or 1.0
    top = sorted(ops, key=lambda o: -o[1])[:12]
    return {"cpu_seconds_per_call": per_call,
            "groups": {g: v / total for g, v in sorted(groups.items(), key=lambda kv: -kv[1])},
            "top_ops": [{"op": k, "share": v / total, "calls_per_step": c / steps} for k, v, c in top]}


def training_step(preset: str, batch: int, data: Path):
    """One call = our optimizer step (adaptive/loop.py) on `preset` with `batch`."""
    run = setup(make_cfg(preset, data, batch, []), lambda m: None)
    batches, counter = run.data.batches(0), iter(range(10**9))
    return lambda: optimizer_step(run, next(counter), next(batches))


def sampling_forward(preset: str, batch: int):
    """One call = a no-grad U-Net forward of `batch` images, as sample.py runs it."""
    cfg = TrainConfig(**PRESETS[preset])
    unet = configure_attention(build_unet(cfg).eval(), "auto", "cpu")  # as sample.py
    x, t = torch.randn(batch, 3, cfg.resolution, cfg.resolution), torch.tensor(500)

    def fn():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.mixed_precision == "bf16"):
            unet(x, t)
    return fn


def write_md(res: dict, path: Path) -> None:
    L = [f"# Where the time goes ({res['date']}, {res['machine']})", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`; torch {res['torch']}; {res['threads']} "
         "thread(s). "
         "Self CPU time of each operator group as a share of the profiled total (torch.profiler); CPU s/call = process "
         "time per call without the profiler.", ""]
    for name, r in res["profiles"].items():
        L += [f"## {name}: {r['cpu_seconds_per_call'] * 1e3:.0f} CPU ms per call", "",
              "| group | share |", "|---|---|"]
        L += [f"| {g} | {s:.1%} |" for g, s in r["groups"].items() if s >= 0.005]
        L += ["", "Top operators: " + ", ".join(f"`{o['op']}` {o['share']:.0%} ({o['calls_per_step']:.0f}/call)"
                                                   for o in r["top_ops"][:6]), ""]
    path.write_text("\n".join(L) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--presets", nargs="+", default=["cpu-tiny16", "cpu-tiny"])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--data", type=Path, default=None,
                   help="folder/.zip of images (default: shared CIFAR-10 or generated)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = default_data(args.data)
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "throughput" / date
    out.mkdir(parents=True, exist_ok=True)
    res = {"date": date, "command": " ".join(["python", "benchmarks/profile_step.py", *(argv or sys.argv[1:])]),
           "git_commit": git("rev-parse", "HEAD"), "machine": machine()["cpu"], "torch": torch.__version__,
           "threads": args.threads, "load_average": os.getloadavg(), "profiles": {}}
    for preset in args.presets:
        batch = CPU_BATCH.get(preset, 32)
        step = training_step(preset, batch, data)
        res["profiles"][f"{preset} training step, batch {batch}"] = profile(step, args.steps)
        res["profiles"][f"{preset} sampling forward, batch 256"] = profile(sampling_forward(preset, 256), args.steps)
        print(f"profiled {preset}", flush=True)
    (out / "profile.json").write_text(json.dumps(res, indent=1))
    write_md(res, out / "profile.md")
    print(f"report: {out / 'profile.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
