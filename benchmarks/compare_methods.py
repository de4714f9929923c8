#!/usr/bin/env python
"""Equal-cost comparison of timestep methods on the CPU proxy protocol (shared/benchmark/PROTOCOL.md).

    python benchmarks/compare_methods.py --seeds 0 1 2                # full protocol, every method (hours)
    python benchmarks/compare_methods.py --methods uniform adaptive --seeds 0
    python benchmarks/compare_methods.py --quick                      # CI smoke test on generated data (minutes)
    python benchmarks/compare_methods.py --report_only --out docs/benchmarks/methods/2026-11-30

1. Cost: each method's real optimizer step (adaptive.loop.optimizer_step) is timed side by side with uniform in ONE
   process, in interleaved blocks (median of 5 blocks of 40 steps, after warm-up): c_m = time_m / time_uniform.
2. Training: each (method, seed) is a real `train_accelerate.py --preset cpu-tiny16` run for 2000 / c_m steps with the
   in-training proxy-FD evaluation at 500/c_m, 1000/c_m, ... (c_m <= 1.02 counts as 1, as the protocol allows).
   Runs execute in the background `--parallel` at a time (one thread each), checkpoint every 250 steps, and resume
   when the benchmark is started again; finished runs are reused.
3. Report: results.json (every raw number, command, commit, versions, machine), fd_vs_time.png, README.md table.
   Rows of one table must share the code of everything but the methods (a hash of the tracked files outside
   adaptive/timesteps/); rows measured with other code are left out and listed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = ROOT.parent / "shared"
PROTOCOL_DATA = SHARED / "datasets" / "cifar10-jpeg" / "train.zip"
PROTOCOL_FEATURES = SHARED / "eval" / "cifar10-proxy-features.pt"
BUDGET = 2000  # uniform-equivalent optimizer steps
EVAL_POINTS = (500, 1000, 1250, 1500, 1750, 2000)
METHODS = {  # method -> train_accelerate.py flags
    "uniform": [],
    "min_snr": ["--loss_weighting", "min_snr"],
    "p2": ["--loss_weighting", "p2"],
    "iddpm": ["--timestep_sampler", "iddpm"],
    "speed": ["--timestep_sampler", "speed"],
    "edm2_uncertainty": ["--timestep_sampler", "edm2_uncertainty"],
    "kim2025": ["--timestep_sampler", "kim2025"],
    "adaptive": ["--timestep_sampler", "adaptive"],
}
COST_FREE = 1.02  # cost ratios up to this use the uniform step counts (PROTOCOL.md)
CLAIM_SEEDS = (10, 11, 12)  # PROTOCOL.md: run once, on a frozen method; no development run may use them
CALIBRATION_STEPS = 6000  # 32 px calibration: uniform-tuned on seed 0, evaluated every 500 steps
# PROTOCOL.md "Long runs": does a gain last? 6,000 steps; speed-ups to the reference's FD at each of LONG_TARGETS.
LONG_STEPS = 6000
LONG_POINTS = {"16": (500, 1000, 1500, 2000, 3000, 4000, 5000, 6000),
               "32": tuple(range(500, CALIBRATION_STEPS + 1, 500))}  # 32 px: the calibration's points (shared run)
LONG_TARGETS = (2000, 4000, 6000)
# `uniform-tuned` (PROTOCOL.md): the best of this grid on development seed 0 by FD at the budget.
TUNING_GRID = {"learning_rate": (1e-3, 2e-3, 4e-3, 8e-3), "adam_beta2": (0.999, 0.99)}
TUNING_SEED = 0
TIE = 0.01  # FDs at the budget within 1% are a tie in the grid; the earlier transition wins it
TRANSITION_FD = 5.0  # "the transition": the first evaluation whose FD is at or below this (blobs ~10, images ~3)


# The ablation of `adaptive` (docs/adaptive.md), each row the method with parts switched off, cumulative from uniform.
_UNIFORM_T = ["--adaptive_proposal", "uniform", "--no-adaptive_stratified"]
ABLATIONS = {
    "abl-norm-only": ["--timestep_sampler", "adaptive", "--adaptive_balance", "0", "--adaptive_balance_final", "0",
                      *_UNIFORM_T],  # per-step loss normalisation only: configured objective, i.i.d. uniform t
    "abl-balance": ["--timestep_sampler", "adaptive", *_UNIFORM_T],  # + the balance exponent 0.5 -> 0
    "abl-proposal": ["--timestep_sampler", "adaptive", "--no-adaptive_stratified"],  # + the importance proposal
    # (+ stratified draws = the full method: `adaptive`)
    "abl-noclip": ["--timestep_sampler", "adaptive", "--max_grad_norm", "0"],
    "abl-scale0.1": ["--timestep_sampler", "adaptive", "--adaptive_loss_scale", "0.1"],
    "abl-scale0.3": ["--timestep_sampler", "adaptive", "--adaptive_loss_scale", "0.3"],
    "abl-scale1": ["--timestep_sampler", "adaptive", "--adaptive_loss_scale", "1"],
}


def grid_name(lr: float, beta2: float) -> str:
    return f"uniform_lr{lr:g}_b2-{beta2:g}"


def grid_variants() -> dict[str, list[str]]:
    """The uniform-tuned grid as named variants: name -> train_accelerate.py flags."""
    return {grid_name(lr, b2): ["--learning_rate", f"{lr:g}", "--adam_beta2", f"{b2:g}"]
            for lr in TUNING_GRID["learning_rate"] for b2 in TUNING_GRID["adam_beta2"]}


def tuned_flags(tuned: dict | None) -> dict[str, list[str]]:
    """`uniform-tuned` and the loss-weighting baselines at its learning rate (PROTOCOL.md), from a tuning result;
    `adaptive-tuned`: adaptive's defaults on uniform-tuned's optimiser (a user who tuned uniform switches the sampler)."""
    if not tuned:
        return {}
    lr, b2 = f"{tuned['learning_rate']:g}", f"{tuned['adam_beta2']:g}"
    return {"uniform-tuned": ["--learning_rate", lr, "--adam_beta2", b2],
            "min_snr": [*METHODS["min_snr"], "--learning_rate", lr],
            "p2": [*METHODS["p2"], "--learning_rate", lr],
            "adaptive-tuned": [*METHODS["adaptive"], "--learning_rate", lr, "--adam_beta2", b2]}


def variants(tuned: dict | None = None) -> dict[str, tuple[str, list[str]]]:
    """Every runnable name -> (the method whose measured cost ratio it uses, its train_accelerate.py flags)."""
    out = {m: (m, f) for m, f in METHODS.items()}
    out.update({n: ("uniform", f) for n, f in grid_variants().items()})
    out.update({n: ("adaptive", f) for n, f in ABLATIONS.items()})
    cost_of = {"uniform-tuned": "uniform", "adaptive-tuned": "adaptive"}  # the tuned variants' own methods
    out.update({n: (cost_of.get(n, n), f) for n, f in tuned_flags(tuned).items()})
    return out


def order(name: str) -> tuple[int, str]:
    """Sort key: the protocol's method order, variants after their method."""
    base = "uniform" if name.startswith("uniform") else "adaptive" if name.startswith(("abl-", "adaptive")) else name
    return (list(METHODS).index(base) if base in METHODS else len(METHODS), name)


