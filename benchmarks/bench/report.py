"""The report of a methods table: README.md (the tables, the bar for the method under test) and fd_vs_time.png,
from the summary and the table's meta; `render_stored` re-renders both from a results.json as it stands."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .protocol import ABLATIONS_BEFORE_54, METHODS, TRANSITION_FD, UNDER_TEST, order

KINDS = {"tune": "uniform-tuned grid (development seed 0)", "claim": "CLAIM table (frozen method, claim seeds)",
         "dev": "development table", "ablation": f"ablation of {UNDER_TEST} (development seeds)",
         "calibrate": "32 px calibration", "long": "long runs (development seeds)"}


def bar_verdict(summary: dict, max_cost: float = 1.02, min_speedup: float = 2.0, baselines: list[str] | None = None,
                reference: str = "uniform", blob_phase: bool = False) -> list[str]:
    """The issue's three conditions for the method under test, checked on this table (lines for the README);
    `baselines` are the methods it must beat (default: every method of the protocol); in a blob-phase table the
    speed-up is the one in leaving the blob phase (a lower bound while the reference has not left it)."""
    a = summary.get(UNDER_TEST)
    if not a or not a["curve"] or "target_fd" not in a:
        return ["Not enough finished runs to check the bar yet."]
    if blob_phase:
        sp, bound = a.get("exit_speedup"), a.get("exit_speedup_is_lower_bound")
        how = (f"{'at least ' if bound else ''}{sp:.2f}x in leaving the blob phase: step {a['exit_step']:.0f}"
               + (f", {reference} had not left it by the budget" if bound else "") if sp
               else f"{UNDER_TEST} has not left the blob phase by the budget")
    else:
        sp = a.get("speedup")
        how = f"{f'{sp:.2f}x' if sp else reference + ' final FD not reached'} on the mean curves"
    out = [f"1. speed-up >= {min_speedup:g}x against {reference}: {'yes' if sp and sp >= min_speedup else 'no'} "
           f"({how})"]
    fa, sa = a["curve"][-1]["mean"], a["curve"][-1]["std"]
    wanted = baselines if baselines is not None else [m for m in METHODS if m != UNDER_TEST]
    worse, unclear = [], []
    for m, s in sorted(summary.items()):
        if m not in wanted or not s["curve"] or s["curve"][-1]["equiv_step"] != a["curve"][-1]["equiv_step"]:
            continue
        fb, sb = s["curve"][-1]["mean"], s["curve"][-1]["std"]
        if fa >= fb:
            worse.append(f"{m} {fb:.3f}")
        elif min(len(a["seeds"]), len(s["seeds"])) < 2 or fb - fa <= max(sa, sb):
            unclear.append(m)
    finished = [m for m, s in summary.items() if m != UNDER_TEST and s["curve"]]
    missing = [m for m in wanted if m not in finished]
    out.append(f"2. lower mean FD at the budget than every baseline, by more than the seed spread: "
               f"{'no' if worse or unclear or missing else 'yes'} ({UNDER_TEST} {fa:.3f} +- {sa:.3f}"
               + (f"; not lower than {', '.join(worse)}" if worse else "")
               + (f"; gap within the seed spread or < 2 seeds: {', '.join(unclear)}" if unclear else "")
               + (f"; not finished: {', '.join(missing)}" if missing else "") + ")")
    c = a["cost_ratio"]
    out.append(f"3. per-step cost <= {max_cost:g}: {'yes' if c <= max_cost else 'no'} (measured {c:.3f})")
    return out


def plot_title(meta: dict) -> str:
    return f"CPU proxy FD vs cost - {meta.get('preset', 'cpu-tiny16')} - {meta['date']} - seeds {meta['seeds']}"


def write_plot(summary: dict, path: Path, title: str) -> None:
    """FD against uniform-equivalent steps (seed range shaded) and against training minutes."""
    import matplotlib  # slow import (seconds): only when a plot is written

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
        style = dict(lw=2.5, color="black") if m == UNDER_TEST else dict(lw=1.3)
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


def header(meta: dict, budget: int) -> list[str]:
    """Title, protocol, command and provenance, the tuned optimiser."""
    quick = " - QUICK SMOKE TEST on generated data, numbers mean nothing" if meta.get("quick") else ""
    preset = meta.get("preset", "cpu-tiny16")
    lines = [f"# Timestep methods at equal cost - CPU proxy protocol, {preset} - {KINDS[meta.get('table', 'dev')]} "
             f"({meta['date']}){quick}", "",
             "CPU proxy FD (not FID) of the EMA model, 1,000 images, 50-step DDPM ancestral sampling, "
             f"`{preset}`, budget {budget} uniform-equivalent steps; mean +- std over the "
             f"finished training seeds (of {', '.join(map(str, meta['seeds']))}). Protocol: "
             "`shared/benchmark/PROTOCOL.md`. Raw numbers: `results.json`; plot: `fd_vs_time.png`.", "",
             f"Command: `{meta['command']}`  ", f"Commit: `{meta['git_commit']}` (code hash `{meta['code_hash']}`), "
             f"{meta['machine']['cpu']}, torch {meta['versions']['torch']}, diffusers {meta['versions']['diffusers']}",
             ""]
    if meta.get("tuned"):
        t = meta["tuned"]
        lines += [f"`uniform-tuned` = uniform with lr {t['learning_rate']:g}, Adam beta2 {t['adam_beta2']:g} "
                  f"(from `{meta.get('tuned_file', 'the tuning table')}`); min_snr and p2 use its lr.", ""]
    return lines


def speedup_table(summary: dict, budget: int, ref: str) -> list[str]:
    """One row per method, best FD at the budget first: FD, steps, steps to the reference's FD, speed-ups, cost."""
    lines = ["Only finished runs enter the means; runs still in progress are listed in the last column. Speed-up = "
             f"{ref}'s budget / the uniform-equivalent steps at which the method's mean curve reaches {ref}'s mean "
             "final FD (linear interpolation between evaluation points); per seed = the same, each seed against "
             f"{ref}'s run with that seed.", "",
             f"| method | seeds | FD at budget | steps run | uniform-equivalent steps to {ref}'s final FD | speed-up | "
             "speed-up per seed | cost ratio measured (used) | in progress |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in sorted(summary, key=lambda k: (summary[k]["curve"][-1]["mean"] if summary[k]["curve"] else math.inf)):
        s = summary[m]
        at_budget = s["curve"] and s["curve"][-1]["equiv_step"] == budget
        fd = f"{s['curve'][-1]['mean']:.3f} +- {s['curve'][-1]['std']:.3f}" if at_budget else "-"
        cross, speedup = s.get("equiv_steps_to_target"), s.get("speedup")
        per_seed = ", ".join(f"{k}: {f'{v:.2f}x' if v else 'not reached'}"
                             for k, v in s.get("speedup_by_seed", {}).items())
        lines.append(f"| {m} | {len(s['seeds'])} | {fd} | {', '.join(map(str, s['steps_reached'])) or '-'} | "
                     f"{f'{cross:.0f}' if cross else 'not reached'} | {f'{speedup:.2f}x' if speedup else '-'} | "
                     f"{per_seed or '-'} | {s['cost_ratio']:.3f} ({s['cost_ratio_used']:.3f}) | "
                     f"{'; '.join(s.get('running', [])) or '-'} |")
    return lines


def points_table(summary: dict) -> list[str]:
    """FD at each evaluation point, one row per method in the protocol's order."""
    points = sorted({p["equiv_step"] for s in summary.values() for p in s["curve"]})
    lines = ["", "FD at each evaluation point (uniform-equivalent steps; mean +- std):", "",
             "| method | " + " | ".join(map(str, points)) + " |", "|---|" + "---|" * len(points)]
    for m, s in sorted(summary.items(), key=lambda kv: order(kv[0])):
        cells = {p["equiv_step"]: f"{p['mean']:.2f} +- {p['std']:.2f}" for p in s["curve"]}
        lines.append(f"| {m} | " + " | ".join(cells.get(p, "-") for p in points) + " |")
    return lines


def exit_lines(summary: dict, budget: int, ref: str, blob_phase: bool) -> list[str]:
    """Each method's step of leaving the blob phase and the speed-up in it (blob-phase tables, PROTOCOL.md 32 px,
    whose bar uses it; and long runs)."""
    why = (f"; the calibration never left it, so the budget is {budget} steps and FD is compared at equal steps"
           if blob_phase else "")
    lines = ["", f"Leaving the blob phase (the first evaluation at FD <= {TRANSITION_FD:g}{why}). Speed-up = {ref}'s "
             f"exit step / the method's; while {ref} has not left it by the budget, {budget} / the method's exit "
             "step, a lower bound (marked >=):", "",
             "| method | exit step (mean curve) | speed-up | exit step per seed | speed-up per seed |",
             "|---|---|---|---|---|"]

    def fmt(sp, bound):
        return f"{'>= ' if bound else ''}{sp:.2f}x" if sp else "-"

    for m, s in sorted(summary.items(), key=lambda kv: order(kv[0])):
        if "exit_step" not in s:
            continue
        bound = s["exit_speedup_is_lower_bound"]
        per_step = ", ".join(f"{k}: {f'{e:.0f}' if e else 'not left'}" for k, e in s["exit_step_by_seed"].items())
        per_sp = ", ".join(f"{k}: {fmt(v['speedup'], v['lower_bound'])}" for k, v in s["exit_speedup_by_seed"].items())
        exit_at = f"{s['exit_step']:.0f}" if s["exit_step"] else "not left"
        lines.append(f"| {m} | {exit_at} | {fmt(s['exit_speedup'], bound)} | "
                     f"{per_step or '-'} | {per_sp or '-'} |")
    return lines


def selection_lines(sel: dict | None) -> list[str]:
    """The tuning table's selection of uniform-tuned."""
    return ["", "Selection (PROTOCOL.md): " + (
        f"**{sel['name']}** (lr {sel['learning_rate']:g}, beta2 {sel['adam_beta2']:g}, FD at the budget "
        f"{sel['fd_at_budget']:.3f}; rule: {sel['rule']}; tied: {', '.join(sel['tied'])}) - written to "
        "`uniform_tuned.json`." if sel else "not every grid point has finished yet.")]


def long_lines(sp: dict, ref: str) -> list[str]:
    """The long runs' speed-ups to the reference's FD at each target step."""
    targets = sorted({t for v in sp.values() for t in v}, key=int)
    lines = ["", f"Speed-up to {ref}'s mean FD at each target step T (T / the uniform-equivalent steps at which the "
             "method's mean curve first reaches that FD; 'not reached' = never within the run):", "",
             "| method | " + " | ".join(f"T = {t}" for t in targets) + " |", "|---|" + "---|" * len(targets)]
    for m, v in sorted(sp.items(), key=lambda kv: order(kv[0])):
        cells = []
        for t in targets:
            c = v.get(t) or v.get(str(t))
            cells.append("-" if not c else f"{c['speedup']:.2f}x (FD {c['target_fd']:.2f} at step "
                         f"{c['equiv_steps_to_target']:.0f})" if c["speedup"]
                         else f"not reached (FD {c['target_fd']:.2f})")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def host_lines(rows: list[dict], report_cpu: str) -> list[str]:
    """Where each run's steps ran, for runs whose segments (launches) were recorded and ran on a host other than the
    report's, or on several: their training seconds mix those hosts' speeds. [] when every run ran on one host, the
    report's, or none recorded segments (tables from before segments.jsonl)."""
    hosts = {f"{r['method']}/seed{r['seed']}": r["hosts"] for r in rows if r.get("hosts")}
    if not hosts or all({h["cpu"] for h in hs} == {report_cpu} for hs in hosts.values()):
        return []
    return ["", "Hosts per run (launch: from step, CPU): " + "; ".join(
        f"{run}: " + ", ".join(f"{h['from_step']} on {h['cpu']}" for h in hs) for run, hs in sorted(hosts.items()))]


def write_readme(summary: dict, meta: dict, path: Path, budget: int) -> None:
    """README.md of a methods table."""
    ref = meta.get("reference", "uniform")
    lines = [*header(meta, budget), *speedup_table(summary, budget, ref), *points_table(summary)]
    has_exits = any("exit_step" in s for s in summary.values())  # (tables summarised before exit steps existed: none)
    if has_exits and (meta.get("blob_phase") or meta.get("table") == "long"):
        lines += exit_lines(summary, budget, ref, bool(meta.get("blob_phase")))
    if meta.get("table") == "tune":
        lines += selection_lines(meta.get("selected"))
    elif meta.get("table") == "long":
        lines += long_lines(meta.get("speedups_at", {}), ref)
    else:
        if meta.get("speedups_at"):  # PROTOCOL.md v4: the steps to the reference's mean FD at B/2, beside the speed-up
            lines += long_lines(meta["speedups_at"], ref)
        if meta.get("table") == "ablation":
            # the rows' flags as the table ran them (tables before issue 54's default change stored none)
            flags = meta.get("ablation_flags") or ABLATIONS_BEFORE_54
            lines += ["", f"Rows (flags beyond the default `{UNDER_TEST}`): " + "; ".join(
                f"`{n}`: `{' '.join(f)}`" for n, f in flags.items()) + ". What each part buys: docs/adaptive.md."]
        elif UNDER_TEST in summary:
            lines += ["", f"The bar for `{UNDER_TEST}` (issue: >= 2x against {ref}, best FD at the budget beyond the "
                      "seed spread, <= 2% per step), checked on this table:", "",
                      *bar_verdict(summary, baselines=meta.get("baselines"), reference=ref,
                                   blob_phase=bool(meta.get("blob_phase")))]
    lines += host_lines(meta.get("rows", []), meta["machine"]["cpu"])
    if meta.get("excluded"):
        lines += ["", "Left out (measured with other code): " + ", ".join(meta["excluded"])]
    path.write_text("\n".join(lines) + "\n")


def write_report(results: dict, out: Path) -> None:
    """README.md and fd_vs_time.png of a table from its results (meta, summary)."""
    if results["summary"]:
        write_plot(results["summary"], out / "fd_vs_time.png", plot_title(results))
        write_readme(results["summary"], results, out / "README.md", results["budget_steps"])


def render_stored(out: Path) -> None:
    """Re-render a table's README.md and fd_vs_time.png from its results.json as it stands."""
    write_report(json.loads((out / "results.json").read_text()), out)
