"""A methods table's numbers from its rows: mean +- std FD per uniform-equivalent step, steps to the reference's
final FD and speed-ups (mean curves and per seed), speed-ups at several targets (long runs), and the protocol's
selections (uniform-tuned from the grid, the 32 px budget and re-check)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from .protocol import (CALIBRATION_STEPS, TIE, TRANSITION_FD, budget_points, calibration_budget, exit_step, grid_name,
                       grid_variants, in_blob_phase)


def complete(row: dict) -> bool:
    """Every planned evaluation of the run is recorded."""
    return {e["step"] for e in row["evals"]} >= set(row.get("eval_steps", ()))


def interpolate_crossing(xs: list[float], ys: list[float], target: float) -> float | None:
    """First x (linear interpolation between points) where y falls to <= target; None if never."""
    for i, (x, y) in enumerate(zip(xs, ys)):
        if y <= target:
            if i == 0:
                return x
            x0, y0 = xs[i - 1], ys[i - 1]
            return x0 + (x - x0) * (y0 - target) / (y0 - y) if y0 != y else x
    return None


def method_summary(rs: list[dict], points: tuple[int, ...], running: list[str]) -> dict:
    """One method's finished runs -> its mean curve over the uniform-equivalent points, minutes, seeds."""
    c = rs[0]["cost_ratio_used"]
    curve = []
    for p in points:
        vals = [e["fd"] for r in rs for e in r["evals"] if e["step"] == max(1, round(p / c))]
        if len(vals) == len(rs):
            curve.append({"equiv_step": p, "mean": statistics.fmean(vals),
                          "std": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals), "values": vals})
    minutes = [statistics.fmean([e["train_seconds"] for r in rs for e in r["evals"]
                                 if e["step"] == max(1, round(p["equiv_step"] / c))]) / 60 for p in curve]
    return {"cost_ratio": rs[0]["cost_ratio"], "cost_ratio_used": c, "seeds": sorted(r["seed"] for r in rs),
            "curve": curve, "minutes": minutes, "steps_reached": [r["steps"] for r in rs], "running": running}


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
    summary = {m: method_summary(rs, points, running.pop(m, [])) for m, rs in by_method.items()}
    for m, runs in running.items():
        summary[m] = {"cost_ratio": next(r["cost_ratio"] for r in rows if r["method"] == m),
                      "cost_ratio_used": next(r["cost_ratio_used"] for r in rows if r["method"] == m),
                      "seeds": [], "curve": [], "minutes": [], "steps_reached": [], "running": runs}
    ref = summary.get(reference)
    if ref and ref["curve"] and ref["curve"][-1]["equiv_step"] == budget:
        add_speedups(summary, by_method, reference, budget)
        add_exit_steps(summary, by_method, reference, budget)
    return summary


def curve_xy(s: dict) -> tuple[list[int], list[float]]:
    """A method summary's mean curve as (uniform-equivalent steps, mean FDs)."""
    return [p["equiv_step"] for p in s["curve"]], [p["mean"] for p in s["curve"]]


def exit_speedup(method_exit: int | None, reference_exit: int | None, budget: int) -> tuple[float | None, bool]:
    """Speed-up in leaving the blob phase: the reference's exit step / the method's; while the reference has not left
    it by the budget, budget / the method's exit step, a lower bound (PROTOCOL.md 32 px). (speed-up, lower bound?)"""
    if method_exit is None:
        return None, False
    if reference_exit is None:
        return budget / method_exit, True
    return reference_exit / method_exit, False


def add_exit_steps(summary: dict, by_method: dict, reference: str, budget: int) -> None:
    """Each method's step of leaving the blob phase (mean curve and per seed) and its exit speed-up against the
    reference (PROTOCOL.md 32 px: what a table reports when the calibration never left the blob phase)."""
    ref_exit = exit_step(*curve_xy(summary[reference]))
    ref_by_seed = {r["seed"]: exit_step(*seed_curve(r)) for r in by_method[reference]}
    for m, s in summary.items():
        s["exit_step"] = exit_step(*curve_xy(s))
        s["exit_speedup"], s["exit_speedup_is_lower_bound"] = exit_speedup(s["exit_step"], ref_exit, budget)
        s["exit_step_by_seed"] = {r["seed"]: exit_step(*seed_curve(r)) for r in by_method.get(m, [])}
        s["exit_speedup_by_seed"] = {k: dict(zip(("speedup", "lower_bound"), exit_speedup(e, ref_by_seed[k], budget)))
                                     for k, e in s["exit_step_by_seed"].items() if k in ref_by_seed}