# ------------------------------------------------------------------------------------------------ provenance


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        return ""


def code_hash() -> str:
    """Hash of the code every method shares (working tree): the tracked .py files outside adaptive/timesteps/, tests/
    and benchmarks/ that training uses (adaptive/ and train_accelerate.py), without the method-specific config lines (`adaptive_*`, `speed_*`, `uncertainty_lr`).
    Rows of one table must share it: only the method under test may differ."""
    h = hashlib.sha256()
    for f in sorted(git("ls-files").splitlines()):
        shared = f == "train_accelerate.py" or (f.startswith("adaptive/") and not f.startswith("adaptive/timesteps/"))
        if f.endswith(".py") and shared:
            p = ROOT / f
            if p.exists():
                lines = p.read_text().splitlines()
                if f == "adaptive/config.py":
                    lines = [l for l in lines if not l.strip().startswith(("adaptive_", "speed_", "uncertainty_lr",
                                                                           '"adaptive_'))]
                h.update(f.encode() + b"\0" + "\n".join(lines).encode())
    return h.hexdigest()[:16]


def machine() -> dict:
    model = platform.processor()
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except Exception:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform()}


def versions() -> dict:
    import accelerate
    import diffusers
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "diffusers": diffusers.__version__,
            "accelerate": accelerate.__version__}


# ------------------------------------------------------------------------------------------------ 1. cost ratios


def costs_to_measure(costs: dict | None, methods: list[str], remeasure: list[str]) -> tuple[dict, list[str]]:
    """(the cost ratios to keep, the methods to measure): those of `methods` (and uniform) without a ratio, plus the
    `remeasure` ones. Only these are measured again (side by side with uniform); every kept ratio stays as it is, so
    that finished runs, whose step budgets were planned from it, stay finished."""
    kept = {m: c for m, c in (costs or {}).items() if m not in remeasure}
    needed = sorted(set(methods) | {"uniform"}, key=order)
    return kept, [m for m in needed if m not in kept]


def measure_costs(methods: list[str], data: Path, block_steps: int, blocks: int, warmup: int, threads: int,
                  extra: list[str], clock: str = "wall", preset: str = "cpu-tiny16") -> dict:
    """Median per-step time of each method's real optimizer step over interleaved blocks, relative to uniform.
    clock 'wall': elapsed time; 'cpu': this process's CPU time - with one thread, the step's compute cost without
    the time other processes of a busy machine take from it."""
    import torch

    now = time.perf_counter if clock == "wall" else time.process_time

    torch.set_num_threads(threads)
    from adaptive.config import replace, resolve_config
    from adaptive.losses import DiffusionTables
    from adaptive.build import setup
    from adaptive.loop import optimizer_step
    from adaptive.timesteps import build_sampler
    from train_accelerate import parse_args

    work = ROOT / "benchmarks" / "_work" / "cost"
    base = resolve_config(parse_args(["--preset", preset, "--train_data_dir", str(data), "--output_dir", str(work),
                                      "--overwrite_output_dir", "--logger", "none", *extra]))
    run = setup(base, lambda m: None)
    device = run.accelerator.device
    variants = {}
    for m in methods:
        cfg = resolve_config(parse_args(["--preset", preset, "--train_data_dir", str(data), "--output_dir",
                                         str(work), "--logger", "none", *extra, *METHODS[m]]))
        tables = DiffusionTables.build(run.noise_scheduler.alphas_cumprod, cfg, device)
        variants[m] = (replace(base, **{k: getattr(cfg, k) for k in ("timestep_sampler", "loss_weighting")}), tables,
                       build_sampler(cfg, device, tables))
    batches = run.data.batches(0)
    step = 0

    def timed(m: str, n: int) -> float:
        nonlocal step
        run.cfg, run.tables, run.timesteps = variants[m]
        t0 = now()
        for _ in range(n):
            optimizer_step(run, step, next(batches))
            step += 1
        return (now() - t0) / n

    def block_len(m: str) -> int:  # whole periods of a method's occasional work (kim2025: every 40 steps)
        return max(block_steps, 40) if m == "kim2025" else block_steps

    for m in methods:  # warm-up every method (caches, allocator, first-update costs)
        timed(m, warmup)
    times: dict[str, list[float]] = {m: [] for m in methods}
    for b in range(blocks):
        order = methods if b % 2 == 0 else list(reversed(methods))  # alternate order against drift
        for m in order:
            times[m].append(timed(m, block_len(m)))
    ref = "uniform" if "uniform" in methods else methods[0]
    # ratio per round (blocks of one round ran back to back), then the median: robust to load changes between rounds
    return {m: {"seconds_per_step": statistics.median(v), "blocks": v, "clock": clock, "threads": threads,
                "block_ratios": [a / b for a, b in zip(v, times[ref])],
                "cost_ratio": statistics.median(a / b for a, b in zip(v, times[ref]))} for m, v in times.items()}


# ------------------------------------------------------------------------------------------------ 2. training runs


def run_dir(work: Path, method: str, seed: int) -> Path:
    return work / f"{method}_seed{seed}"


def used_ratio(cost: dict) -> float:
    """The cost ratio a method's budget is divided by: its median ratio if every block measured it more than 2%
    slower than uniform (the order-statistics ~94% confidence interval of the median of 5 blocks excludes 1.02),
    else 1 - the protocol's 'c <= 1.02 may use the uniform step counts', robust to a noisy machine."""
    blocks = cost.get("block_ratios") or [cost.get("cost_ratio", 1.0)]
    return cost.get("cost_ratio", 1.0) if min(blocks) > COST_FREE else 1.0


