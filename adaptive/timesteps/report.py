"""What the user sees of the timestep sampler: its diagnostics as logged numbers, tracker scalars, and the p(t)
heat-map.

Once per log step `TimestepReport.record(sampler, step)` turns `sampler.diagnostics()` into plain numbers with one
host sync and keeps a row of the p(t) history; `save_heatmap` draws that history (matplotlib, Agg backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .base import bin_sum

HEATMAP_BINS = 50  # timestep bins of the p(t) heat-map


class TimestepReport:
    """The p(t) history of a run (step, p in HEATMAP_BINS bins) and the per-log-step numbers."""

    def __init__(self):
        self.history: list[tuple[int, list[float]]] = []

    def record(self, sampler, step: int) -> dict:
        """The sampler's diagnostics as plain numbers (per-bin ones as lists); one host sync."""
        diag = sampler.diagnostics()
        p_fine = bin_sum(diag.pop("p"), HEATMAP_BINS)
        names = sorted(diag)
        # sync point: log step
        flat = torch.cat([diag[n].reshape(-1).float() for n in names] + [p_fine.float()]).tolist()
        out, pos = {}, 0
        for n in names:
            size = diag[n].numel()
            out[n] = flat[pos] if diag[n].dim() == 0 else flat[pos : pos + size]
            pos += size
        self.history.append((step, flat[pos:]))
        return out

    def save_heatmap(self, path: Path, num_timesteps: int, title: str) -> None:
        if self.history:
            save_p_heatmap([s for s, _ in self.history], [p for _, p in self.history], num_timesteps, path, title=title)


TRACKED = ("loss", "lr", "grad_norm", "img_per_s")  # the per-step scalars people plot


def tracker_values(record: dict, timestep_bins: bool) -> dict:
    """Tracker scalars of a log record: loss, lr, grad_norm, img_per_s; with `timestep_bins` also the timestep
    diagnostics under timesteps/ (per-bin lists as timesteps/<name>_<bin>). stats.jsonl keeps everything."""
    out = {k: record[k] for k in TRACKED if isinstance(record.get(k), (int, float))}
    if timestep_bins:
        for k, v in record.items():
            if k in TRACKED or k in ("step", "images", "train_seconds", "world_size"):
                continue
            if isinstance(v, list):
                out.update({f"timesteps/{k}_{i}": x for i, x in enumerate(v) if x is not None})
            elif isinstance(v, (int, float)):
                out[f"timesteps/{k}"] = v
    return out


def log_grid(accelerator, grid, step: int) -> None:
    """A sample grid (uint8 [H, W, 3]) to every tracker that takes images (TensorBoard, W&B) as 'samples'."""
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({"samples": grid[None]}, step=step, dataformats="NHWC")
        elif hasattr(tracker, "log_images"):
            tracker.log_images({"samples": [grid]}, step=step)


def save_p_heatmap(steps: Sequence[int], probs: np.ndarray, num_timesteps: int, path: str | Path,
                   title: str = "timestep sampling density p(t) x T") -> Path:
    """Heat-map of the proposal over training: x = optimizer step, y = timestep, colour = T p(t) (1 = uniform)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probs = np.asarray(probs, dtype=np.float64)  # [n_steps, bins], rows sum to 1
    bins = probs.shape[1]
    density = probs * bins
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=110)
    x = np.asarray(steps, dtype=np.float64)
    if len(x) == 1:
        x = np.array([x[0] - 0.5, x[0] + 0.5])
        density = np.repeat(density, 2, axis=0)
    mesh = ax.pcolormesh(x, (np.arange(bins) + 0.5) * num_timesteps / bins, density.T, shading="nearest",
                         cmap="viridis", vmin=0, vmax=max(2.0, float(np.nanmax(density))))
    fig.colorbar(mesh, ax=ax, label="T p(t)  (1 = uniform)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("timestep t")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
