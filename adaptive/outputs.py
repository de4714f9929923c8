"""What the training loop writes at its save points: sample grids with the p(t) heat-map, post-hoc EMA snapshots,
checkpoints, exports (queued for the Hub) and in-training evaluations, each when due (`save_due`, `finish`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from .build import Run
from .checkpoint import save_checkpoint
from .export import export_pipeline
from .faults import writing
from .guard import check_finite, rotate_checkpoints
from .image_sampler import generate_distributed, save_grid
from .rundir import artifact, discard_aside
from .session import Session
from .timesteps.report import save_heatmap
from .trackers import log_grid, log_score


def every(step: int, interval: Optional[int]) -> bool:
    return bool(interval) and step % interval == 0


def save_due(run: Run, session: Session, unet, done: bool) -> None:
    """The saves due after this step (the last one when `done`): sample grid, post-hoc EMA snapshot, checkpoint,
    export; the weights are checked finite first."""
    cfg, step = run.cfg, run.progress.step
    grid_due = every(step, cfg.save_images_steps) and not done
    snapshot_due = run.phema is not None and every(step, cfg.ema_snapshot_steps)
    checkpoint_due = every(step, cfg.checkpointing_steps) or done
    export_due = every(step, cfg.save_model_steps) and not done
    if grid_due or snapshot_due or checkpoint_due or export_due:
        check_finite(run, session)
    if grid_due:
        preview(run, session, unet)
    if snapshot_due and run.accelerator.is_main_process:
        save_snapshots(run)
    if checkpoint_due:
        checkpoint(run, session)
    if export_due:
        publish(run, session, unet, f"pipeline at step {step}")


def finish(run: Run, session: Session, unet) -> None:
    """The end of a run that was not preempted: the last snapshot, the final grid and export, and (finished in
    range) the checkpoint limit held exactly."""
    cfg, acc, step = run.cfg, run.accelerator, run.progress.step
    if run.phema is not None and acc.is_main_process and not every(step, cfg.ema_snapshot_steps):
        save_snapshots(run)
    grid = preview(run, session, unet)
    publish(run, session, unet, f"final pipeline at step {step}", grid)
    rotate_checkpoints(run, session, exact=True)


def evaluate(run: Run, session: Session, unet) -> None:
    """FID / proxy FD of `unet` (every rank samples; the main process scores and records)."""
    progress = run.progress
    metrics = session.evaluator(unet, run.noise_scheduler.config)
    if not metrics:
        return
    record = {"step": progress.step, "images": progress.images_seen, "train_seconds": round(progress.train_seconds, 3),
              **metrics}
    session.stats_file.write(record)  # everything, bookkeeping included (images, steps, seconds)
    metric = session.evaluator.featnet.metric
    log_score(run.accelerator, metric, metrics[metric], progress.step)
    session.last_metrics = record
    session.log(f"eval at step {progress.step}: {metric}={metrics[metric]:.4f} ({metrics['eval_images']} images, "
                f"{metrics['eval_seconds']}s)")


def preview(run: Run, session: Session, unet) -> Optional[Path]:
    """EMA sample grid from fixed seeds 0..N-1 (comparable over time; all ranks share the sampling) and the p(t)
    heat-map; returns the grid's path on the main process."""
    cfg = run.cfg
    images = generate_distributed(run.accelerator, unet, run.noise_scheduler.config, list(range(cfg.num_grid_images)),
                                  cfg.ddpm_num_inference_steps, batch_size=max(1, min(256, cfg.num_grid_images)))
    if not run.accelerator.is_main_process:
        return None
    out = Path(cfg.output_dir)
    with writing(f"the sample grid of step {run.progress.step}", out, "checkpoints are unaffected"):
        save_heatmap(artifact(out, "stats"), artifact(out, "heatmap"), cfg.ddpm_num_steps,
                     f"p(t) over training - {run.timesteps.name}")
        path = save_grid(images, artifact(out, "samples") / f"grid_{run.progress.step:07d}.png")
    log_grid(run.accelerator, np.asarray(Image.open(path)), run.progress.step)
    return path


def save_snapshots(run: Run) -> None:
    """Post-hoc EMA snapshots (main process)."""
    out = Path(run.cfg.output_dir)
    with writing(f"the post-hoc EMA snapshots of step {run.progress.step}", out, "checkpoints are unaffected"):
        run.phema.save_snapshots(artifact(out, "ema_snapshots"))


def checkpoint(run: Run, session: Session) -> None:
    """checkpoint-<step> (every rank; its time counts as training time, unlike evaluation and previews: a
    budget or a wall-clock comparison pays for it); pushed too with --push_checkpoints."""
    t0 = time.perf_counter()
    path = save_checkpoint(run.accelerator, Path(run.cfg.output_dir), run.progress.step, run.cfg.to_dict(),
                           run.cfg.checkpoints_total_limit, protect=session.loss_range.protected(),
                           left_range_at=session.loss_range.left_at)
    run.progress.train_seconds += time.perf_counter() - t0
    session.last_checkpoint = run.progress.step
    session.log(f"saved {path}" + ("" if session.loss_range.left_at is None else
                                   " (the loss is out of its running range: marked, so `latest` skips it)"))
    if session.replacing:  # the new run has a checkpoint: the run it replaces can go
        if run.accelerator.is_main_process:
            discard_aside(Path(run.cfg.output_dir))
        session.replacing = False
    if session.uploader is not None and run.cfg.push_checkpoints:
        session.uploader.push(Path(run.cfg.output_dir), f"checkpoint at step {run.progress.step}")


def publish(run: Run, session: Session, unet, message: str, grid: Optional[Path] = None) -> None:
    """Export the DDPMPipeline of `unet` with its model card (main process) and queue its upload."""
    if not run.accelerator.is_main_process:
        return
    export_pipeline(run.cfg, unet, run.noise_scheduler, run.progress, {**session.info, "grid": grid},
                    session.last_metrics)
    if session.uploader is not None:
        session.uploader.push(Path(run.cfg.output_dir), message)