def plan(method: str, cost_ratio: float, budget: int, points: tuple[int, ...]) -> tuple[int, list[int]]:
    c = max(1.0, cost_ratio)
    return max(1, round(budget / c)), sorted({max(1, round(p / c)) for p in points})


def train_command(method: str, seed: int, out: Path, steps: int, evals: list[int], args) -> list[str]:
    flags = variants(args.tuned)[method][1]
    cmd = [sys.executable, str(ROOT / "train_accelerate.py"), "--preset", args.preset, "--train_data_dir", str(args.data),
           "--output_dir", str(out), "--seed", str(seed), "--logger", "none", "--max_train_steps", str(steps),
           "--eval_at_steps", ",".join(map(str, evals)), "--eval_feature_extractor", str(args.feature_extractor),
           "--checkpointing_steps", str(args.checkpointing_steps), "--checkpoints_total_limit", "1",
           "--save_images_steps", str(max(evals)), "--resume_from_checkpoint", "latest", *args.extra, *flags]
    if args.mode == "wallclock":
        cmd += ["--max_train_minutes", str(args.budget_minutes)]
    return cmd


def read_run(out: Path) -> dict:
    recs = [json.loads(l) for l in (out / "stats.jsonl").read_text().splitlines()] if (out / "stats.jsonl").exists() else []
    evals = [r for r in recs if "proxy_fd" in r or "fid" in r]
    steps = max((r["step"] for r in recs), default=0)
    return {"evals": [{"step": r["step"], "fd": r.get("proxy_fd", r.get("fid")), "train_seconds": r["train_seconds"]}
                      for r in evals], "steps": steps}


RUN_RECORDS = ("stats.jsonl", "provenance.json", "run_info.json")  # what a finished run is skipped and reported from


def keep_finished_run(d: Path, out: Path) -> None:
    """A finished run's records next to the table, as out/runs/<method>_seed<k>.<file> (committed with it), so that a
    lost work folder costs no finished run (restore_finished_run copies them back). A run stopped before its last
    planned evaluation (SIGTERM also exits 0) is not kept."""
    import shutil

    prov = d / "provenance.json"
    if not prov.exists() or not complete({**read_run(d), "eval_steps": json.loads(prov.read_text())["eval_steps"]}):
        return
    (out / "runs").mkdir(parents=True, exist_ok=True)
    for f in RUN_RECORDS:
        if (d / f).is_file():
            shutil.copyfile(d / f, out / "runs" / f"{d.name}.{f}")


def restore_finished_run(d: Path, out: Path) -> bool:
    """Copy a kept run's records back into a work folder that has lost them; True if it did."""
    import shutil

    kept = [out / "runs" / f"{d.name}.{f}" for f in RUN_RECORDS]
    if (d / "stats.jsonl").exists() or not all(k.is_file() for k in kept):
        return False
    d.mkdir(parents=True, exist_ok=True)
    for f, k in zip(RUN_RECORDS, kept):
        shutil.copyfile(k, d / f)
    return True


def run_all(jobs: list[tuple[str, int, list[str], Path]], parallel: int, threads: int, log, on_done=None) -> None:
    """Run the training commands `parallel` at a time; logs go to <run>/benchmark.log; on_done(run folder) after each
    run that exits 0."""
    from adaptive.rundir import run_holds_training

    pending, running = list(jobs), []
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "PYTHONUNBUFFERED": "1"}
    while pending or running:
        while pending and len(running) < parallel:
            name, seed, cmd, out = pending.pop(0)
            out.mkdir(parents=True, exist_ok=True)
            if not run_holds_training(out):  # its provenance.json and log are not a run's: train beside them
                cmd = [*cmd, "--overwrite_output_dir"]
            logf = open(out / "benchmark.log", "a")
            log(f"start {name} seed {seed}: {out}")
            running.append((name, seed, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logf, stderr=subprocess.STDOUT), logf,
                            out))
        time.sleep(2)
        for item in list(running):
            name, seed, proc, logf, out = item
            if proc.poll() is not None:
                logf.close()
                running.remove(item)
                log(f"{'done' if proc.returncode == 0 else f'FAILED ({proc.returncode})'} {name} seed {seed}")
                if proc.returncode == 0 and on_done is not None:
                    on_done(out)


# ------------------------------------------------------------------------------------------------ 3. report


