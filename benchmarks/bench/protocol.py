"""The CPU proxy protocol as data (shared/benchmark/PROTOCOL.md): the methods and their flags, budgets, evaluation
points, seeds, the uniform-tuned grid, the ablation rows, and the rules that turn a cost ratio into a step budget.

The timestep methods are the registry's (adaptive/timesteps/registry.py): a new method is in every table without an
edit here. What the protocol adds as data: the loss-weighting baselines, the tuned variants and the ablation rows.
"""

from __future__ import annotations

import math

from adaptive.config import TrainConfig
from adaptive.timesteps import METHODS as REGISTERED

from .provenance import ROOT

SHARED = ROOT.parent / "shared"
PROTOCOL_DATA = SHARED / "datasets" / "cifar10-jpeg" / "train.zip"
PROTOCOL_FEATURES = SHARED / "eval" / "cifar10-proxy-features.pt"
BUDGET = 2000  # uniform-equivalent optimizer steps
EVAL_POINTS = (500, 1000, 1250, 1500, 1750, 2000)
COST_FREE = 1.02  # cost ratios up to this use the uniform step counts (PROTOCOL.md)
CLAIM_SEEDS = (13, 14, 15)  # PROTOCOL.md v4: run once, on a frozen method; no development run may use them
SPENT_SEEDS = (10, 11, 12)  # v3's claim seeds: their tables stay in docs/ as history; no new table may use them
# PROTOCOL.md v4: what a claim table runs at each resolution (others may be added, none left out)
CLAIM_METHODS = {"16": ("uniform-tuned", "adaptive", "min_snr", "iddpm", "edm2_uncertainty"),
                 "32": ("uniform-tuned", "adaptive", "min_snr", "edm2_uncertainty")}
CALIBRATION_STEPS = 6000  # 32 px calibration: uniform-tuned on seed 0, evaluated every 500 steps
CALIBRATION_TOLERANCE = 0.15  # "within 15%" of the calibration rule and of its blob-phase test
BLOB_POINTS = (1500, 3000, 4500, 6000)  # a 32 px table's points when the calibration never left the blob phase
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

DEFAULT = TrainConfig.timestep_sampler  # the reference method (uniform): no flag needed
UNDER_TEST = "adaptive"  # the method the protocol's bar is for; the ablation rows are its parts
LOSS_WEIGHTINGS = ("min_snr", "p2")  # baselines on the default t that reweight the loss (--loss_weighting)


def method_flags() -> dict[str, list[str]]:
    """Every method of the protocol -> train_accelerate.py flags, in table order: the default, the loss-weighting
    baselines, the other registered timestep methods, the method under test last."""
    out = {DEFAULT: []}
    out.update({w: ["--loss_weighting", w] for w in LOSS_WEIGHTINGS})
    out.update({m: ["--timestep_sampler", m] for m in REGISTERED if m not in (DEFAULT, UNDER_TEST)})
    out[UNDER_TEST] = ["--timestep_sampler", UNDER_TEST]
    return out


METHODS = method_flags()

# The ablation of the method under test (docs/adaptive.md), each row the method with parts switched off, cumulative
# from uniform.
_UNDER_TEST = ["--timestep_sampler", UNDER_TEST]
_UNIFORM_T = ["--adaptive_proposal", "uniform", "--no-adaptive_stratified"]
ABLATIONS = {
    "abl-norm-only": [*_UNDER_TEST, "--adaptive_balance", "0", "--adaptive_balance_final", "0",
                      *_UNIFORM_T],  # per-step loss normalisation only: configured objective, i.i.d. uniform t
    "abl-balance": [*_UNDER_TEST, "--adaptive_balance", "0.5", *_UNIFORM_T],  # + the balance exponent 0.5 -> 0
    "abl-proposal": [*_UNDER_TEST, "--no-adaptive_stratified"],  # + the importance proposal
    # (+ stratified draws = the full method: `adaptive`)
    # + the balance exponent 0.5 -> 0 on the full method: the default before issue 54's v4 freeze (the balance-free
    # default was the row `abl-balance0` of docs/benchmarks/methods/2026-12-07-dev16-v4-balance0, made at d74a358)
    "abl-balance0.5": [*_UNDER_TEST, "--adaptive_balance", "0.5", "--adaptive_balance_final", "0"],
    "abl-noclip": [*_UNDER_TEST, "--max_grad_norm", "0"],
    "abl-scale0.1": [*_UNDER_TEST, "--adaptive_loss_scale", "0.1"],
    "abl-scale0.3": [*_UNDER_TEST, "--adaptive_loss_scale", "0.3"],
    "abl-scale1": [*_UNDER_TEST, "--adaptive_loss_scale", "1"],
}
# The ablation rows as defined while `adaptive` defaulted to --adaptive_balance 0.5 (tables made then list these).
ABLATIONS_BEFORE_54 = {n: [f for f in ABLATIONS[n] if n != "abl-balance" or f not in ("--adaptive_balance", "0.5")]
                       for n in ("abl-norm-only", "abl-balance", "abl-proposal", "abl-noclip", "abl-scale0.1",
                                 "abl-scale0.3", "abl-scale1")}

# Variants on a tuning result (PROTOCOL.md): name -> (its method, the tuned optimiser settings it takes).
# `uniform-tuned` is uniform at the tuned lr and beta2; the loss-weighting baselines train at its lr;
# `adaptive-tuned` is the method under test's defaults on uniform-tuned's optimiser (a user who tuned uniform
# switches the sampler).
TUNED = {"uniform-tuned": (DEFAULT, ("learning_rate", "adam_beta2")),
         **{w: (w, ("learning_rate",)) for w in LOSS_WEIGHTINGS},
         "adaptive-tuned": (UNDER_TEST, ("learning_rate", "adam_beta2"))}


