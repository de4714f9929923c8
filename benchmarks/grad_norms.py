#!/usr/bin/env python
"""Gradient-norm summary of a method table's runs: how hard `--max_grad_norm` binds, and the loss scale, per phase.

    python benchmarks/grad_norms.py --runs docs/benchmarks/methods/<date>-ablation/runs [--clip 1.0]

Reads every `<method>_seed<k>.stats.jsonl` that `compare_methods.py` keeps next to its table and writes, next to
`runs/`: `grad_norms.json` (per run and phase: mean pre-clip gradient norm, share of logged windows whose mean is
above the clip threshold, last loss scale s and norm per unit scale where the method logs them), `grad_norms.md` (the
table) and `grad_norms.png` (pre-clip gradient norm vs step, the clip threshold dashed). The logged gradient norm is
the mean over a log window (`--logging_steps`) of the pre-clip global norm, so "above the threshold" means clipped on
average over that window.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

PHASES = ((1, 250), (251, 500), (501, 1000), (1001, 2000))


def read_windows(path: Path) -> list[dict]:
    """The training-statistics records of one stats.jsonl (evaluation records and torn lines skipped)."""
    rows = []
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "grad_norm" in r and "step" in r:
            rows.append(r)
    return rows


def phase_summary(rows: list[dict], lo: int, hi: int, clip: float) -> dict | None:
    """Mean logged gradient norm over the windows ending in [lo, hi], the share above `clip`, the last loss scale."""
    w = [r for r in rows if lo <= r["step"] <= hi]
    if not w:
        return None
    out = {"windows": len(w), "grad_norm_mean": sum(r["grad_norm"] for r in w) / len(w),
           "grad_norm_max": max(r["grad_norm"] for r in w),
           "share_above_clip": sum(r["grad_norm"] > clip for r in w) / len(w) if clip > 0 else None}
    for key in ("loss_scale", "unit_grad_norm"):
        if key in w[-1]:
            out[f"{key}_last"] = w[-1][key]
    return out


def summarize(runs: Path, clip: float) -> dict:
    out = {}
    for path in sorted(runs.glob("*.stats.jsonl")):
        name = re.sub(r"\.stats$", "", path.stem)
        rows = read_windows(path)
        out[name] = {f"{lo}-{hi}": phase_summary(rows, lo, hi, clip) for lo, hi in PHASES}
        out[name]["curve"] = [(r["step"], r["grad_norm"]) for r in rows]
    return out


def markdown(summary: dict, clip: float, command: str) -> str:
    L = [f"# Pre-clip gradient norm per phase (clip threshold {clip:g})", "", f"Command: `{command}`", "",
         "Mean of the logged windows (each the mean over `--logging_steps` steps) whose last step lies in the phase; "
         "in brackets the share of windows above the threshold; s = the loss scale at the phase's end (adaptive "
         "variants).", "",
         "| run | " + " | ".join(f"steps {lo}-{hi}" for lo, hi in PHASES) + " |", "|---|" + "---|" * len(PHASES)]
    for name, v in summary.items():
        cells = []
        for lo, hi in PHASES:
            p = v[f"{lo}-{hi}"]
            if p is None:
                cells.append("-")
                continue
            share = f" ({p['share_above_clip']:.0%})" if p["share_above_clip"] is not None else ""
            scale = f", s {p['loss_scale_last']:.3f}" if "loss_scale_last" in p else ""
            cells.append(f"{p['grad_norm_mean']:.2f}{share}{scale}")
        L.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(L) + "\n"


def plot(summary: dict, clip: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, v in summary.items():
        if v["curve"]:
            steps, norms = zip(*v["curve"])
            ax.plot(steps, norms, label=name, lw=1)
    if clip > 0:
        ax.axhline(clip, ls="--", c="k", lw=0.8, label=f"--max_grad_norm {clip:g}")
    ax.set(xlabel="optimizer step", ylabel="pre-clip gradient norm (window mean)", yscale="log")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--runs", type=Path, required=True, help="a table's runs/ folder (<method>_seed<k>.stats.jsonl)")
    p.add_argument("--clip", type=float, default=1.0, help="the runs' --max_grad_norm (default 1, the presets')")
    p.add_argument("--out", type=Path, default=None, help="output folder (default: the folder holding runs/)")
    args = p.parse_args(argv)
    if not args.runs.is_dir() or not any(args.runs.glob("*.stats.jsonl")):
        print(f"grad_norms.py: error: {args.runs} holds no <method>_seed<k>.stats.jsonl", file=sys.stderr)
        return 2
    out = args.out or args.runs.parent
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(args.runs, args.clip)
    command = "python benchmarks/grad_norms.py " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "grad_norms.json").write_text(json.dumps({"clip": args.clip, "command": command, "runs": summary}) + "\n")
    (out / "grad_norms.md").write_text(markdown(summary, args.clip, command))
    plot(summary, args.clip, out / "grad_norms.png")
    print(markdown(summary, args.clip, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
