#!/usr/bin/env python
"""What training runs log, side by side: loss scale, gradient norm per unit scale, p(t) and the loss by timestep bin.

    python benchmarks/run_signals.py --run a16=RUN_A/stats.jsonl --run a32=RUN_B/stats.jsonl \
        --steps 250 500 1000 2000 --out docs/benchmarks/dev/<date>/signals

Each `--run LABEL=PATH` is a run folder or its stats.jsonl; the resolution comes from the config.json beside it, or
is given as `LABEL=PATH@RESOLUTION` (a table's runs/<name>.stats.jsonl keeps no config).
For every run and requested step (the last logged window ending at or before it) it reports the logged loss scale s
and the pre-clip gradient norm per unit scale (methods that log them), the pre-clip gradient norm, the probability
of the highest-noise bin, the share of the training signal spent on t >= 700 (p_b x w_b, and p_b x w_b x L_b: the
share of the weighted loss, with L_b the bin's logged loss), and
the loss of the highest-noise bin in units of the "mean-colour floor" 1 / (H x W): what a prediction whose
per-channel spatial mean is zero, while the noise's is not, adds to the per-pixel MSE (docs/benchmarks/dev/2026-12-02:
the colour-blob phase). The bin's loss also holds an irreducible part that does not scale with 1 / (H x W), so the
value is not a share; in the 16 px runs leaving the blob phase shows as a drop of about one floor unit.

Writes `signals.json`, `signals.md` (the table) and `signals.png` (s, norm per unit scale and the high-noise loss in
floor units against the step; p(t) at the last requested step). Diagnostic only: nothing in training depends on it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.grad_norms import read_windows as read_training_windows
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

HIGH_NOISE_FROM_BIN = 7  # bins of 100 timesteps: 7, 8, 9 are t >= 700


def read_windows(path: Path) -> list[dict]:
    """The training-statistics records of one stats.jsonl that log the loss by timestep bin."""
    return [r for r in read_training_windows(path) if "loss_by_t" in r]


def resolve(spec: str) -> tuple[str, Path, int]:
    """`LABEL=PATH[@RESOLUTION]` -> (label, stats.jsonl, resolution: given, or from the run's config.json)."""
    label, sep, rest = spec.partition("=")
    path, at, given = rest.partition("@")
    if not sep or not label or not path or (at and not given.isdigit()):
        raise ValueError(f"--run {spec!r}: expected LABEL=PATH or LABEL=PATH@RESOLUTION")
    stats = Path(path) / "stats.jsonl" if Path(path).is_dir() else Path(path)
    if not stats.is_file():
        raise ValueError(f"--run {spec!r}: no {stats}")
    if given:
        return label, stats, int(given)
    config = stats.parent / "config.json"
    if not config.is_file():  # a table's runs/<name>.stats.jsonl keeps no config
        raise ValueError(f"--run {spec!r}: no config.json beside {stats.name}: give the resolution as PATH@RESOLUTION")
    return label, stats, int(json.loads(config.read_text())["resolution"])


def signals(row: dict, resolution: int) -> dict:
    """One logged window's signals (see the module docstring)."""
    p, w = row["p_by_t"], row.get("weight_by_t") or [1.0] * len(row["p_by_t"])
    budget = [pb * wb for pb, wb in zip(p, w)]
    weighted = [b * loss for b, loss in zip(budget, row["loss_by_t"])]
    return {"step": row["step"], "loss_scale": row.get("loss_scale"), "unit_grad_norm": row.get("unit_grad_norm"),
            "grad_norm": row["grad_norm"], "p_high": p[-1],
            "signal_share_high": sum(budget[HIGH_NOISE_FROM_BIN:]) / sum(budget),
            "loss_share_high": sum(weighted[HIGH_NOISE_FROM_BIN:]) / sum(weighted),
            "high_loss_in_floors": row["loss_by_t"][-1] * resolution * resolution, "p_by_t": p}


def at_step(rows: list[dict], step: int) -> dict | None:
    """The last window ending at or before `step`, if the run got there."""
    before = [r for r in rows if r["step"] <= step]
    return before[-1] if before and rows[-1]["step"] >= step else None


def summarize(specs: list[str], steps: list[int]) -> dict:
    out = {}
    for spec in specs:
        label, stats, resolution = resolve(spec)
        rows = read_windows(stats)
        picked = {s: at_step(rows, s) for s in steps}
        out[label] = {"stats": str(stats), "resolution": resolution,
                      "at": {str(s): signals(r, resolution) if r else None for s, r in picked.items()},
                      "curve": [signals(r, resolution) for r in rows]}
    return out


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(summary: dict, steps: list[int], command: str) -> str:
    L = ["# Logged training signals, side by side", "", f"Command: `{command}`", "",
         "s = loss scale, |g|/s = pre-clip gradient norm per unit scale, |g| = pre-clip gradient norm (window means); "
         "p(t>=900) = the highest-noise bin's probability; share t>=700 = p x w of bins 7-9 over all bins; "
         "loss share t>=700 = the same for p x w x L (the share of the weighted loss the step trains on); "
         "L(t>=900) x HW = the highest-noise bin's loss in units of the mean-colour floor 1/(H x W).", "",
         "| run | px | step | s | \\|g\\|/s | \\|g\\| | p(t>=900) | share t>=700 | loss share t>=700 "
         "| L(t>=900) x HW |",
         "|---|---|---|---|---|---|---|---|---|---|"]
    for label, run in summary.items():
        for s in steps:
            v = run["at"][str(s)]
            if v is None:
                continue
            L.append(f"| {label} | {run['resolution']} | {v['step']} | {fmt(v['loss_scale'], '.3f')} | "
                     f"{fmt(v['unit_grad_norm'], '.2f')} | {v['grad_norm']:.3f} | {v['p_high']:.3f} | "
                     f"{v['signal_share_high']:.2f} | {v['loss_share_high']:.3f} | {v['high_loss_in_floors']:.2f} |")
    return "\n".join(L) + "\n"


def plot(summary: dict, steps: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    panels = (("loss_scale", "loss scale s"), ("unit_grad_norm", "pre-clip |g| per unit s"),
              ("high_loss_in_floors", "loss at t >= 900 x H x W"))
    for ax, (key, title) in zip(axes.flat, panels):
        for label, run in summary.items():
            pts = [(c["step"], c[key]) for c in run["curve"] if c[key] is not None]
            if pts:
                ax.plot(*zip(*pts), label=label, lw=1)
        ax.set(xlabel="optimizer step", title=title, yscale="log")
    ax = axes.flat[3]
    last = str(steps[-1])
    for label, run in summary.items():
        v = run["at"][last] or (run["curve"][-1] if run["curve"] else None)
        if v:
            centres = [50 + 100 * b for b in range(len(v["p_by_t"]))]
            ax.plot(centres, v["p_by_t"], marker="o", label=f"{label} @ {v['step']}")
    ax.set(xlabel="timestep bin centre", title=f"p(t) at step {last} (or the run's last)")
    for ax in axes.flat:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--run", action="append", required=True, metavar="LABEL=PATH",
                   help="a run folder or its stats.jsonl, with a label, optionally @RESOLUTION (repeat)")
    p.add_argument("--steps", type=int, nargs="+", default=[250, 500, 1000, 2000], help="steps to tabulate")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    args = p.parse_args(argv)
    try:
        summary = summarize(args.run, sorted(args.steps))
    except ValueError as e:
        print(f"run_signals.py: error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/run_signals.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (args.out / "signals.json").write_text(json.dumps({"command": command, "runs": summary}) + "\n")
    (args.out / "signals.md").write_text(markdown(summary, sorted(args.steps), command))
    plot(summary, sorted(args.steps), args.out / "signals.png")
    print(markdown(summary, sorted(args.steps), command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
