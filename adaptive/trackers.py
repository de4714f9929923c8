"""Every call to the run's trackers (Accelerate's: TensorBoard, W&B, or none), and nothing tracker-specific
anywhere else: the tracker package check, opening the trackers (a resumed run purges the steps it re-trains), the
config they record, the per-step scalars, the per-timestep-bin diagnostics as one histogram each per log step, the
sample grids and the evaluation score. stats.jsonl keeps everything; the trackers get what people plot.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ConfigError
from .model_card import public_config

TRACKED = ("loss", "lr", "grad_norm", "img_per_s")  # the per-step scalars people plot


def check_installed(logger: str) -> None:
    """ConfigError (one line) when --logger names a tracker whose package is not installed."""
    if logger == "wandb":
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise ConfigError("--logger wandb needs the wandb package (pip install wandb)") from None


def tracker_config(cfg) -> dict:
    """Flat scalar config for trackers (TensorBoard hparams accept int/float/str/bool only); no secrets, and local
    paths redacted as in the published config (`model_card.public_config`): the logs go to the Hub with the model."""
    public = public_config(cfg.to_dict(), Path(cfg.output_dir))
    return {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in public.items()}


def open_trackers(accelerator, cfg, resumed_at=None) -> None:
    """Start the trackers with the run's config. Resumed at step s: TensorBoard hides the events a previous process
    logged after s (a later branch, or the steps after the last checkpoint of a killed run), so no chart holds a step
    twice (SummaryWriter's purge_step)."""
    accelerator.init_trackers(cfg.tracker_project_name, config=tracker_config(cfg),
                              init_kwargs={"tensorboard": {"purge_step": resumed_at + 1}} if resumed_at is not None
                              else {})


def tracker_values(record: dict, timestep_bins: bool) -> dict:
    """Tracker scalars of a log record: loss, lr, grad_norm, img_per_s; with `timestep_bins` also the timestep
    diagnostics' scalars under timesteps/ (the per-bin lists go as one histogram each: `log_bins`). stats.jsonl keeps
    everything."""
    out = {k: record[k] for k in TRACKED if isinstance(record.get(k), (int, float))}
    if timestep_bins:
        for k, v in record.items():
            if k in TRACKED or k in ("step", "images", "train_seconds", "world_size"):
                continue
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[f"timesteps/{k}"] = v
    return out


def log_step(accelerator, record: dict, step: int, timestep_bins: bool, num_timesteps: int) -> None:
    """One log step's scalars (`tracker_values`) and, with `timestep_bins`, its per-bin histograms (`log_bins`)."""
    accelerator.log(tracker_values(record, timestep_bins), step=step)
    if timestep_bins and accelerator.is_main_process:
        log_bins(accelerator, record, step, num_timesteps)


def bin_lists(record: dict) -> dict[str, list[float]]:
    """The per-timestep-bin diagnostics of a log record (loss_by_t, p_by_t, ...; p_heatmap is the heat-map's), a bin
    not measured yet (None) as 0."""
    return {k: [0.0 if x is None else x for x in v] for k, v in record.items()
            if isinstance(v, list) and k != "p_heatmap" and v
            and all(x is None or isinstance(x, (int, float)) for x in v)}


def log_bins(accelerator, record: dict, step: int, num_timesteps: int) -> None:
    """Each per-bin diagnostic as one histogram over t per log step (x = timestep, height = the bin's value), to the
    trackers that draw histograms (TensorBoard, W&B), instead of one scalar chart per bin."""
    lists = bin_lists(record)
    if not lists:
        return
    for tracker in accelerator.trackers:
        for name, values in lists.items():
            v = np.asarray(values, dtype=np.float64)
            edges = np.linspace(0, num_timesteps, len(v) + 1)
            if tracker.name == "tensorboard":
                centres = (edges[:-1] + edges[1:]) / 2
                tracker.writer.add_histogram_raw(
                    f"timesteps/{name}", min=0.0, max=float(num_timesteps), num=float(v.sum()),
                    sum=float((v * centres).sum()), sum_squares=float((v * centres**2).sum()),
                    bucket_limits=edges[1:].tolist(), bucket_counts=v.tolist(), global_step=step)
            elif tracker.name == "wandb":
                import wandb

                tracker.log({f"timesteps/{name}": wandb.Histogram(np_histogram=(v, edges))}, step=step)


def log_grid(accelerator, grid, step: int) -> None:
    """A sample grid (uint8 [H, W, 3]) to every tracker that takes images (TensorBoard, W&B) as 'samples'."""
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            tracker.log_images({"samples": grid[None]}, step=step, dataformats="NHWC")
        elif hasattr(tracker, "log_images"):
            tracker.log_images({"samples": [grid]}, step=step)


def log_score(accelerator, metric: str, value: float, step: int) -> None:
    """The in-training evaluation's score (the trackers plot the score only; stats.jsonl keeps the rest)."""
    accelerator.log({f"eval/{metric}": value}, step=step)
