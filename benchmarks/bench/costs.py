"""Cost ratios: each method's real optimizer step (adaptive.loop.optimizer_step, the loop's three sampler calls)
timed side by side with uniform in one process, in interleaved blocks; c_m = time_m / time_uniform."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, TypeVar

import torch

from adaptive.build import Run, setup
from adaptive.config import parse_train_args, replace, resolve_config
from adaptive.loop import optimizer_step
from adaptive.losses import DiffusionTables
from adaptive.timesteps import build_sampler

from .protocol import METHODS, order
from .provenance import ROOT, git

T = TypeVar("T")
METHOD_FIELDS = ("timestep_sampler", "timestep_options", "loss_weighting")  # what a method's flags set


def costs_to_measure(costs: dict | None, methods: list[str], remeasure: list[str]) -> tuple[dict, list[str]]:
    """(the cost ratios to keep, the methods to measure): those of `methods` (and uniform) without a ratio, plus the
    `remeasure` ones. Only these are measured again (side by side with uniform); every kept ratio stays as it is, so
    that finished runs, whose step budgets were planned from it, stay finished."""
    kept = {m: c for m, c in (costs or {}).items() if m not in remeasure}
    needed = sorted(set(methods) | {"uniform"}, key=order)
    return kept, [m for m in needed if m not in kept]


def method_runs(run: Run, methods: list[str], flags: list[str]) -> dict[str, Run]:
    """Per method, a view of `run` (the same model, optimizer and data) with the method's config, loss tables and
    timestep sampler, built from its train_accelerate.py flags."""
    out = {}
    for m in methods:
        cfg = resolve_config(parse_train_args([*flags, *METHODS[m]]))
        cfg = replace(run.cfg, **{k: getattr(cfg, k) for k in METHOD_FIELDS})
        tables = DiffusionTables.build(run.noise_scheduler.alphas_cumprod, cfg, run.accelerator.device)
        out[m] = dataclasses.replace(run, cfg=cfg, tables=tables,
                                     timesteps=build_sampler(cfg, run.accelerator.device, tables))
    return out


def measurement_runs(methods: list[str], data: Path, threads: int, extra: list[str], preset: str,
                     work: Path = ROOT / "benchmarks" / "_work" / "cost") -> dict[str, Run]:
    """One throwaway run of `preset` on `data` (in the folder `work`) and its view per method, on `threads`
    threads."""
    torch.set_num_threads(threads)
    flags = ["--preset", preset, "--train_data_dir", str(data), "--output_dir", str(work), "--overwrite_output_dir",
             "--logger", "none", *extra]
    return method_runs(setup(resolve_config(parse_train_args(flags)), lambda m: None), methods, flags)


def step_runner(runs: dict[str, Run]) -> Callable[[str, int], None]:
    """`run_steps(m, n)`: n real optimizer steps of method m's run on the next batches of one shared stream, the step
    counter running on across methods (as one training run's would)."""
    batches = next(iter(runs.values())).data.batches(0)
    step = 0

    def run_steps(m: str, n: int) -> None:
        nonlocal step
        for _ in range(n):
            optimizer_step(runs[m], step, next(batches))
            step += 1
    return run_steps


def interleaved_blocks(runs: dict[str, Run], methods: list[str], block_steps: int, blocks: int, warmup: int,
                       block: Callable[[str, int], T]) -> dict[str, list[T]]:
    """Per method, what `block(m, n)` returned for each of `blocks` rounds, after one warm-up block of `warmup`
    steps per method (caches, allocator, first-update costs). A round runs one block per method, in alternating
    order against drift; a block spans whole periods of a method's occasional work (its sampler's
    `update_period`)."""
    for m in methods:
        block(m, warmup)
    out: dict[str, list[T]] = {m: [] for m in methods}
    for b in range(blocks):
        for m in methods if b % 2 == 0 else list(reversed(methods)):
            out[m].append(block(m, max(block_steps, runs[m].timesteps.update_period)))
    return out


def measure_costs(methods: list[str], data: Path, block_steps: int, blocks: int, warmup: int, threads: int,
                  extra: list[str], clock: str = "wall", preset: str = "cpu-tiny16") -> dict:
    """Median per-step time of each method's real optimizer step over interleaved blocks, relative to uniform.
    clock 'wall': elapsed time; 'cpu': this process's CPU time - with one thread, the step's compute cost without
    the time other processes of a busy machine take from it (blocks as `interleaved_blocks`)."""
    now = time.perf_counter if clock == "wall" else time.process_time
    runs = measurement_runs(methods, data, threads, extra, preset)
    run_steps = step_runner(runs)

    def timed(m: str, n: int) -> float:
        t0 = now()
        run_steps(m, n)
        return (now() - t0) / n

    times = interleaved_blocks(runs, methods, block_steps, blocks, warmup, timed)
    ref = "uniform" if "uniform" in methods else methods[0]
    # ratio per round (blocks of one round ran back to back), then the median: robust to load changes between rounds
    return {m: {"seconds_per_step": statistics.median(v), "blocks": v, "clock": clock, "threads": threads,
                "block_ratios": [a / b for a, b in zip(v, times[ref])],
                "cost_ratio": statistics.median(a / b for a, b in zip(v, times[ref]))} for m, v in times.items()}


def known_costs(args, previous: dict, costs_file: Path, this_hash: str) -> dict | None:
    """Cost ratios measured on this code before: results.json's, else costs.json's; --costs overrides both."""
    costs = previous.get("costs") if previous.get("code_hash") == this_hash else None
    if costs is None and costs_file.exists() and json.loads(costs_file.read_text()).get("code_hash") == this_hash:
        costs = json.loads(costs_file.read_text())["costs"]
    if args.costs:
        costs = json.loads(args.costs.read_text())["costs"]
    return costs


def cost_ratios(args, pl, methods: list[str], previous: dict, out: Path, this_hash: str, log) -> dict:
    """The cost ratio of each of `methods` (measured once per table unless known; written to costs.json at once, so
    that a restarted benchmark reuses them). Nothing is measured with --report_only."""
    costs_file = out / "costs.json"
    costs = known_costs(args, previous, costs_file, this_hash)
    if set(methods) == {"uniform"}:  # only uniform's variants (the grid): the same step, nothing to measure
        costs = {"uniform": {"cost_ratio": 1.0, "block_ratios": [1.0], "note": "the reference itself"}, **(costs or {})}
    costs, missing = costs_to_measure(costs, sorted(methods, key=order), args.remeasure)
    if args.report_only or not missing:
        return costs
    measure = sorted(set(missing) | {"uniform"}, key=order)  # each ratio is against uniform
    log(f"measuring cost ratios of {', '.join(measure)} ({args.cost_blocks} interleaved blocks of "
        f"{args.cost_block_steps} steps)")
    fresh = measure_costs(measure, args.data, args.cost_block_steps, args.cost_blocks,
                          warmup=max(2, args.cost_block_steps // 2), threads=args.threads, extra=args.extra,
                          preset=pl.preset)
    costs = {**costs, **{m: fresh[m] for m in missing}}  # ratios already measured are kept as they are
    log("cost ratios: " + ", ".join(f"{m} {c['cost_ratio']:.3f}" for m, c in costs.items()))
    costs_file.write_text(json.dumps({"code_hash": this_hash, "git_commit": git("rev-parse", "HEAD"),
                                      "threads": args.threads, "costs": costs}, indent=1))
    return costs


class TimedSampler:
    """A timestep sampler whose three calls from the training step (draw, around_update, observe) add their time to
    `seconds` on `clock`; everything else passes through, so the step computes exactly what it computes without it."""

    CALLS = ("draw", "around_update", "observe")

    def __init__(self, sampler, clock):
        self.sampler, self.clock, self.seconds = sampler, clock, 0.0

    def __getattr__(self, name):
        return getattr(self.sampler, name)

    def _timed(self, call, *args, **kwargs):
        t0 = self.clock()
        try:
            return call(*args, **kwargs)
        finally:
            self.seconds += self.clock() - t0

    def draw(self, request):
        return self._timed(self.sampler.draw, request)

    def observe(self, *args, **kwargs):
        return self._timed(self.sampler.observe, *args, **kwargs)

    @contextlib.contextmanager
    def around_update(self, model, accelerator, draw):
        """The sampler's own context around the optimizer update; the update inside it is not counted."""
        context = self.sampler.around_update(model, accelerator, draw)
        self._timed(context.__enter__)
        try:
            yield
        except BaseException:
            if not context.__exit__(*sys.exc_info()):
                raise
        else:
            self._timed(context.__exit__, None, None, None)


def measure_sampler_time(methods: list[str], data: Path, block_steps: int, blocks: int, warmup: int, threads: int,
                         extra: list[str], preset: str = "cpu-tiny16") -> dict:
    """Per method, the CPU time of this thread per optimizer step - the whole step and the sampler's own calls within
    it - over interleaved blocks of real steps (as `measure_costs`). With one thread the step's compute runs on
    this thread, so other processes of a busy machine change neither number much. The method's attributable cost
    ratio = 1 + (its sampler time - uniform's) / uniform's step time: what the method adds to the step it shares."""
    clock = time.thread_time
    runs = measurement_runs(methods, data, threads, extra, preset)
    timed_runs = {m: dataclasses.replace(r, timesteps=TimedSampler(r.timesteps, clock)) for m, r in runs.items()}
    run_steps = step_runner(timed_runs)

    def block(m: str, n: int) -> tuple[float, float]:
        sampler = timed_runs[m].timesteps
        s0, t0 = sampler.seconds, clock()
        run_steps(m, n)
        return (clock() - t0) / n, (sampler.seconds - s0) / n

    pairs = interleaved_blocks(runs, methods, block_steps, blocks, warmup, block)
    steps = {m: [s for s, _ in v] for m, v in pairs.items()}
    own = {m: [o for _, o in v] for m, v in pairs.items()}
    ref = "uniform" if "uniform" in methods else methods[0]
    ref_step, ref_own = statistics.median(steps[ref]), statistics.median(own[ref])
    return {m: {"step_seconds": statistics.median(steps[m]), "sampler_seconds": statistics.median(own[m]),
                "step_blocks": steps[m], "sampler_blocks": own[m], "clock": "thread CPU time", "threads": threads,
                "sampler_share": statistics.median(own[m]) / statistics.median(steps[m]),
                "attributable_ratio": 1 + (statistics.median(own[m]) - ref_own) / ref_step,
                "step_ratio": statistics.median(a / b for a, b in zip(steps[m], steps[ref]))} for m in methods}
