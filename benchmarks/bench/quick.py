"""compare_methods.py --quick: generated images, a small TorchScript feature network and a few steps, so that CI
exercises every stage (costs, runs with resume, report) in minutes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from .provenance import ROOT


class Feat(torch.nn.Module):
    """A random conv feature network standing in for the proxy-FD features."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 16, 3, padding=1)

    def forward(self, x):
        x = torch.nn.functional.interpolate(x / 255.0, size=(16, 16), mode="bilinear", antialias=True)
        return torch.relu(self.conv(x)).mean((2, 3))


def write_images(folder: Path, n: int = 64) -> None:
    """n flat-coloured noisy 32 px images."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        img = (rng.random((1, 1, 3)) * 255 + rng.normal(0, 20, (32, 32, 3))).clip(0, 255).astype("uint8")
        Image.fromarray(img).save(folder / f"{i:03d}.png")


def quick_setup(args) -> None:
    """Point `args` at generated data and features, and shrink every stage to a few steps."""
    work = args.work or ROOT / "benchmarks" / "_work" / "quick"
    write_images(work / "data" / "a")
    torch.jit.script(Feat()).save(str(work / "feat.pt"))
    args.data, args.feature_extractor = work / "data", work / "feat.pt"
    args.work = work / "runs"
    args.out = args.out or work / "report"
    args.budget_steps = 8
    args.seeds = args.seeds if args.seeds != [0, 1, 2] else [0]
    args.methods = args.methods or ["uniform", "adaptive"]
    args.cost_blocks, args.cost_block_steps = 2, 2
    args.checkpointing_steps = 4
    args.extra = ["--train_batch_size", "16", "--eval_num_images", "32", "--eval_ref_num_images", "64",
                  "--eval_inference_steps", "5", "--num_grid_images", "4", "--ddpm_num_inference_steps", "5",
                  "--lr_warmup_steps", "2", "--logging_steps", "2", *args.extra]
