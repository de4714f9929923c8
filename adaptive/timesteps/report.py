"""What the user sees of the timestep sampler: its diagnostics as logged numbers and the p(t) heat-map (what goes to
the trackers is adaptive/trackers.py's).

Once per log step `TimestepReport.record(sampler, step)` turns `sampler.diagnostics()` into plain numbers with one
host sync, p(t) in HEATMAP_BINS bins among them (`p_heatmap`), all of which go to stats.jsonl; `save_heatmap` draws
the heat-map from stats.jsonl, so it holds the run's whole history across resumes (matplotlib, Agg backend).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch

from .base import bin_sum

HEATMAP_BINS = 50  # timestep bins of the p(t) heat-map


class TimestepReport:
    """The per-log-step numbers of the timestep sampler."""

    def record(self, sampler, step: int) -> dict:
        """The sampler's diagnostics as plain numbers (per-bin ones as lists, p(t) in HEATMAP_BINS bins as
        `p_heatmap`); one host sync."""
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
        out["p_heatmap"] = flat[pos:]
        return out


def heatmap_rows(stats_path: Path) -> list[tuple[int, list[float]]]:
    """(step, p in HEATMAP_BINS bins) of every stats.jsonl row that has `p_heatmap`: the whole run, across resumes
    (a resumed run's stats.jsonl holds each step once)."""
    rows = []
    if Path(stats_path).exists():
        for line in Path(stats_path).read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line torn by a kill
            if isinstance(r, dict) and isinstance(r.get("p_heatmap"), list) and isinstance(r.get("step"), int):
                rows.append((r["step"], r["p_heatmap"]))
    return rows


def save_heatmap(stats_path: Path, path: Path, num_timesteps: int, title: str) -> Optional[Path]:
    """The p(t) heat-map of `heatmap_rows`, its x-axis from the first to the last logged step; None when there is no
    row yet."""
    rows = heatmap_rows(stats_path)
    if not rows or len({len(p) for _, p in rows}) != 1:
        return None
    return save_p_heatmap([s for s, _ in rows], [p for _, p in rows], num_timesteps, path, title=title)


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
    ax.set_xlim(float(steps[0]) if len(steps) > 1 else x[0], float(steps[-1]) if len(steps) > 1 else x[-1])
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("timestep t")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