def interpolate_crossing(xs: list[float], ys: list[float], target: float) -> float | None:
    """First x (linear interpolation between points) where y falls to <= target; None if never."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y) if y0 != y else x
    return None


def aggregate(rows: list[dict], budget: int, points: tuple[int, ...], reference: str = "uniform") -> dict:
    """Per method: mean/std FD at each uniform-equivalent point, time to the reference's (uniform's, or
    uniform-tuned's) final FD, speed-up."""
    by_method: dict[str, list[dict]] = {}
    running: dict[str, list[str]] = {}
    for r in rows:
        if complete(r):
            by_method.setdefault(r["method"], []).append(r)
        else:  # a run still in progress (or stopped early) never enters a mean; it is listed as such
            running.setdefault(r["method"], []).append(f"seed {r['seed']} at step {r['steps']}")
    summary = {}
    for m, rs in by_method.items():
        c = rs[0]["cost_ratio_used"]
        curve = []
        for p in points:
            vals = [e["fd"] for r in rs for e in r["evals"] if e["step"] == max(1, round(p / c))]
            if len(vals) == len(rs):
                curve.append({"equiv_step": p, "mean": statistics.fmean(vals),
                              "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals), "values": vals})
        minutes = [statistics.fmean([e["train_seconds"] for r in rs for e in r["evals"] if e["step"] == max(1, round(p["equiv_step"] / c))]) / 60
                   for p in curve]
        summary[m] = {"cost_ratio": rs[0]["cost_ratio"], "cost_ratio_used": c, "seeds": sorted(r["seed"] for r in rs),
                      "curve": curve, "minutes": minutes,
                      "steps_reached": [r["steps"] for r in rs], "running": running.pop(m, [])}
    for m, runs in running.items():
        summary[m] = {"cost_ratio": next(r["cost_ratio"] for r in rows if r["method"] == m),
                      "cost_ratio_used": next(r["cost_ratio_used"] for r in rows if r["method"] == m),
                      "seeds": [], "curve": [], "minutes": [], "steps_reached": [], "running": runs}
    ref = summary.get(reference)
    if ref and ref["curve"] and ref["curve"][-1]["equiv_step"] == budget:
        target = ref["curve"][-1]["mean"]
        final = {r["seed"]: r for r in by_method[reference]}
        for m, s in summary.items():
            xs = [p["equiv_step"] for p in s["curve"]]
            ys = [p["mean"] for p in s["curve"]]
            cross = interpolate_crossing(xs, ys, target)
            s["target_fd"] = target
            s["equiv_steps_to_target"] = cross
            s["speedup"] = budget / cross if cross else None
            # paired by seed: the method's seed-k curve against the reference's seed-k final FD
            s["speedup_by_seed"] = {}
            for r in by_method.get(m, []):
                if r["seed"] in final:
                    c = r["cost_ratio_used"]
                    tgt = next(e["fd"] for e in final[r["seed"]]["evals"] if e["step"] == budget)
                    pts = sorted((e["step"] * c, e["fd"]) for e in r["evals"])
                    x = interpolate_crossing([p[0] for p in pts], [p[1] for p in pts], tgt)
                    s["speedup_by_seed"][r["seed"]] = budget / x if x else None
    return summary


def speedups_at(summary: dict, reference: str, targets: tuple[int, ...]) -> dict:
    """Long runs: per method and target step T, the reference's mean FD at T, the uniform-equivalent step at which
    the method's mean curve first reaches it (linear interpolation) and the speed-up T / that step."""
    ref = summary.get(reference)
    out: dict = {}
    if not ref or not ref["curve"]:
        return out
    ref_fd = {p["equiv_step"]: p["mean"] for p in ref["curve"]}
    for m, s in summary.items():
        xs, ys = [p["equiv_step"] for p in s["curve"]], [p["mean"] for p in s["curve"]]
        for t in targets:
            if t not in ref_fd or not xs:
                continue
            cross = interpolate_crossing(xs, ys, ref_fd[t])
            out.setdefault(m, {})[t] = {"target_fd": ref_fd[t], "equiv_steps_to_target": cross,
                                        "speedup": t / cross if cross else None}
    return out


def complete(row: dict) -> bool:
    """Every planned evaluation of the run is recorded."""
    return {e["step"] for e in row["evals"]} >= set(row.get("eval_steps", ()))


def bar_verdict(summary: dict, max_cost: float = 1.02, min_speedup: float = 2.0, baselines: list[str] | None = None,
                reference: str = "uniform") -> list[str]:
    """The issue's three conditions for `adaptive`, checked on this table (lines for the README); `baselines` are the
    methods it must beat (default: every method of the protocol)."""
    a = summary.get("adaptive")
    if not a or not a["curve"] or "target_fd" not in a:
        return ["Not enough finished runs to check the bar yet."]
    sp = a.get("speedup")
    out = [f"1. speed-up >= {min_speedup:g}x against {reference}: {'yes' if sp and sp >= min_speedup else 'no'} "
           f"({f'{sp:.2f}x' if sp else reference + ' final FD not reached'} on the mean curves)"]
    fa, sa = a["curve"][-1]["mean"], a["curve"][-1]["std"]
    wanted = baselines if baselines is not None else [m for m in METHODS if m != "adaptive"]
    worse, unclear = [], []
    for m, s in sorted(summary.items()):
        if m not in wanted or not s["curve"] or s["curve"][-1]["equiv_step"] != a["curve"][-1]["equiv_step"]:
            continue
        fb, sb = s["curve"][-1]["mean"], s["curve"][-1]["std"]
        if fa >= fb:
            worse.append(f"{m} {fb:.3f}")
        elif min(len(a["seeds"]), len(s["seeds"])) < 2 or fb - fa <= max(sa, sb):
            unclear.append(m)
    finished = [m for m, s in summary.items() if m != "adaptive" and s["curve"]]
    missing = [m for m in wanted if m not in finished]
    out.append(f"2. lower mean FD at the budget than every baseline, by more than the seed spread: "
               f"{'no' if worse or unclear or missing else 'yes'} (adaptive {fa:.3f} +- {sa:.3f}"
               + (f"; not lower than {', '.join(worse)}" if worse else "")
               + (f"; gap within the seed spread or < 2 seeds: {', '.join(unclear)}" if unclear else "")
               + (f"; not finished: {', '.join(missing)}" if missing else "") + ")")
    c = a["cost_ratio"]
    out.append(f"3. per-step cost <= {max_cost:g}: {'yes' if c <= max_cost else 'no'} (measured {c:.3f})")
    return out


def write_plot(summary: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), dpi=110)
    for m, s in sorted(summary.items()):
        if not s["curve"]:
            continue
        xs = [p["equiv_step"] for p in s["curve"]]
        mean = [p["mean"] for p in s["curve"]]
        lo = [min(p["values"]) for p in s["curve"]]
        hi = [max(p["values"]) for p in s["curve"]]
        style = dict(lw=2.5, color="black") if m == "adaptive" else dict(lw=1.3)
        line, = axes[0].plot(xs, mean, marker="o", ms=3, label=f"{m} (c={s['cost_ratio']:.2f})", **style)
        axes[0].fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15)
        axes[1].plot(s["minutes"], mean, marker="o", ms=3, color=line.get_color(), label=m, lw=style["lw"])
    axes[0].set_xlabel("uniform-equivalent optimizer steps (equal cost)")
    axes[1].set_xlabel("training minutes (mean over seeds; noisy machine)")
    for ax in axes:
        ax.set_ylabel("CPU proxy FD (lower is better)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def select_tuned(summary: dict, budget: int) -> dict | None:
    """PROTOCOL.md's uniform-tuned: the grid point with the lowest FD at the budget; FDs within TIE (relative) of the
    best are a tie, won by the earliest transition (first evaluation at FD <= TRANSITION_FD), then the lower FD."""
    finished = {m: s for m, s in summary.items() if m in grid_variants() and s["curve"]
                and s["curve"][-1]["equiv_step"] == budget}
    if len(finished) < len(grid_variants()):
        return None
    best = min(s["curve"][-1]["mean"] for s in finished.values())

    def transition(s):
        return next((p["equiv_step"] for p in s["curve"] if p["mean"] <= TRANSITION_FD), math.inf)

    tied = [m for m, s in finished.items() if s["curve"][-1]["mean"] <= best * (1 + TIE)]
    name = min(tied, key=lambda m: (transition(finished[m]), finished[m]["curve"][-1]["mean"]))
    flags = grid_variants()[name]
    return {"name": name, "learning_rate": float(flags[1]), "adam_beta2": float(flags[3]),
            "fd_at_budget": finished[name]["curve"][-1]["mean"], "tied": sorted(tied),
            "rule": f"lowest FD at the budget; within {TIE:.0%} a tie, won by the first evaluation at FD <= {TRANSITION_FD:g}"}


def write_readme(summary: dict, meta: dict, path: Path, budget: int) -> None:
    quick = " - QUICK SMOKE TEST on generated data, numbers mean nothing" if meta.get("quick") else ""
    ref = meta.get("reference", "uniform")
    kind = {"tune": "uniform-tuned grid (development seed 0)", "claim": "CLAIM table (frozen method, claim seeds)",
            "dev": "development table", "ablation": "ablation of adaptive (development seeds)",
            "calibrate": "32 px calibration", "long": "long runs (development seeds)"}[meta.get("table", "dev")]
    lines = [f"# Timestep methods at equal cost - CPU proxy protocol, {meta.get('preset', 'cpu-tiny16')} - {kind} "
             f"({meta['date']}){quick}", "",
             "CPU proxy FD (not FID) of the EMA model, 1,000 images, 50-step DDPM ancestral sampling, "
             f"`{meta.get('preset', 'cpu-tiny16')}`, budget {budget} uniform-equivalent steps; mean +- std over the "
             f"finished training seeds (of {', '.join(map(str, meta['seeds']))}). Protocol: "
             "`shared/benchmark/PROTOCOL.md`. Raw numbers: `results.json`; plot: `fd_vs_time.png`.", "",
             f"Command: `{meta['command']}`  ", f"Commit: `{meta['git_commit']}` (code hash `{meta['code_hash']}`), "
             f"{meta['machine']['cpu']}, torch {meta['versions']['torch']}, diffusers {meta['versions']['diffusers']}", ""]
    if meta.get("tuned"):
        t = meta["tuned"]
        lines += [f"`uniform-tuned` = uniform with lr {t['learning_rate']:g}, Adam beta2 {t['adam_beta2']:g} "
                  f"(from `{meta.get('tuned_file', 'the tuning table')}`); min_snr and p2 use its lr.", ""]
    lines += ["Only finished runs enter the means; runs still in progress are listed in the last column. Speed-up = "
              f"{ref}'s budget / the uniform-equivalent steps at which the method's mean curve reaches {ref}'s mean "
              "final FD (linear interpolation between evaluation points); per seed = the same, each seed against "
              f"{ref}'s run with that seed.", "",
              f"| method | seeds | FD at budget | steps run | uniform-equivalent steps to {ref}'s final FD | speed-up | "
              "speed-up per seed | cost ratio measured (used) | in progress |",
              "|---|---|---|---|---|---|---|---|---|"]
    for m in sorted(summary, key=lambda k: (summary[k]["curve"][-1]["mean"] if summary[k]["curve"] else math.inf)):
        s = summary[m]
        fd = f"{s['curve'][-1]['mean']:.3f} +- {s['curve'][-1]['std']:.3f}" if s["curve"] and s["curve"][-1]["equiv_step"] == budget else "-"
        cross, speedup = s.get("equiv_steps_to_target"), s.get("speedup")
        per_seed = ", ".join(f"{k}: {f'{v:.2f}x' if v else 'not reached'}" for k, v in s.get("speedup_by_seed", {}).items())
        lines.append(f"| {m} | {len(s['seeds'])} | {fd} | {', '.join(map(str, s['steps_reached'])) or '-'} | "
                     f"{f'{cross:.0f}' if cross else 'not reached'} | {f'{speedup:.2f}x' if speedup else '-'} | "
                     f"{per_seed or '-'} | {s['cost_ratio']:.3f} ({s['cost_ratio_used']:.3f}) | "
                     f"{'; '.join(s.get('running', [])) or '-'} |")
    points = sorted({p["equiv_step"] for s in summary.values() for p in s["curve"]})
    lines += ["", "FD at each evaluation point (uniform-equivalent steps; mean +- std):", "",
              "| method | " + " | ".join(map(str, points)) + " |", "|---|" + "---|" * len(points)]
    for m, s in sorted(summary.items(), key=lambda kv: order(kv[0])):
        cells = {p["equiv_step"]: f"{p['mean']:.2f} +- {p['std']:.2f}" for p in s["curve"]}
        lines.append(f"| {m} | " + " | ".join(cells.get(p, "-") for p in points) + " |")
    if meta.get("table") == "tune":
        sel = meta.get("selected")
        lines += ["", "Selection (PROTOCOL.md): " + (
            f"**{sel['name']}** (lr {sel['learning_rate']:g}, beta2 {sel['adam_beta2']:g}, FD at the budget "
            f"{sel['fd_at_budget']:.3f}; rule: {sel['rule']}; tied: {', '.join(sel['tied'])}) - written to "
            "`uniform_tuned.json`." if sel else "not every grid point has finished yet.")]
    elif meta.get("table") == "long":
        sp = meta.get("speedups_at", {})
        targets = sorted({t for v in sp.values() for t in v}, key=int)
        lines += ["", f"Speed-up to {ref}'s mean FD at each target step T (T / the uniform-equivalent steps at which the "
                  "method's mean curve first reaches that FD; 'not reached' = never within the run):", "",
                  "| method | " + " | ".join(f"T = {t}" for t in targets) + " |", "|---|" + "---|" * len(targets)]
        for m, v in sorted(sp.items(), key=lambda kv: order(kv[0])):
            cells = []
            for t in targets:
                c = v.get(t) or v.get(str(t))
                cells.append("-" if not c else f"{c['speedup']:.2f}x (FD {c['target_fd']:.2f} at step "
                             f"{c['equiv_steps_to_target']:.0f})" if c["speedup"] else f"not reached (FD {c['target_fd']:.2f})")
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
    elif meta.get("table") == "ablation":
        lines += ["", "Rows (flags beyond the default `adaptive`): " + "; ".join(
            f"`{n}`: `{' '.join(f)}`" for n, f in ABLATIONS.items()) + ". What each part buys: docs/adaptive.md."]
    elif "adaptive" in summary:
        lines += ["", f"The bar for `adaptive` (issue: >= 2x against {ref}, best FD at the budget beyond the seed "
                  "spread, <= 2% per step), checked on this table:", "",
                  *bar_verdict(summary, baselines=meta.get("baselines"), reference=ref)]
    if meta.get("excluded"):
        lines += ["", "Left out (measured with other code): " + ", ".join(meta["excluded"])]
    path.write_text("\n".join(lines) + "\n")


# ------------------------------------------------------------------------------------------------ main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--methods", nargs="+", default=None,
                   help=f"methods or variants (default: every method; with --tuned uniform-tuned replaces uniform): "
                        f"{', '.join(METHODS)}, uniform-tuned, adaptive-tuned (adaptive on uniform-tuned's lr and beta2), "
                        f"the grid's uniform_lr<lr>_b2-<beta2>")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--protocol", choices=["16", "32"], default="16",
                   help="16: cpu-tiny16, budget 2000; 32: cpu-tiny, budget B from --calibration (PROTOCOL.md)")
    p.add_argument("--tune_uniform", action="store_true",
                   help="run PROTOCOL.md's lr x beta2 grid for uniform on development seed 0 and select uniform-tuned")
    p.add_argument("--ablation", action="store_true",
                   help="the ablation table of adaptive (uniform, its parts, the clipping interplay; docs/adaptive.md)")
    p.add_argument("--calibrate", action="store_true",
                   help="32 px calibration: uniform-tuned on seed 0 for 6000 steps, evaluated every 500 -> budget B")
    p.add_argument("--long", action="store_true",
                   help="long runs (PROTOCOL.md): 6,000 steps on development seeds, evaluated at 500 ... 6,000; "
                        "speed-ups to the reference's FD at 2,000 / 4,000 / 6,000 (default methods uniform-tuned adaptive)")
    p.add_argument("--tuned", type=Path, default=None, help="uniform_tuned.json of a --tune_uniform table")
    p.add_argument("--calibration", type=Path, default=None, help="calibration.json of a --calibrate run (32 px)")
    p.add_argument("--reference", default=None, help="the baseline speed-ups are against (default uniform-tuned "
                                                     "with --tuned, else uniform)")
    p.add_argument("--claim", action="store_true", help="a claim table: training seeds 10-12 on a committed, "
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
    p.add_argument("--cost_blocks", type=int, default=5)
    p.add_argument("--cost_block_steps", type=int, default=20, help="steps per block (kim2025: 40, its update period)")
    p.add_argument("--costs", type=Path, default=None, help="reuse cost ratios from a results.json")
    p.add_argument("--remeasure", nargs="*", default=[], help="methods whose cost ratio is measured again")
    p.add_argument("--report_only", action="store_true", help="only rebuild the report from finished runs")
    p.add_argument("--quick", action="store_true", help="smoke test on generated data (CI)")
    p.add_argument("extra", nargs="*", help="extra train_accelerate.py flags after --, applied to every run")
    return p.parse_args(argv)


def quick_setup(args) -> None:
    """Generated images and a small TorchScript feature network, a few steps: exercises every stage in minutes."""
    import numpy as np
    import torch
    from PIL import Image

    work = args.work or ROOT / "benchmarks" / "_work" / "quick"
    (work / "data" / "a").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(64):
        img = (rng.random((1, 1, 3)) * 255 + rng.normal(0, 20, (32, 32, 3))).clip(0, 255).astype("uint8")
        Image.fromarray(img).save(work / "data" / "a" / f"{i:03d}.png")

    class Feat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

        def forward(self, x):
            x = torch.nn.functional.interpolate(x / 255.0, size=(16, 16), mode="bilinear", antialias=True)
            return torch.relu(self.conv(x)).mean((2, 3))

    torch.jit.script(Feat()).save(str(work / "feat.pt"))
    args.data, args.feature_extractor = work / "data", work / "feat.pt"
    args.work = work / "runs"
    args.out = args.out or work / "report"
    args.budget_steps = 8
    args.seeds = args.seeds if args.seeds != [0, 1, 2] else [0]
    args.methods = args.methods or ["uniform", "adaptive"]
    args.cost_blocks, args.cost_block_steps = 2, 2
    args.checkpointing_steps = 4
    args.extra = ["--train_batch_size", "16", "--eval_num_images", "32", "--eval_ref_num_images", "64",
                  "--eval_inference_steps", "5", "--num_grid_images", "4", "--ddpm_num_inference_steps", "5",
                  "--lr_warmup_steps", "2", "--logging_steps", "2", *args.extra]


def calibration_budget(curve: list[tuple[int, float]]) -> int:
    """PROTOCOL.md 32 px: the first evaluation step whose FD is within 15% of the last one's, rounded up to a
    multiple of 1,000."""
    final = curve[-1][1]
    first = next(step for step, fd in curve if fd <= 1.15 * final)
    return int(math.ceil(first / 1000) * 1000)


def recheck_points(tuned: dict) -> list[str]:
    """The 2 grid points uniform-tuned is re-checked against at 32 px: its neighbours in lr (same beta2)."""
    lrs = list(TUNING_GRID["learning_rate"])
    i = lrs.index(tuned["learning_rate"])
    near = sorted((j for j in range(len(lrs)) if j != i), key=lambda j: (abs(j - i), j))[:2]
    return [grid_name(lrs[j], tuned["adam_beta2"]) for j in sorted(near)]


def keep_run_logs(rows: list[dict], work: Path, out: Path) -> None:
    """Each finished run's stats.jsonl (losses, gradient norms, per-bin diagnostics, evaluations) next to the table,
    as out/runs/<method>_seed<k>.stats.jsonl: the logs the write-ups cite."""
    import shutil

    for r in rows:
        src = run_dir(work, r["method"], r["seed"]) / "stats.jsonl"
        if complete(r) and src.is_file():
            (out / "runs").mkdir(exist_ok=True)
            shutil.copyfile(src, out / "runs" / f"{r['method']}_seed{r['seed']}.stats.jsonl")


def write_calibration(summary: dict, pl, args, out: Path) -> dict | None:
    """32 px calibration. First invocation: uniform-tuned's 6,000-step curve -> calibration.json with the budget B.
    With --calibration: uniform-tuned's FD at B (from that curve) against its 2 re-check neighbours' -> the 32 px
    uniform_tuned.json (the same selection rule as the 16 px grid)."""
    if not args.calibration:
        s = summary.get("uniform-tuned")
        if not s or not s["curve"] or s["curve"][-1]["equiv_step"] != CALIBRATION_STEPS:
            return None
        curve = [(p["equiv_step"], p["mean"]) for p in s["curve"]]
        result = {"budget": calibration_budget(curve), "curve": curve, "uniform_tuned_16px": pl.tuned,
                  "rule": "first evaluation within 15% of the 6,000-step FD, rounded up to a multiple of 1,000"}
        (out / "calibration.json").write_text(json.dumps(result, indent=1))
        return result
    cal = json.loads(args.calibration.read_text())
    B = cal["budget"]
    fds = {grid_name(pl.tuned["learning_rate"], pl.tuned["adam_beta2"]): dict(cal["curve"])[B]}
    for m in pl.methods:
        s = summary.get(m)
        if not s or not s["curve"] or s["curve"][-1]["equiv_step"] != B:
            return None
        fds[m] = s["curve"][-1]["mean"]
    best = min(fds.values())
    tied = [m for m, v in fds.items() if v <= best * (1 + TIE)]
    name = next(iter(fds)) if next(iter(fds)) in tied else min(tied, key=fds.get)  # a tie keeps the 16 px choice
    flags = grid_variants()[name]
    result = {"name": name, "learning_rate": float(flags[1]), "adam_beta2": float(flags[3]), "fd_at_budget": fds[name],
              "fd_at_budget_by_point": fds, "tied": sorted(tied), "budget": B,
              "rule": f"lowest FD at B among the 16 px choice and its 2 lr neighbours; within {TIE:.0%} the 16 px choice stays"}
    (out / "uniform_tuned.json").write_text(json.dumps(result, indent=1))
    return result


class Plan(argparse.Namespace):
    """What one invocation runs: table kind, preset, methods, seeds, budget, evaluation points, reference."""


def make_plan(args) -> Plan:
    """Resolve the invocation's table from its flags (ConfigError-style messages as ValueError)."""
    pl = Plan(table="dev", preset="cpu-tiny16", tuned=None, reference=args.reference, baselines=None)
    if args.tuned:
        pl.tuned = json.loads(args.tuned.read_text())
    calibration = json.loads(args.calibration.read_text()) if args.calibration else None
    if args.protocol == "32":
        pl.preset = "cpu-tiny"
    seeds, methods = list(args.seeds), args.methods
    if args.tune_uniform:
        pl.table, methods, seeds = "tune", methods or list(grid_variants()), [TUNING_SEED]
        pl.reference = pl.reference or grid_name(2e-3, 0.999)
    elif args.ablation:
        pl.table, methods = "ablation", methods or ["uniform", *ABLATIONS, "adaptive"]
    elif args.calibrate:
        if args.protocol != "32" or not pl.tuned:
            raise ValueError("--calibrate needs --protocol 32 and --tuned (the 16 px uniform_tuned.json)")
        pl.table, seeds = "calibrate", [TUNING_SEED]
        # first the 6,000-step run; once B is known (--calibration), uniform-tuned's lr against its 2 neighbours
        methods = recheck_points(pl.tuned) if calibration else ["uniform-tuned"]
        pl.reference = pl.reference or (methods[0] if calibration else "uniform-tuned")
    elif args.long:
        if not pl.tuned or args.claim:
            raise ValueError("--long needs --tuned (its reference is uniform-tuned) and is a development table "
                             "(never --claim)")
        pl.table, methods = "long", methods or ["uniform-tuned", "adaptive"]
    elif methods is None:
        methods = [m for m in METHODS if not (pl.tuned and m == "uniform")]
        methods = (["uniform-tuned"] if pl.tuned else []) + methods
    known = variants(pl.tuned)
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method {', '.join(unknown)} (give --tuned for uniform-tuned)")
    if args.claim:
        pl.table = "claim"
    claim_seeds = sorted(set(seeds) & set(CLAIM_SEEDS))
    if claim_seeds and not args.claim:
        raise ValueError(f"training seeds {claim_seeds} are the protocol's claim seeds: only a --claim table may use them")
    if args.claim and (set(seeds) != set(CLAIM_SEEDS) or git("status", "--porcelain", "--untracked-files=no")):
        raise ValueError(f"--claim runs seeds {list(CLAIM_SEEDS)} on a committed, clean tree (the frozen method)")
    pl.reference = pl.reference or ("uniform-tuned" if pl.tuned else "uniform")
    if pl.table in ("dev", "claim"):  # what adaptive must beat: the other methods, not its own variants
        pl.baselines = [m for m in methods if m != "adaptive" and not m.startswith("adaptive-")]
    pl.methods, pl.seeds = methods, seeds
    if pl.table == "calibrate" and not calibration:
        pl.budget, pl.points = CALIBRATION_STEPS, tuple(range(500, CALIBRATION_STEPS + 1, 500))
    elif pl.table == "long":
        pl.budget, pl.points = LONG_STEPS, LONG_POINTS[args.protocol]
    elif args.protocol == "32":
        if not calibration:
            raise ValueError("--protocol 32 needs --calibration (the calibration.json of a --calibrate run)")
        B = calibration["budget"]
        pl.budget = args.budget_steps or B
        pl.points = tuple(sorted({B // 4, B // 2, 5 * B // 8, 3 * B // 4, 7 * B // 8, B}))
    else:
        pl.budget = args.budget_steps or BUDGET
        pl.points = tuple(p for p in EVAL_POINTS if p <= pl.budget)
    if args.quick:
        pl.points = (4, 8)
    return pl


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.quick:
        quick_setup(args)
    args.work = args.work or ROOT / "benchmarks" / "_work" / "methods"
    for path, what in ((args.data, "--data"), (args.feature_extractor, "--feature_extractor"), (args.tuned, "--tuned"),
                       (args.calibration, "--calibration")):
        if path is not None and not Path(path).exists():
            print(f"compare_methods.py: error: {what} {path} does not exist", file=sys.stderr)
            return 2
    try:
        pl = make_plan(args)
    except ValueError as e:
        print(f"compare_methods.py: error: {e}", file=sys.stderr)
        return 2
    args.tuned_file, args.tuned, args.preset = args.tuned, pl.tuned, pl.preset
    date = dt.date.today().isoformat()
    out = args.out or ROOT / "docs" / "benchmarks" / "methods" / date
    out.mkdir(parents=True, exist_ok=True)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    log = lambda m: print(f"[{dt.datetime.now():%H:%M:%S}] {m}", flush=True)  # noqa: E731
    known = variants(pl.tuned)
    base = {m: known[m][0] for m in pl.methods}  # the method whose cost ratio a variant uses
    results_file = out / "results.json"
    previous = json.loads(results_file.read_text()) if results_file.exists() else {}
    this_hash = code_hash()

    # 1. Cost ratios (measured once per table unless given; variants use their method's).
    costs_file = out / "costs.json"  # written as soon as measured, so that a restarted benchmark reuses them
    costs = previous.get("costs") if previous.get("code_hash") == this_hash else None
    if costs is None and costs_file.exists() and json.loads(costs_file.read_text()).get("code_hash") == this_hash:
        costs = json.loads(costs_file.read_text())["costs"]
    if args.costs:
        costs = json.loads(args.costs.read_text())["costs"]
    if set(base.values()) == {"uniform"}:  # only uniform's variants (the grid): the same step, nothing to measure
        costs = {"uniform": {"cost_ratio": 1.0, "block_ratios": [1.0], "note": "the reference itself"}, **(costs or {})}
    costs, missing = costs_to_measure(costs, sorted(set(base.values()), key=order), args.remeasure)
    if not args.report_only and missing:
        measure = sorted(set(missing) | {"uniform"}, key=order)  # each ratio is against uniform
        log(f"measuring cost ratios of {', '.join(measure)} ({args.cost_blocks} interleaved blocks of {args.cost_block_steps} steps)")
        fresh = measure_costs(measure, args.data, args.cost_block_steps, args.cost_blocks,
                              warmup=max(2, args.cost_block_steps // 2), threads=args.threads, extra=args.extra,
                              preset=pl.preset)
        costs = {**costs, **{m: fresh[m] for m in missing}}  # ratios already measured are kept as they are
        log("cost ratios: " + ", ".join(f"{m} {c['cost_ratio']:.3f}" for m, c in costs.items()))
        costs_file.write_text(json.dumps({"code_hash": this_hash, "git_commit": git("rev-parse", "HEAD"),
                                          "threads": args.threads, "costs": costs}, indent=1))
    costs = costs or {}

    # 2. Training runs (skipped when finished; resumed when partial).
    jobs = []
    for seed in pl.seeds:  # seed-major: a complete one-seed table first, then two seeds, ...
        for m in pl.methods:
            ratio = used_ratio(costs.get(base[m], {}))
            steps, evals = plan(m, ratio, pl.budget, pl.points)
            d = run_dir(work, m, seed)
            if restore_finished_run(d, out):
                log(f"restored the finished run {d.name} from {out / 'runs'}")
            done = read_run(d)
            if {e["step"] for e in done["evals"]} >= set(evals):
                continue
            if not args.report_only:
                d.mkdir(parents=True, exist_ok=True)
                prov = d / "provenance.json"
                if prov.exists() and json.loads(prov.read_text()).get("code_hash") != this_hash:
                    log(f"warning: {d} was started with other code; it continues, and its row will say so")
                elif not prov.exists():
                    prov.write_text(json.dumps({"code_hash": this_hash, "git_commit": git("rev-parse", "HEAD"),
                                                "cost_ratio": ratio, "planned_steps": steps, "eval_steps": evals}))
            jobs.append((m, seed, train_command(m, seed, d, steps, evals, args), d))
    if jobs and not args.report_only:
        log(f"{len(jobs)} training runs, {args.parallel} at a time")
        run_all(jobs, args.parallel, args.threads, log, on_done=lambda d: keep_finished_run(d, out))

    # 3. Report: rows from this and earlier invocations, if they share the code.
    rows = {(r["method"], r["seed"]): r for r in previous.get("rows", []) if r.get("code_hash") == this_hash}
    excluded = [f"{r['method']}/seed{r['seed']} ({r.get('git_commit', '?')[:8]})" for r in previous.get("rows", [])
                if r.get("code_hash") != this_hash]
    commit = git("rev-parse", "HEAD")
    for m in pl.methods:
        ratio = costs.get(base[m], {}).get("cost_ratio", 1.0)
        steps, evals = plan(m, used_ratio(costs.get(base[m], {})), pl.budget, pl.points)
        for seed in pl.seeds:
            d = run_dir(work, m, seed)
            r = read_run(d)
            if not r["evals"]:
                continue
            info = json.loads((d / "run_info.json").read_text()) if (d / "run_info.json").exists() else {}
            prov = json.loads((d / "provenance.json").read_text()) if (d / "provenance.json").exists() else {}
            rows[(m, seed)] = {"method": m, "seed": seed, "cost_ratio": ratio, "cost_ratio_used": used_ratio(costs.get(base[m], {})),
                               "planned_steps": steps, "eval_steps": evals, **r,
                               "git_commit": prov.get("git_commit", commit), "code_hash": prov.get("code_hash", this_hash),
                               "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
                               "command": " ".join(train_command(m, seed, d, steps, evals, args)),
                               "run_git_commit": info.get("git_commit")}
    for key, r in list(rows.items()):
        if r["code_hash"] != this_hash:
            excluded.append(f"{r['method']}/seed{r['seed']} ({r['git_commit'][:8]})")
            del rows[key]
    row_list = sorted(rows.values(), key=lambda r: (order(r["method"]), r["seed"]))
    summary = aggregate(row_list, pl.budget, pl.points, pl.reference)
    meta = {"date": date, "command": " ".join(["python", "benchmarks/compare_methods.py", *(argv or sys.argv[1:])]),
            "git_commit": commit, "code_hash": this_hash, "machine": machine(), "versions": versions(),
            "seeds": sorted({r["seed"] for r in row_list}), "mode": args.mode, "budget_steps": pl.budget,
            "eval_points": list(pl.points), "preset": pl.preset, "table": pl.table, "reference": pl.reference,
            "baselines": pl.baselines, "tuned": pl.tuned, "tuned_file": str(args.tuned_file) if args.tuned_file else None,
            "excluded": excluded, "protocol": "shared/benchmark/PROTOCOL.md", "quick": args.quick}
    if pl.table == "tune":
        meta["selected"] = select_tuned(summary, pl.budget)
        if meta["selected"]:
            (out / "uniform_tuned.json").write_text(json.dumps(meta["selected"], indent=1))
    if pl.table == "calibrate":
        meta["calibration"] = write_calibration(summary, pl, args, out)
    if pl.table == "long":
        meta["speedups_at"] = speedups_at(summary, pl.reference, LONG_TARGETS)
    results_file.write_text(json.dumps({**meta, "costs": costs, "rows": row_list, "summary": summary}, indent=1))
    keep_run_logs(row_list, work, out)
    if summary:
        write_plot(summary, out / "fd_vs_time.png", f"CPU proxy FD vs cost - {pl.preset} - {date} - seeds {meta['seeds']}")
        write_readme(summary, meta, out / "README.md", pl.budget)
    log(f"report: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
