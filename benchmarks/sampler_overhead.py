#!/usr/bin/env python
"""What a timestep method adds to the training step: the CPU time of its sampler's own calls (draw, around the
update, observe) inside real optimizer steps, beside the whole step's, for each method and uniform.

    python benchmarks/sampler_overhead.py                          # -> docs/benchmarks/throughput/<date>-sampler
    python benchmarks/sampler_overhead.py --preset cpu-tiny --methods adaptive min_snr edm2_uncertainty
    python benchmarks/sampler_overhead.py --quick                  # a smoke run (CI)

The protocol's cost ratio (bench/costs.py:measure_costs, PROTOCOL.md) times whole steps on the wall clock, which a
shared 2-core host scatters by several percent. This script counts this thread's CPU time (one thread: the step's
compute runs on it) and splits off the part spent in the sampler, so the method's attributable cost ratio
1 + (sampler time - uniform's sampler time) / uniform's step time is not scattered by other processes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

from benchmarks import same_tree
from benchmarks.bench.costs import measure_sampler_time
from benchmarks.bench.protocol import METHODS, order
from benchmarks.bench.provenance import git, machine, versions
from benchmarks.bench.workers import default_data, generated_data

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]
CLAIM_METHODS = ["adaptive", "min_snr", "iddpm", "edm2_uncertainty"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--methods", nargs="+", default=CLAIM_METHODS, choices=sorted(METHODS),
                   help="methods measured beside uniform (default: the 16 px claim table's)")
    p.add_argument("--preset", default="cpu-tiny16", help="the model's preset (the protocol's: cpu-tiny16, cpu-tiny)")
    p.add_argument("--data", type=Path, default=None, help="folder/.zip of images (default: shared CIFAR-10 or "
                                                           "generated)")
    p.add_argument("--blocks", type=int, default=5, help="interleaved blocks per method")
    p.add_argument("--block_steps", type=int, default=40, help="steps per block (at least a method's update period)")
    p.add_argument("--warmup", type=int, default=10, help="steps of each method before the first block")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="a smoke run on generated data (CI)")
    p.add_argument("extra", nargs="*", help="train_accelerate.py flags after --, for every method")
    args = p.parse_args(argv)
    if min(args.blocks, args.block_steps) < 1 or args.warmup < 0:
        p.error("--blocks and --block_steps must be >= 1 and --warmup >= 0")
    return args


def write_readme(res: dict, path: Path) -> None:
    """The table: per method, step and sampler CPU time, the sampler's share, the attributable cost ratio and the
    whole-step ratio measured on the same clock."""
    lines = [f"# What each timestep method adds to a training step ({res['date']})", "",
             f"CPU time of one thread per optimizer step, `{res['preset']}`, {res['blocks']} interleaved blocks of "
             f"{res['block_steps']} real steps per method after {res['warmup']} warm-up steps; medians over blocks. "
             "The sampler's time is its three calls from the step (draw, around the update, observe). Attributable "
             "cost ratio = 1 + (the method's sampler time - uniform's) / uniform's step time. Whole-step ratio = "
             "median over blocks of the method's step time / uniform's in the same round (the protocol's measure, "
             "on this clock). Raw numbers: `results.json`; plot: `overhead.png`.", "",
             f"Command: `{res['command']}`  ", f"Commit: `{res['git_commit']}`, {res['machine']}, "
             f"torch {res['versions'].get('torch', '?')}; load average {res['load_average_start'][0]:.2f} at the "
             f"start, {res['load_average_end'][0]:.2f} at the end", "",
             "| method | step (ms) | sampler (ms) | sampler share | attributable cost ratio | whole-step ratio |",
             "|---|---|---|---|---|---|"]
    for m, r in res["methods"].items():
        lines.append(f"| {m} | {1e3 * r['step_seconds']:.1f} | {1e3 * r['sampler_seconds']:.3f} | "
                     f"{100 * r['sampler_share']:.3f}% | {r['attributable_ratio']:.4f} | {r['step_ratio']:.3f} |")
    path.write_text("\n".join(lines) + "\n")


def write_plot(res: dict, path: Path) -> None:
    """Sampler CPU time per step (bar) and the attributable cost ratio beside the whole-step ratio."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["methods"])
    rows = [res["methods"][m] for m in names]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.bar(names, [1e3 * r["sampler_seconds"] for r in rows], color="tab:blue")
    a.set_ylabel("sampler CPU ms per step")
    a.set_title(f"the sampler's own calls ({res['preset']})")
    x = range(len(names))
    b.scatter(x, [r["attributable_ratio"] for r in rows], label="attributable", zorder=3)
    for i, r in enumerate(rows):
        blocks = [s / u for s, u in zip(r["step_blocks"], res["methods"][res["reference"]]["step_blocks"])]
        b.scatter([i] * len(blocks), blocks, color="tab:gray", s=10, label="whole step, per block" if i == 0 else None)
    b.axhline(1.02, color="black", lw=0.8, ls="--", label="1.02 (PROTOCOL.md)")
    b.set_xticks(list(x), names)
    b.set_ylabel("cost ratio to uniform")
    b.legend(fontsize=8)
    for ax in (a, b):
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        args.blocks, args.block_steps, args.warmup = 2, 2, 1
        args.extra = [*args.extra, "--train_batch_size", "8"]
    quick_data = args.quick and args.data is None
    data = generated_data(ROOT / "benchmarks" / "_work" / "images") if quick_data else default_data(args.data)
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "throughput" / f"{date}-sampler"
    methods = sorted({"uniform", *args.methods}, key=order)
    res = {"date": date, "command": " ".join(["python", "benchmarks/sampler_overhead.py", *(argv or sys.argv[1:])]),
           "git_commit": git("rev-parse", "HEAD"), "machine": machine()["cpu"], "versions": versions(),
           "preset": args.preset, "blocks": args.blocks, "block_steps": args.block_steps, "warmup": args.warmup,
           "reference": "uniform", "load_average_start": os.getloadavg()}
    measured = measure_sampler_time(methods, data, args.block_steps, args.blocks, args.warmup, threads=1,
                                    extra=["--mixed_precision", "no", *args.extra], preset=args.preset)
    res.update(methods=measured, load_average_end=os.getloadavg())
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    write_readme(res, out / "README.md")
    write_plot(res, out / "overhead.png")
    print(f"report: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