def seed_curve(row: dict) -> tuple[list[float], list[float]]:
    """One run's evaluations as (uniform-equivalent steps, FDs), in step order."""
    pts = sorted((e["step"] * row["cost_ratio_used"], e["fd"]) for e in row["evals"])
    return [p[0] for p in pts], [p[1] for p in pts]


def add_speedups(summary: dict, by_method: dict, reference: str, budget: int) -> None:
    """Each method's steps to the reference's mean final FD and speed-up, on the mean curves and paired by seed."""
    target = summary[reference]["curve"][-1]["mean"]
    final = {r["seed"]: r for r in by_method[reference]}
    for m, s in summary.items():
        cross = interpolate_crossing(*curve_xy(s), target)
        s["target_fd"] = target
        s["equiv_steps_to_target"] = cross
        s["speedup"] = budget / cross if cross else None
        # paired by seed: the method's seed-k curve against the reference's seed-k final FD
        s["speedup_by_seed"] = {}
        for r in by_method.get(m, []):
            if r["seed"] in final:
                tgt = next(e["fd"] for e in final[r["seed"]]["evals"] if e["step"] == budget)
                x = interpolate_crossing(*seed_curve(r), tgt)
                s["speedup_by_seed"][r["seed"]] = budget / x if x else None


def speedups_at(summary: dict, reference: str, targets: tuple[int, ...]) -> dict:
    """Long runs: per method and target step T, the reference's mean FD at T, the uniform-equivalent step at which
    the method's mean curve first reaches it (linear interpolation) and the speed-up T / that step."""
    ref = summary.get(reference)
    out: dict = {}
    if not ref or not ref["curve"]:
        return out
    ref_fd = {p["equiv_step"]: p["mean"] for p in ref["curve"]}
    for m, s in summary.items():
        xs, ys = curve_xy(s)
        for t in targets:
            if t not in ref_fd or not xs:
                continue
            cross = interpolate_crossing(xs, ys, ref_fd[t])
            out.setdefault(m, {})[t] = {"target_fd": ref_fd[t], "equiv_steps_to_target": cross,
                                        "speedup": t / cross if cross else None}
    return out


def select_tuned(summary: dict, budget: int) -> dict | None:
    """PROTOCOL.md's uniform-tuned: the grid point with the lowest FD at the budget; FDs within TIE (relative) of the
    best are a tie, won by the earliest transition (first evaluation at FD <= TRANSITION_FD), then the lower FD."""
    finished = {m: s for m, s in summary.items() if m in grid_variants() and s["curve"]
                and s["curve"][-1]["equiv_step"] == budget}
    if len(finished) < len(grid_variants()):
        return None
    best = min(s["curve"][-1]["mean"] for s in finished.values())

    def transition(s):
        return exit_step(*curve_xy(s)) or math.inf

    tied = [m for m, s in finished.items() if s["curve"][-1]["mean"] <= best * (1 + TIE)]
    name = min(tied, key=lambda m: (transition(finished[m]), finished[m]["curve"][-1]["mean"]))
    flags = grid_variants()[name]
    return {"name": name, "learning_rate": float(flags[1]), "adam_beta2": float(flags[3]),
            "fd_at_budget": finished[name]["curve"][-1]["mean"], "tied": sorted(tied),
            "rule": f"lowest FD at the budget; within {TIE:.0%} a tie, won by the first evaluation at FD <= "
                    f"{TRANSITION_FD:g}"}


def write_calibration(summary: dict, pl, args, out: Path) -> dict | None:
    """32 px calibration. First invocation: uniform-tuned's 6,000-step curve -> calibration.json with the budget B.
    With --calibration: uniform-tuned's FD at B (from that curve) against its 2 re-check neighbours' -> the 32 px
    uniform_tuned.json (the same selection rule as the 16 px grid)."""
    if not args.calibration:
        s = summary.get("uniform-tuned")
        if not s or not s["curve"] or s["curve"][-1]["equiv_step"] != CALIBRATION_STEPS:
            return None
        curve = [(p["equiv_step"], p["mean"]) for p in s["curve"]]
        budget, blob = calibration_budget(curve), in_blob_phase(curve)
        result = {"budget": budget, "points": list(budget_points(budget, blob)), "blob_phase": blob, "curve": curve,
                  "uniform_tuned_16px": pl.tuned,
                  "rule": "first evaluation within 15% of the 6,000-step FD, rounded up to a multiple of 1,000; if "
                          "the 6,000-step FD is within 15% of the 1,000-step FD (never left the blob phase), B = "
                          "6,000 with points 1,500 / 3,000 / 4,500 / 6,000"}
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
              "rule": f"lowest FD at B among the 16 px choice and its 2 lr neighbours; within {TIE:.0%} the 16 px "
                      "choice stays"}
    (out / "uniform_tuned.json").write_text(json.dumps(result, indent=1))
    return result
