#!/usr/bin/env python
"""Equal-cost comparison of timestep methods on the CPU proxy protocol (shared/benchmark/PROTOCOL.md).

    python benchmarks/compare_methods.py --seeds 0 1 2                # full protocol, every method (hours)
    python benchmarks/compare_methods.py --methods uniform adaptive --seeds 0
    python benchmarks/compare_methods.py --quick                      # CI smoke test on generated data (minutes)
    python benchmarks/compare_methods.py --report_only --out docs/benchmarks/methods/2026-11-30

1. Cost (bench/costs.py): each method's real optimizer step (adaptive.loop.optimizer_step) is timed side by side with
   uniform in ONE process, in interleaved blocks (median of 5 blocks, after warm-up): c_m = time_m / time_uniform.
2. Training (bench/farm.py): each (method, seed) is a real `train_accelerate.py --preset cpu-tiny16` run for
   2000 / c_m steps with the in-training proxy-FD evaluation at 500/c_m, 1000/c_m, ... (c_m <= 1.02 counts as 1, as
   the protocol allows). Runs execute in the background `--parallel` at a time (one thread each), checkpoint every
   250 steps, and resume when the benchmark is started again; finished runs are reused.
3. Report (bench/summary.py, bench/report.py): results.json (every raw number, command, commit, versions, machine),
   fd_vs_time.png, README.md table. Rows of one table must share the code of everything but the methods (a hash of
   the tracked files outside adaptive/timesteps/); rows measured with other code are left out and listed. With
   --report_only and no run of this code, the table is re-rendered from its results.json as it stands.
The methods are the registry's (adaptive/timesteps/registry.py) plus the protocol's baselines and variants
(bench/protocol.py); the table kinds are resolved in bench/plans.py.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from adaptive.config import PRESETS
from benchmarks.bench.costs import cost_ratios
from benchmarks.bench.farm import collect_rows, keep_finished_run, keep_run_logs, pending_jobs, run_all
from benchmarks.bench.plans import make_plan
from benchmarks.bench.protocol import (ABLATIONS, LONG_TARGETS, METHODS, PROTOCOL_DATA, PROTOCOL_FEATURES, order,
                                       variants)
from benchmarks.bench.provenance import code_hash, git, machine, model_of, versions
from benchmarks.bench.quick import quick_setup
from benchmarks.bench.report import render_stored, write_report
from benchmarks.bench.summary import aggregate, select_tuned, speedups_at, write_calibration
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"methods or variants (default: every method; with --tuned uniform-tuned replaces uniform): "
                        f"{', '.join(METHODS)}, uniform-tuned, adaptive-tuned (adaptive on uniform-tuned's lr and "
                        f"beta2), the grid's uniform_lr<lr>_b2-<beta2>")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--protocol", choices=["16", "32"], default="16",
                   help="16: cpu-tiny16, budget 2000; 32: cpu-tiny, budget B from --calibration (PROTOCOL.md)")
    p.add_argument("--preset", default=None, choices=sorted(PRESETS),
                   help="the runs' preset (default cpu-tiny16 at 16 px, cpu-tiny at 32 px; cpu-small: PROTOCOL.md v4's "
                        "quarter-width users' model)")
    p.add_argument("--tune_uniform", action="store_true",
                   help="run PROTOCOL.md's lr x beta2 grid for uniform on development seed 0 and select uniform-tuned")
    p.add_argument("--ablation", action="store_true",
                   help="the ablation table of adaptive (uniform, its parts, the clipping interplay; docs/adaptive.md)")
    p.add_argument("--calibrate", action="store_true",
                   help="32 px calibration: uniform-tuned on seed 0 for 6000 steps, evaluated every 500 -> budget B")
    p.add_argument("--long", action="store_true",
                   help="long runs (PROTOCOL.md): 6,000 steps on development seeds, evaluated at 500 ... 6,000; "
                        "speed-ups to the reference's FD at 2,000 / 4,000 / 6,000 (default methods uniform-tuned "
                        "adaptive)")
    p.add_argument("--tuned", type=Path, default=None, help="uniform_tuned.json of a --tune_uniform table")
    p.add_argument("--calibration", type=Path, default=None, help="calibration.json of a --calibrate run (32 px)")
    p.add_argument("--reference", default=None, help="the baseline speed-ups are against (default uniform-tuned "
                                                     "with --tuned, else uniform)")
    p.add_argument("--claim", action="store_true", help="a claim table: training seeds 13-15 on a committed, "
                                                        "clean tree (the frozen method); refused otherwise")
    p.add_argument("--data", type=Path, default=PROTOCOL_DATA)
    p.add_argument("--feature_extractor", type=Path, default=PROTOCOL_FEATURES)
    p.add_argument("--out", type=Path, default=None, help="report folder (default docs/benchmarks/methods/<date>)")
    p.add_argument("--work", type=Path, default=None, help="run folders (default benchmarks/_work/methods)")
    p.add_argument("--parallel", type=int, default=2, help="training runs at a time (one thread each)")
    p.add_argument("--threads", type=int, default=1, help="threads per training run")
    p.add_argument("--mode", choices=["steps", "wallclock"], default="steps",
                   help="steps: equal cost via measured cost ratios (noisy machines); wallclock: --max_train_minutes")
    p.add_argument("--budget_minutes", type=float, default=20.0, help="wallclock mode: minutes per run")
    p.add_argument("--budget_steps", type=int, default=None, help="default 2000 (16 px) or B (32 px)")
    p.add_argument("--checkpointing_steps", type=int, default=250)
    p.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="no",
                   help="every run's and the cost measurement's precision (PROTOCOL.md v3: no = fp32 on every CPU; "
                        "the presets' bf16 is emulated ~10x slower on a CPU without native bf16)")
    p.add_argument("--cost_blocks", type=int, default=5)
    p.add_argument("--cost_block_steps", type=int, default=20,
                   help="steps per block (at least a method's update period: kim2025's 40)")
    p.add_argument("--costs", type=Path, default=None, help="reuse cost ratios from a results.json")
    p.add_argument("--remeasure", nargs="*", default=[], help="methods whose cost ratio is measured again")
    p.add_argument("--report_only", action="store_true", help="only rebuild the report from finished runs")
    p.add_argument("--quick", action="store_true", help="smoke test on generated data (CI)")
    p.add_argument("extra", nargs="*", help="extra train_accelerate.py flags after --, applied to every run")
    args = p.parse_args(argv)
    args.extra = ["--mixed_precision", args.mixed_precision, *args.extra]  # a flag after -- still overrides it
    args.mixed_precision = last_value(args.extra, "--mixed_precision")  # what the runs get, for results.json
    return args


def last_value(flags: list[str], name: str) -> str | None:
    """The value argparse gives flag `name` in `flags` (the last one wins; `--name v` or `--name=v`)."""
    value = None
    for i, flag in enumerate(flags):
        if flag == name and i + 1 < len(flags):
            value = flags[i + 1]
        elif flag.startswith(name + "="):
            value = flag.split("=", 1)[1]
    return value


def missing_input(args) -> str | None:
    """The first input file flag that names a file that does not exist."""
    for path, what in ((args.data, "--data"), (args.feature_extractor, "--feature_extractor"),
                       (args.tuned, "--tuned"), (args.calibration, "--calibration")):
        if path is not None and not Path(path).exists():
            return f"{what} {path} does not exist"
    return None


def table_meta(args, argv, pl, date: str, this_hash: str, rows: list[dict], excluded: list[str]) -> dict:
    """What results.json and the README say about the table: command, commit, machine, versions, plan."""
    return {"date": date, "command": " ".join(["python", "benchmarks/compare_methods.py", *(argv or sys.argv[1:])]),
            "git_commit": git("rev-parse", "HEAD"), "code_hash": this_hash, "machine": machine(),
            "versions": versions(), "seeds": sorted({r["seed"] for r in rows}), "mode": args.mode,
            "budget_steps": pl.budget, "eval_points": list(pl.points), "preset": pl.preset, "table": pl.table,
            "reference": pl.reference, "baselines": pl.baselines, "tuned": pl.tuned,
            "tuned_file": str(args.tuned_file) if args.tuned_file else None, "excluded": excluded,
            "protocol": "shared/benchmark/PROTOCOL.md", "quick": args.quick, "blob_phase": pl.blob_phase,
            "mixed_precision": args.mixed_precision, "model": model_of(pl.preset, args.extra),
            "ablation_flags": {n: ABLATIONS[n] for n in pl.methods if n in ABLATIONS}}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        quick_setup(args)
    args.work = args.work or ROOT / "benchmarks" / "_work" / "methods"
    try:
        error = missing_input(args)
        pl = make_plan(args) if error is None else None
    except ValueError as e:
        error = str(e)
    if error:
        print(f"compare_methods.py: error: {error}", file=sys.stderr)
        return 2
    args.tuned_file, args.tuned, args.preset = args.tuned, pl.tuned, pl.preset
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "methods" / date
    out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(f"[{dt.datetime.now():%H:%M:%S}] {m}", flush=True)  # noqa: E731
    known = variants(pl.tuned)
    base = {m: known[m][0] for m in pl.methods}  # the method whose cost ratio a variant uses
    results_file = out / "results.json"
    previous = json.loads(results_file.read_text()) if results_file.exists() else {}
    this_hash = code_hash()

    # 1. Cost ratios (measured once per table unless given; variants use their method's).
    costs = cost_ratios(args, pl, sorted(set(base.values()), key=order), previous, out, this_hash, log)

    # 2. Training runs (skipped when finished; resumed when partial).
    jobs = pending_jobs(pl, base, costs, args, out, this_hash, log)
    if jobs and not args.report_only:
        log(f"{len(jobs)} training runs, {args.parallel} at a time")
        run_all(jobs, args.parallel, args.threads, log, on_done=lambda d: keep_finished_run(d, out))

    # 3. Report: rows from this and earlier invocations, if they share the code.
    rows, excluded = collect_rows(pl, base, costs, args, previous, this_hash)
    if args.report_only and not rows and previous.get("summary"):
        render_stored(out)
        log(f"report: {out} (re-rendered from results.json: no run of this code to add to its rows)")
        return 0
    row_list = sorted(rows.values(), key=lambda r: (order(r["method"]), r["seed"]))
    summary = aggregate(row_list, pl.budget, pl.points, pl.reference)
    meta = table_meta(args, argv, pl, date, this_hash, row_list, excluded)
    if pl.table == "tune":
        meta["selected"] = select_tuned(summary, pl.budget)
        if meta["selected"]:
            (out / "uniform_tuned.json").write_text(json.dumps(meta["selected"], indent=1))
    if pl.table == "calibrate":
        meta["calibration"] = write_calibration(summary, pl, args, out)
    if pl.table == "long":
        meta["speedups_at"] = speedups_at(summary, pl.reference, LONG_TARGETS)
    elif pl.table != "tune":  # PROTOCOL.md v4: also the steps to the reference's mean FD at B/2 (steeper, steadier)
        meta["speedups_at"] = speedups_at(summary, pl.reference, (pl.budget // 2,))
    results = {**meta, "costs": costs, "rows": row_list, "summary": summary}
    results_file.write_text(json.dumps(results, indent=1))
    keep_run_logs(row_list, args.work, out)
    write_report(results, out)
    log(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
