#!/usr/bin/env python
"""Training and sampling throughput: our loop vs the conventional Diffusers-example loop, side by side.

    python benchmarks/throughput.py                      # presets cpu-tiny16 cpu-tiny ddpm-cifar10, sampling, methods
    python benchmarks/throughput.py --quick              # a smoke run (CI)

Each measurement is a fresh worker process (clean peak-memory numbers); ours and the reference alternate
(A B A B ...) so that load changes on a shared machine hit both. Inside a worker: warm-up steps, then windows of
steps, img/s per window, median. Outputs docs/benchmarks/throughput/<date>/{results.json,README.md}.
Measurements: bench/workers.py; method cost ratios: bench/costs.py; report: bench/throughput_report.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path


from benchmarks.bench import workers
from benchmarks.bench.costs import measure_costs
from benchmarks.bench.protocol import METHODS
from benchmarks.bench.provenance import code_hash, git, machine, versions
from benchmarks.bench.throughput_report import write_ablations, write_plot, write_readme
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]

SECTIONS = ("train", "sample", "methods", "memory")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--presets", nargs="+", default=["cpu-tiny16", "cpu-tiny", "ddpm-cifar10"])
    p.add_argument("--data", type=Path, default=None,
                   help="folder/.zip of images (default: shared CIFAR-10 or generated)")
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
    p.add_argument("--train_kinds", nargs="+", choices=workers.TRAIN_KINDS, default=None,
                   help="kinds of the training comparison (default: ours, compiled ours except for ddpm-cifar10, "
                        "conventional fp32); the reference is train-conventional if given, else "
                        "train-conventional-bf16")
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
        batch = 8 if args.quick else workers.CPU_BATCH.get(preset, 32)
        print(f"ablations {preset} batch {batch}", flush=True)
        kinds = ["train-ours", *workers.VARIANTS]
        res["ablations"][preset] = {"batch": batch, **workers.side_by_side(kinds, "train-ours", preset, data, batch,
                                                                           args, args.rounds)}
        print("  " + ", ".join(f"{k} {res['ablations'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
    res["load_average_end"] = os.getloadavg()
    (out / "ablations.json").write_text(json.dumps(res, indent=1))
    write_ablations(res, out)
    print(f"report: {out / 'ablations.md'}", flush=True)
    return 0


def read_costs(path: Path | None) -> tuple[dict | None, str | None]:
    """(--costs' cost ratios, an error): they are reused only if measured on this code."""
    if path is None:
        return None, None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"cannot read --costs {path}: {e}"
    if saved.get("code_hash") != code_hash():
        return None, f"{path} was measured on other code; drop --costs to measure again"
    return saved, None


def measure_sections(args, sections: set, data: Path, res: dict, saved_costs: dict | None, commit: str, save) -> None:
    """Training and sampling side by side, the method cost ratios and the memory table; saved after each."""
    for preset in args.presets if "train" in sections else []:
        batch, kinds, reference = workers.train_plan(args, preset)
        print(f"training {preset} batch {batch}: {', '.join(kinds)}", flush=True)
        res["train"][preset] = {"batch": batch, "git_commit": commit, "reference": reference, **workers.side_by_side(
            kinds, reference, preset, data, batch, args, args.rounds)}
        print("  " + ", ".join(f"{k} {res['train'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
        save(False, "train")
    sample_presets = args.presets[:1] if args.quick else [p for p in args.presets if p != "ddpm-cifar10"]
    for preset in sample_presets if "sample" in sections else []:
        print(f"sampling {preset}: ours vs DDPMPipeline", flush=True)
        kinds = ["sample-ours", "sample-pipeline"] if args.quick else ["sample-ours", "sample-ours-compile",
                                                                       "sample-pipeline"]
        steps = args.sample_steps if preset == "cpu-tiny16" or args.quick else max(1, args.sample_steps // 5)
        short = argparse.Namespace(**{**vars(args), "window_steps": 1, "windows": 2, "warmup": 1,
                                      "sample_steps": steps})
        res["sample"][preset] = {"batch": args.sample_batch, "steps": steps, "git_commit": commit,
                                 **workers.side_by_side(kinds, "sample-pipeline", preset, data, args.sample_batch,
                                                        short, args.rounds)}
        print("  " + ", ".join(f"{k} {res['sample'][preset][k]['speedup']:.2f}x" for k in kinds), flush=True)
        save(False, "sample")
    if "methods" in sections and saved_costs and not args.no_methods:
        res["methods"], res["methods_source"] = saved_costs["costs"], str(args.costs)
        save(False, "methods")
    elif "methods" in sections and not args.no_methods:
        print("timestep-method overheads (one process, one thread, CPU time, interleaved)", flush=True)
        res["methods"] = measure_costs(list(METHODS), data, block_steps=40, blocks=5, warmup=20, threads=1,
                                       extra=["--max_train_samples", "4096"], clock="cpu")
        res.pop("methods_source", None)
        save(False, "methods")
    if "memory" in sections and args.memory_batches:
        print(f"memory table {args.memory_preset}", flush=True)
        res["memory"], res["memory_preset"] = workers.memory_table(data, args), args.memory_preset
        save(False, "memory")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print("RESULT " + json.dumps(workers.worker(args)), flush=True)
        return 0
    if args.quick:
        # one round of fresh processes (the rotation over rounds is unit-tested)
        args.presets, args.rounds, args.warmup, args.windows, args.window_steps = ["cpu-tiny16"], 1, 1, 2, 1
        args.sample_steps, args.sample_batch, args.memory_batches, args.no_methods = 3, 8, [], True
    data = workers.default_data(args.data)
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "throughput" / date
    out.mkdir(parents=True, exist_ok=True)
    saved_costs, error = read_costs(args.costs)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = " ".join(["python", "benchmarks/throughput.py", *(argv or sys.argv[1:])])
    commit = git("rev-parse", "HEAD")
    res = {"date": date, "command": command, "git_commit": commit, "machine": machine()["cpu"], "versions": versions(),
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

    measure_sections(args, sections, data, res, saved_costs, commit, save)
    save(True)
    print(f"report: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
