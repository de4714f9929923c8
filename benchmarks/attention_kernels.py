#!/usr/bin/env python
"""One attention block of our U-Nets, each kernel x precision, interleaved in one process: forward+backward
(training) and forward only (sampling). The measurement behind `--attention_impl auto` (adaptive/model.py).

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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adaptive.model import configure_attention  # noqa: E402

# (label, batch, channels, side): the attention blocks of cpu-tiny16 (64 tokens), cpu-tiny (256) and ddpm-cifar10 (256)
CASES = [("cpu-tiny16", 128, 64, 8), ("cpu-tiny", 128, 64, 16), ("ddpm-cifar10", 16, 256, 16)]
# (label, attention_impl, autocast bf16?)
VARIANTS = [("classic bf16", "classic", True), ("matmul bf16", "matmul", True), ("sdpa bf16", "sdpa", True),
            ("sdpa fp32", "sdpa", False), ("auto bf16", "auto", True)]


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


def measure(rounds: int, reps: int, cases=CASES) -> list[dict]:
    rows = []
    for label, batch, channels, side in cases:
        block = Block(channels)
        for mode in ("train", "sample"):
            x = torch.randn(2 * batch if mode == "sample" else batch, channels, side, side, requires_grad=mode == "train")
            times: dict[str, list[float]] = {v[0]: [] for v in VARIANTS}
            for _ in range(rounds):  # interleaved: load changes hit every variant
                for name, impl, bf16 in VARIANTS:
                    configure_attention(block, impl, "cpu")

                    def step():
                        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16), torch.set_grad_enabled(mode == "train"):
                            y = block.attn(x)
                        if mode == "train":
                            y.float().sum().backward()

                    times[name].append(time_ms(step, reps))
            for name, ts in times.items():
                rows.append({"case": label, "tokens": side * side, "channels": channels, "batch": x.shape[0], "mode": mode,
                             "variant": name, "ms": statistics.median(ts), "all_ms": ts})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "throughput" / dt.date.today().isoformat())
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    cases = [("tiny", 4, 32, 8)] if args.quick else CASES
    rounds, reps = (1, 1) if args.quick else (args.rounds, args.reps)
    import compare_methods as cm

    load0 = os.getloadavg()
    rows = measure(rounds, reps, cases)
    res = {"date": dt.date.today().isoformat(), "command": " ".join(["python", "benchmarks/attention_kernels.py", *(argv or sys.argv[1:])]),
           "git_commit": cm.git("rev-parse", "HEAD"), "machine": cm.machine()["cpu"], "threads": torch.get_num_threads(),
           "torch": torch.__version__, "load_average_start": load0, "load_average_end": os.getloadavg(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "attention.json").write_text(json.dumps(res, indent=1))
    L = [f"# Attention kernels on the CPU ({res['date']}, {res['machine']}, {res['threads']} threads)", "",
         f"Command: `{res['command']}`; commit `{res['git_commit']}`; torch {res['torch']}. One attention block of each "
         "preset's U-Net (8-channel heads), median ms over interleaved rounds; train = forward + backward, sample = "
         "forward only at twice the batch. `auto` = `--attention_impl auto` (the default). Load average "
         f"{'/'.join(f'{v:.1f}' for v in load0)} at start.", "",
         "| block | tokens | mode | " + " | ".join(v[0] for v in VARIANTS) + " |", "|---|---|---|" + "---|" * len(VARIANTS)]
    for (case, mode) in dict.fromkeys((r["case"], r["mode"]) for r in rows):
        sel = {r["variant"]: r for r in rows if r["case"] == case and r["mode"] == mode}
        best = min(r["ms"] for r in sel.values())
        cells = [f"**{sel[v[0]]['ms']:.0f}**" if sel[v[0]]["ms"] == best else f"{sel[v[0]]['ms']:.0f}" for v in VARIANTS]
        L.append(f"| {case} | {next(iter(sel.values()))['tokens']} | {mode} | " + " | ".join(cells) + " |")
    (args.out / "attention.md").write_text("\n".join(L) + "\n")
    print("\n".join(L[-(len(rows) // len(VARIANTS)) - 2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
