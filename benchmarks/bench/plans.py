"""What one compare_methods.py invocation runs: the table kind (dev, claim, tune, ablation, calibrate, long), its
methods, seeds, budget, evaluation points and reference, resolved from the flags."""

from __future__ import annotations

import argparse
import json

from .protocol import (ABLATIONS, BUDGET, CALIBRATION_STEPS, CLAIM_METHODS, CLAIM_SEEDS, EVAL_POINTS,
                       SPENT_SEEDS, LONG_POINTS,
                       LONG_STEPS, METHODS, TUNING_SEED, UNDER_TEST, budget_points, calibration_budget, grid_name,
                       grid_variants, in_blob_phase, recheck_points, variants)
from .provenance import dirty


class Plan(argparse.Namespace):
    """What one invocation runs: table kind, preset, methods, seeds, budget, evaluation points, reference."""


def make_plan(args) -> Plan:
    """Resolve the invocation's table from its flags (ConfigError-style messages as ValueError)."""
    pl = Plan(table="dev", preset=args.preset or "cpu-tiny16", tuned=None, reference=args.reference, baselines=None)
    if args.tuned:
        pl.tuned = json.loads(args.tuned.read_text())
    calibration = read_calibration(args.calibration) if args.calibration else None
    if args.protocol == "32":
        pl.preset = args.preset or "cpu-tiny"
    pl.seeds = list(args.seeds)
    pl.methods = choose_methods(args, pl, calibration)  # may fix the seeds (tune, calibrate)
    check_seeds(args, pl)
    known = variants(pl.tuned)
    unknown = [m for m in pl.methods if m not in known]
    if unknown:
        raise ValueError(f"unknown method {', '.join(unknown)} (give --tuned for uniform-tuned)")
    left_out = [m for m in CLAIM_METHODS[args.protocol] if m not in pl.methods]
    if args.claim and left_out:
        raise ValueError(f"a {args.protocol} px claim table runs {', '.join(CLAIM_METHODS[args.protocol])} "
                         f"(PROTOCOL.md; others may be added): {', '.join(left_out)} left out")
    pl.reference = pl.reference or ("uniform-tuned" if pl.tuned else "uniform")
    if pl.table in ("dev", "claim"):  # what the method under test must beat: the other methods, not its own variants
        pl.baselines = [m for m in pl.methods
                        if m != UNDER_TEST and not m.startswith(f"{UNDER_TEST}-") and m not in ABLATIONS]
    # PROTOCOL.md 32 px: a calibration that never left the blob phase -> FD at equal steps and each method's exit step
    pl.blob_phase = bool(calibration and in_blob_phase(calibration.get("curve", [])))
    pl.budget, pl.points = budget_and_points(args, pl, calibration)
    if args.quick:
        pl.points = (4, 8)
    return pl


def read_calibration(path) -> dict:
    """A calibration.json; its budget, points and blob_phase must be what its curve gives (PROTOCOL.md 32 px, the
    rule summary.write_calibration applied): the plan derives the budget's points and the blob phase from the curve,
    so a file edited by hand, or made by other code, is refused rather than half used."""
    cal = json.loads(path.read_text())
    curve = [tuple(p) for p in cal.get("curve", [])]
    if not curve:  # a budget alone (no curve to check it against)
        return cal
    budget, blob = calibration_budget(curve), in_blob_phase(curve)
    derived = {"budget": budget, "points": list(budget_points(budget, blob)), "blob_phase": blob}
    wrong = [f"{k} {cal[k]} (its curve gives {v})" for k, v in derived.items() if k in cal and cal[k] != v]
    if wrong:
        raise ValueError(f"{path}: {'; '.join(wrong)} - edited by hand or made by other code; rerun --calibrate")
    return cal


def choose_methods(args, pl: Plan, calibration: dict | None) -> list[str]:
    """The table's methods; sets its kind (pl.table) and, where the kind fixes them, its seeds and reference."""
    methods = args.methods
    if args.tune_uniform:
        pl.table, pl.seeds = "tune", [TUNING_SEED]
        pl.reference = pl.reference or grid_name(2e-3, 0.999)
        return methods or list(grid_variants())
    if args.ablation:
        pl.table = "ablation"
        return methods or ["uniform", *ABLATIONS, UNDER_TEST]
    if args.calibrate:
        if args.protocol != "32" or not pl.tuned:
            raise ValueError("--calibrate needs --protocol 32 and --tuned (the 16 px uniform_tuned.json)")
        pl.table, pl.seeds = "calibrate", [TUNING_SEED]
        # first the 6,000-step run; once B is known (--calibration), uniform-tuned's lr against its 2 neighbours
        methods = recheck_points(pl.tuned) if calibration else ["uniform-tuned"]
        pl.reference = pl.reference or (methods[0] if calibration else "uniform-tuned")
        return methods
    if args.long:
        if not pl.tuned or args.claim:
            raise ValueError("--long needs --tuned (its reference is uniform-tuned) and is a development table "
                             "(never --claim)")
        pl.table = "long"
        return methods or ["uniform-tuned", UNDER_TEST]
    if args.claim:
        return methods or list(CLAIM_METHODS[args.protocol])
    if methods is None:
        methods = [m for m in METHODS if not (pl.tuned and m == "uniform")]
        methods = (["uniform-tuned"] if pl.tuned else []) + methods
    return methods


def check_seeds(args, pl: Plan) -> None:
    """Claim seeds only in a --claim table, which runs exactly them on a committed, clean tree; v3's claim seeds in
    no new table (a --report_only of their committed tables re-renders them)."""
    if args.claim:
        pl.table = "claim"
    spent = sorted(set(pl.seeds) & set(SPENT_SEEDS))
    if spent and not args.report_only:
        raise ValueError(f"training seeds {spent} hold protocol v3's claim tables (history): use development seeds "
                         f"0-2 or, for a --claim table, {list(CLAIM_SEEDS)}")
    claim_seeds = sorted(set(pl.seeds) & set(CLAIM_SEEDS))
    if claim_seeds and not args.claim:
        raise ValueError(f"training seeds {claim_seeds} are the protocol's claim seeds: only a --claim table may use "
                         "them")
    if args.claim and (set(pl.seeds) != set(CLAIM_SEEDS) or dirty()):
        raise ValueError(f"--claim runs seeds {list(CLAIM_SEEDS)} on a committed, clean tree (the frozen method)")


def budget_and_points(args, pl: Plan, calibration: dict | None) -> tuple[int, tuple[int, ...]]:
    """The table's budget (uniform-equivalent steps) and evaluation points."""
    if pl.table == "calibrate" and not calibration:
        return CALIBRATION_STEPS, tuple(range(500, CALIBRATION_STEPS + 1, 500))
    if pl.table == "long":
        return LONG_STEPS, LONG_POINTS[args.protocol]
    if args.protocol == "32":
        if not calibration:
            raise ValueError("--protocol 32 needs --calibration (the calibration.json of a --calibrate run)")
        B = calibration["budget"]
        return args.budget_steps or B, budget_points(B, pl.blob_phase)
    budget = args.budget_steps or BUDGET
    return budget, tuple(p for p in EVAL_POINTS if p <= budget)
