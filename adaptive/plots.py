"""Plots written into run folders and benchmark outputs (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np


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
