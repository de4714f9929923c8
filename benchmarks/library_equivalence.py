#!/usr/bin/env python
"""Where the project keeps its own code instead of the library call, measured: equal results? faster?

    python benchmarks/library_equivalence.py                      # -> docs/benchmarks/library/<date>/
    python benchmarks/library_equivalence.py --quick --out /tmp/x   # CI smoke test

1. EMA: adaptive.ema.EMA (torch._foreach_lerp_) vs diffusers.training_utils.EMAModel(foreach=True), 50 updates of
   the cpu-tiny16 U-Net's parameters, power and ratio warm-up: bit-identical? largest difference?
2. Forward process: adaptive.losses.q_sample on float64-computed tables vs DDPMScheduler.add_noise: largest
   difference over all T; CPU time per call at batch 128.
The image sampler calls DDPMScheduler.step itself since the 2026-12-01 table (its own step was no faster beyond the
rounds' spread), so that pair is no longer measured.
Output: results.json, README.md, library.png.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import diffusers
import torch
from diffusers.training_utils import EMAModel

from adaptive.attention import configure_attention
from adaptive.config import PRESETS, TrainConfig
from adaptive.ema import EMA
from adaptive.losses import DiffusionTables, q_sample
from adaptive.model import build_noise_scheduler, build_unet
from benchmarks import same_tree

same_tree(__file__)  # this tree's adaptive and benchmarks, not another worktree's

ROOT = Path(__file__).resolve().parents[1]


def tiny_unet():
    cfg = TrainConfig(**PRESETS["cpu-tiny16"])
    torch.manual_seed(0)
    return configure_attention(build_unet(cfg), "auto", "cpu").eval(), build_noise_scheduler(cfg)


def ema_equivalence(updates: int) -> dict:
    out = {}
    for warmup in ("power", "ratio"):
        model, _ = tiny_unet()
        ours = EMA(model, 0.9999, 0.0, warmup)
        lib = EMAModel(model.parameters(), decay=0.9999, use_ema_warmup=warmup == "power", inv_gamma=1.0, power=0.75,
                       foreach=True)
        g = torch.Generator().manual_seed(1)
        differing, worst = 0, 0.0
        for _ in range(updates):
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn(p.shape, generator=g) * 1e-2)
            ours.update(model)
            lib.step(model.parameters())
            diff = max((a - b).abs().max().item() for a, b in zip(ours.model.parameters(), lib.shadow_params))
            differing += diff > 0
            worst = max(worst, diff)
        out[warmup] = {"updates": updates, "updates_with_a_difference": differing, "max_abs_difference": worst,
                       "bit_identical": differing == 0}
    return out


def cpu_time(fn, repeats: int) -> float:
    """Median process CPU seconds of fn() over `repeats` calls."""
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def forward_process(repeats: int) -> dict:
    _, sched = tiny_unet()
    tables = DiffusionTables.build(sched.alphas_cumprod, TrainConfig(**PRESETS["cpu-tiny16"]), "cpu")
    g = torch.Generator().manual_seed(2)
    x0, noise = torch.randn(128, 3, 16, 16, generator=g), torch.randn(128, 3, 16, 16, generator=g)
    worst = 0.0
    for start in range(0, 1000, 128):
        t = torch.arange(start, min(1000, start + 128))
        ours = q_sample(x0[: len(t)], noise[: len(t)], tables.sqrt_abar[t], tables.sqrt_one_minus_abar[t])
        lib = sched.add_noise(x0[: len(t)], noise[: len(t)], t)
        worst = max(worst, (ours - lib).abs().max().item())
    t = torch.randint(0, 1000, (128,), generator=g)
    return {"max_abs_difference": worst, "bit_identical": worst == 0.0,
            "ours_cpu_ms": 1e3 * cpu_time(lambda: q_sample(x0, noise, tables.sqrt_abar[t],
                                                           tables.sqrt_one_minus_abar[t]), repeats),
            "library_cpu_ms": 1e3 * cpu_time(lambda: sched.add_noise(x0, noise, t), repeats)}


def write_report(res: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    e, q = res["ema"], res["forward_process"]
    lines = [f"# Library calls vs our code ({res['date']}){' - QUICK SMOKE TEST' if res['quick'] else ''}", "",
             f"Command: `{res['command']}`, commit `{res['git_commit']}`, torch {res['versions']['torch']}, "
             f"diffusers {res['versions']['diffusers']}; CPU time of one thread. Raw numbers: `results.json`.", "",
             "| what | ours | library | equal? | largest difference | time ours | time library |",
             "|---|---|---|---|---|---|---|"]
    for w, v in e.items():
        equal = "bit-identical" if v["bit_identical"] else f"no ({v['updates_with_a_difference']} updates differ)"
        lines.append(f"| EMA, {w} warm-up, {v['updates']} updates | `EMA` (`_foreach_lerp_`) | "
                     f"`EMAModel(foreach=True)` | {equal} | {v['max_abs_difference']:.3g} | - | - |")
    lines.append(f"| forward process, all T | `q_sample` (float64-built tables) | `DDPMScheduler.add_noise` | "
                 f"{'bit-identical' if q['bit_identical'] else 'no'} | {q['max_abs_difference']:.3g} | "
                 f"{q['ours_cpu_ms']:.3f} ms | {q['library_cpu_ms']:.3f} ms |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=110)
    ax.bar(["q_sample (ms)", "add_noise (ms)"], [q["ours_cpu_ms"], q["library_cpu_ms"]], color=["C0", "C1"])
    ax.set_ylabel("CPU time (one thread)")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "library.png")
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    out = args.out or ROOT / "docs" / "benchmarks" / "library" / dt.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    q = args.quick
    res = {"date": dt.date.today().isoformat(), "quick": q,
           "command": " ".join(["python", "benchmarks/library_equivalence.py", *(argv or sys.argv[1:])]),
           "git_commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip(),
           "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
           "ema": ema_equivalence(5 if q else 50),
           "forward_process": forward_process(3 if q else 50)}
    (out / "results.json").write_text(json.dumps(res, indent=1))
    write_report(res, out)
    print((out / "README.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