def grid_name(lr: float, beta2: float) -> str:
    return f"uniform_lr{lr:g}_b2-{beta2:g}"


def grid_variants() -> dict[str, list[str]]:
    """The uniform-tuned grid as named variants: name -> train_accelerate.py flags."""
    return {grid_name(lr, b2): ["--learning_rate", f"{lr:g}", "--adam_beta2", f"{b2:g}"]
            for lr in TUNING_GRID["learning_rate"] for b2 in TUNING_GRID["adam_beta2"]}


def tuned_flags(tuned: dict | None) -> dict[str, list[str]]:
    """The TUNED variants -> train_accelerate.py flags, from a tuning result (uniform_tuned.json)."""
    if not tuned:
        return {}
    return {name: [*METHODS[method], *(a for k in keys for a in (f"--{k}", f"{tuned[k]:g}"))]
            for name, (method, keys) in TUNED.items()}


def variants(tuned: dict | None = None) -> dict[str, tuple[str, list[str]]]:
    """Every runnable name -> (the method whose measured cost ratio it uses, its train_accelerate.py flags)."""
    out = {m: (m, f) for m, f in METHODS.items()}
    out.update({n: (DEFAULT, f) for n, f in grid_variants().items()})
    out.update({n: (UNDER_TEST, f) for n, f in ABLATIONS.items()})
    out.update({n: (TUNED[n][0], f) for n, f in tuned_flags(tuned).items()})
    return out


def method_of(name: str) -> str:
    """The method a variant belongs to (itself for a method or an unknown name)."""
    of = {**{n: DEFAULT for n in grid_variants()}, **{n: UNDER_TEST for n in ABLATIONS},
          **{n: m for n, (m, _) in TUNED.items()}}
    return of.get(name, name)


def order(name: str) -> tuple[int, str]:
    """Sort key: the protocol's method order, variants after their method."""
    base = method_of(name)
    return (list(METHODS).index(base) if base in METHODS else len(METHODS), name)


def used_ratio(cost: dict) -> float:
    """The cost ratio a method's budget is divided by: its median ratio if every block measured it more than 2%
    slower than uniform (the order-statistics ~94% confidence interval of the median of 5 blocks excludes 1.02),
    else 1 - the protocol's 'c <= 1.02 may use the uniform step counts', robust to a noisy machine."""
    blocks = cost.get("block_ratios") or [cost.get("cost_ratio", 1.0)]
    return cost.get("cost_ratio", 1.0) if min(blocks) > COST_FREE else 1.0


def plan(method: str, cost_ratio: float, budget: int, points: tuple[int, ...]) -> tuple[int, list[int]]:
    """(steps, evaluation steps) of a run whose step costs `cost_ratio` uniform steps: equal cost."""
    c = max(1.0, cost_ratio)
    return max(1, round(budget / c)), sorted({max(1, round(p / c)) for p in points})


def calibration_budget(curve: list[tuple[int, float]]) -> int:
    """PROTOCOL.md 32 px: the first evaluation step whose FD is within 15% of the last one's, rounded up to a
    multiple of 1,000; CALIBRATION_STEPS if the curve never leaves the blob phase (no budget to calibrate)."""
    if in_blob_phase(curve):
        return CALIBRATION_STEPS
    final = curve[-1][1]
    first = next(step for step, fd in curve if fd <= (1 + CALIBRATION_TOLERANCE) * final)
    return int(math.ceil(first / 1000) * 1000)


def in_blob_phase(curve: list[tuple[int, float]]) -> bool:
    """PROTOCOL.md 32 px: the calibration curve never leaves the blob phase - its 6,000-step FD is within 15% of its
    1,000-step FD."""
    fd = dict(curve)
    if CALIBRATION_STEPS not in fd or 1000 not in fd:
        return False
    return abs(fd[CALIBRATION_STEPS] - fd[1000]) <= CALIBRATION_TOLERANCE * fd[1000]


def budget_points(budget: int, blob_phase: bool) -> tuple[int, ...]:
    """PROTOCOL.md 32 px: the evaluation points of a table at budget B - B/4, B/2, 5B/8, 3B/4, 7B/8, B; in the blob
    phase (B = 6,000, no budget calibrated) 1,500 / 3,000 / 4,500 / 6,000."""
    if blob_phase:
        return BLOB_POINTS
    return tuple(sorted({budget // 4, budget // 2, 5 * budget // 8, 3 * budget // 4, 7 * budget // 8, budget}))


def exit_step(steps: list[int], fds: list[float]) -> int | None:
    """The first evaluation step at which a curve has left the blob phase (FD <= TRANSITION_FD); None if never."""
    return next((s for s, fd in zip(steps, fds) if fd <= TRANSITION_FD), None)


def recheck_points(tuned: dict) -> list[str]:
    """The 2 grid points uniform-tuned is re-checked against at 32 px: its neighbours in lr (same beta2)."""
    lrs = list(TUNING_GRID["learning_rate"])
    i = lrs.index(tuned["learning_rate"])
    near = sorted((j for j in range(len(lrs)) if j != i), key=lambda j: (abs(j - i), j))[:2]
    return [grid_name(lrs[j], tuned["adam_beta2"]) for j in sorted(near)]
