#!/usr/bin/env python
"""One attention block of our U-Nets, each kernel x precision, interleaved in one process: forward+backward
(training) and forward only (sampling), and the blocked kernel's group size. The measurement behind
`--attention_impl auto` (adaptive/attention.py).

    python benchmarks/attention_kernels.py            # -> docs/benchmarks/throughput/<date>/attention.{json,md}
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from diffusers.models.attention_processor import Attention

import adaptive.attention as attention
from adaptive.attention import configure_attention
from benchmarks.bench.provenance import git, machine
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]

# (label, batch, channels, side): the attention blocks of cpu-tiny16 (64 tokens), cpu-tiny (256) and ddpm-cifar10 (256)
CASES = [("cpu-tiny16", 128, 64, 8), ("cpu-tiny", 128, 64, 16), ("ddpm-cifar10", 16, 256, 16)]
# (label, attention_impl, autocast bf16?, overrides of adaptive.attention's constants)
UNBLOCKED = {"UNBLOCKED_SCORE_BYTES": float("inf")}
VARIANTS = [("classic bf16", "classic", True, {}), ("matmul bf16 unblocked", "matmul", True, UNBLOCKED),
            ("matmul bf16", "matmul", True, {}), ("sdpa bf16", "sdpa", True, {}), ("sdpa fp32", "sdpa", False, {}),
            ("auto bf16", "auto", True, {})]
# Per-thread score budgets of the blocked kernel swept on the 256-token blocks (the default is marked in the table).
BUDGETS_MIB = [0.25, 0.5, 1, 2, 4, 8]


class Block(torch.nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.attn = Attention(channels, heads=channels // 8, dim_head=8, rescale_output_factor=1.0, eps=1e-5,
                              norm_num_groups=32, residual_connection=True, bias=True, upcast_softmax=True,
                              _from_deprecated_attn_block=True)


def time_ms(fn, reps: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t0) / reps * 1000


def with_constants(overrides: dict, fn):
    """Run fn() with some of adaptive.attention's module constants replaced."""
    old = {k: getattr(attention, k) for k in overrides}
    for k, v in overrides.items():
        setattr(attention, k, v)
    try:
        return fn()
    finally:
        for k, v in old.items():
            setattr(attention, k, v)


def measure(rounds: int, reps: int, cases=CASES, variants=VARIANTS, modes=("train", "sample")) -> list[dict]:
    rows = []
    for label, batch, channels, side in cases:
        block = Block(channels)
        for mode in modes:
            x = torch.randn(2 * batch if mode == "sample" else batch, channels, side, side,
                            requires_grad=mode == "train")
            times: dict[str, list[float]] = {v[0]: [] for v in variants}
            for _ in range(rounds):  # interleaved: load changes hit every variant
                for name, impl, bf16, overrides in variants:
                    configure_attention(block, impl, "cpu")

                    def step():
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), \
                                torch.set_grad_enabled(mode == "train"):
                            y = block.attn(x)
                        if mode == "train":
                            y.float().sum().backward()

                    times[name].append(with_constants(overrides, lambda: time_ms(step, reps)))
            for name, ts in times.items():
                rows.append({"case": label, "tokens": side * side, "channels": channels, "batch": x.shape[0],
                             "mode": mode, "variant": name, "ms": statistics.median(ts), "all_ms": ts})
    return rows


def ms_cells(sel: dict, variants) -> list[str]:
    """The median ms of each variant in `sel` ({variant name: row}), the fastest in bold."""
    best = min(r["ms"] for r in sel.values())
    return [f"**{sel[v[0]]['ms']:.0f}**" if sel[v[0]]["ms"] == best else f"{sel[v[0]]['ms']:.0f}" for v in variants]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path,
                   default=ROOT / "docs" / "benchmarks" / "throughput" / dt.date.today().isoformat())
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    cases = [("tiny", 4, 32, 8)] if args.quick else CASES
    rounds, reps = (1, 1) if args.quick else (args.rounds, args.reps)
    load0 = os.getloadavg()
    rows = measure(rounds, reps, cases)
    default_mib = attention.BLOCK_SCORE_BYTES_PER_THREAD / 2**20
    budget_variants = [(f"{mib:g} MiB", "matmul", True, {"BLOCK_SCORE_BYTES_PER_THREAD": int(mib * 2**20)})
                       for mib in BUDGETS_MIB]
    sweep = measure(rounds, reps, [c for c in cases if c[3] ** 2 >= 256] or cases, budget_variants, ("train",))
    res = {"date": dt.date.today().isoformat(),
           "command": " ".join(["python", "benchmarks/attention_kernels.py", *(argv or sys.argv[1:])]),
           "git_commit": git("rev-parse", "HEAD"), "machine": machine()["cpu"], "threads": torch.get_num_threads(),
           "torch": torch.__version__, "load_average_start": load0, "load_average_end": os.getloadavg(), "rows": rows,
           "budget_sweep": sweep, "default_budget_mib": default_mib}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention.json").write_text(json.dumps(res, indent=1))
    L = [f"# Attention kernels on the CPU ({res['date']}, {res['machine']}, {res['threads']} threads)", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`; torch {res['torch']}. One attention block of "
         "each preset's U-Net (8-channel heads), median ms over interleaved rounds; train = forward + backward, "
         "sample = forward only at twice the batch. `auto` = `--attention_impl auto` (the default). Load average "
         f"{'/'.join(f'{v:.1f}' for v in load0)} at start.", "",
         "| block | tokens | mode | " + " | ".join(v[0] for v in VARIANTS) + " |",
         "|---|---|---|" + "---|" * len(VARIANTS)]
    for (case, mode) in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        sel = {r["variant"]: r for r in rows if r["case"] == case and r["mode"] == mode}
        L.append(f"| {case} | {next(iter(sel.values()))['tokens']} | {mode} | " + " | ".join(ms_cells(sel, VARIANTS))
                 + " |")
    L += ["", "Blocked `matmul_attention` (training, forward + backward, bf16) against the score bytes per thread of "
          f"each group of heads (`BLOCK_SCORE_BYTES_PER_THREAD`; the default, {default_mib:g} MiB, in the header "
          "with a *):", "",
          "| block | tokens | " + " | ".join(f"{v[0]}{'*' if mib == default_mib else ''}"
                                          for mib, v in zip(BUDGETS_MIB, budget_variants)) + " |",
          "|---|---|" + "---|" * len(budget_variants)]
    for case in dict.fromkeys(r["case"] for r in sweep):
        sel = {r["variant"]: r for r in sweep if r["case"] == case}
        L.append(f"| {case} | {next(iter(sel.values()))['tokens']} | " + " | ".join(ms_cells(sel, budget_variants))
                 + " |")
    (args.out / "attention.md").write_text("\n".join(L) + "\n")
    print("\n".join(L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
