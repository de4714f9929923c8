"""The training loop: `train()` reads top to bottom; `optimizer_step()` is one step; the helpers below each do one
thing the loop calls by name. Everything the loop works with is built by `adaptive.build.setup`."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from PIL import Image

from .build import Run, apply_optimizer_settings, check_buildable, planned_steps, run_fraction, setup
from .checkpoint import (checkpoint_step, list_checkpoints, load_checkpoint, mark_out_of_range, out_of_range,
                         read_progress, rotate, save_checkpoint)
from .config import ConfigError, TrainConfig
from .control import StopControl
from .data import Layout, open_entries
from .faults import Diverged, writing
from .image_sampler import generate_distributed, save_grid
from .losses import per_sample_mse, q_sample, training_target
from .export import export_pipeline, finished_run
from .hub import connect_hub
from .rundir import artifact, check_output_dir, discard_aside, fresh_start_line
from .seeding import generator, seed_for
from .session import (RANGE_FACTOR, Session, end, main_process_logger, nothing_to_train, restore_replaced_run,
                      start_session)
from .timesteps.base import DIAGNOSTIC_BINS, Draw, DrawRequest, asked
from .timesteps.report import log_bins, log_grid, save_heatmap, tracker_values


def optimizer_step(run: Run, step: int, micro_batches: list[torch.Tensor]):
    """One optimizer step over this rank's micro-batches; returns (local per-sample losses [accum * B], grad norm).
    The timestep sampler is called three times: draw, around the update, observe (adaptive/timesteps/base.py)."""
    cfg, acc, layout, timesteps = run.cfg, run.accelerator, run.layout, run.timesteps
    rank = acc.process_index

    # Draw this step's timesteps and loss multipliers (this rank's rows of a global draw identical on every rank)
    # and the noise for the global batch.
    g = generator(acc.device, cfg.seed, "step", step)
    request = DrawRequest(layout.global_batch, tuple(layout.slice(i, rank) for i in range(len(micro_batches))), g,
                          micro_generator=lambda i: generator(acc.device, cfg.seed, "t", step, i, rank),
                          **asked(timesteps.needs, step=step, fraction=run_fraction(run, step), batch=micro_batches))
    draw = timesteps.draw(request)  # t, m: [accum * B]
    noise_all = torch.randn((layout.global_batch, 3, cfg.resolution, cfg.resolution), generator=g, device=acc.device)
    torch.manual_seed(seed_for(cfg.seed, "dropout", rank, step))  # dropout masks: (seed, rank, step)

    # Evaluate the loss and accumulate gradients over this rank's micro-batches.
    local = [micro_step(run, micro, x0, draw, noise_all) for micro, x0 in enumerate(micro_batches)]
    losses, local_t = torch.cat([loss for loss, _ in local]), torch.cat([t for _, t in local])

    # Optimizer step (pre-clip global norm; without clipping the call only measures it), LR schedule, EMA.
    with timesteps.around_update(run.unet, acc, draw):
        clip = cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf
        grad_norm = acc.clip_grad_norm_(run.model.parameters(), clip)
        run.optimizer.step()
        run.lr_scheduler.step()
        run.optimizer.zero_grad(set_to_none=True)
    for avg in (run.ema, run.phema):
        if avg is not None:
            avg.update(run.unet)

    # Timestep-sampler update from the global batch.
    timesteps.observe(*gather_global_batch(acc, layout, local_t, losses), **asked(timesteps.needs, grad_norm=grad_norm))
    return losses, grad_norm


def micro_step(run: Run, micro: int, x0: torch.Tensor, draw: Draw, noise_all: torch.Tensor):
    """Forward and backward of one micro-batch x0 [B, 3, S, S] (uint8 -> [-1, 1] already); returns its per-sample
    objective losses w(t) MSE_t [B] (detached) and timesteps [B]."""
    cfg, acc, tables = run.cfg, run.accelerator, run.tables
    t, m = draw.micro(micro, run.layout.batch_size)
    noise = noise_all[run.layout.slice(micro, acc.process_index)]
    sa, s1 = tables.sqrt_abar[t], tables.sqrt_one_minus_abar[t]
    with acc.accumulate(run.model):
        x_t = q_sample(x0, noise, sa, s1)  # [B, 3, S, S]
        if cfg.channels_last:
            x_t = x_t.contiguous(memory_format=torch.channels_last)
        pred = run.model(x_t, t).sample
        loss_b = tables.weight[t] * per_sample_mse(pred, training_target(cfg.prediction_type, x0, noise, sa, s1))
        acc.backward((m * loss_b).mean())
    run.stats.report_binned("loss_by_t", t * DIAGNOSTIC_BINS // cfg.ddpm_num_steps, loss_b, DIAGNOSTIC_BINS)
    return loss_b.detach(), t


def gather_global_batch(accelerator, layout, local_t: torch.Tensor, losses: torch.Tensor):
    """(t [G], loss [G]) of the global batch on every rank, in the (micro, rank, i) order of the global draw."""
    world = accelerator.num_processes
    if world == 1:
        return local_t, losses

    def order(x):  # gather is rank-major [world, accum * B]; the global draw is (micro, rank, i)
        return accelerator.gather(x).view(world, layout.accum, layout.batch_size).transpose(0, 1).reshape(-1)

    return order(local_t), order(losses)


def train(cfg: TrainConfig, control: Optional[StopControl] = None) -> dict:
    """Train as configured; returns a summary (final step, train seconds, why it stopped). `control`: the stop
    signals' handler, if the caller installed it earlier (train_accelerate.py does, before importing torch)."""
    log = main_process_logger()
    control = control or StopControl()

    # Check the model flags, the output folder, the data source and (main process) the Hub token and repo before
    # anything starts (bad input: one line, nothing touched; a replaced run is cleared only right before training,
    # in start_session).
    check_buildable(cfg)
    resume_from = check_output_dir(cfg, log)
    entries = open_entries(cfg)
    uploader, hub_error = connect_hub(cfg, log)

    # A finished run rerun: nothing to train, decided from its checkpoint before any image is decoded (every rank
    # reads the same checkpoint, so every rank returns here; no process group has been formed).
    finished = finished_checkpoint(cfg, resume_from, len(entries))
    if finished is not None:
        control.restore_handlers()
        if hub_error:
            raise ConfigError(hub_error)
        return nothing_to_train(cfg, *finished, log, uploader)

    # A fresh start says so at once, so that a forgotten --output_dir or preset is visible before any step.
    if resume_from is None:
        log(fresh_start_line(cfg))

    # Build everything: accelerator, data, model, EMA, optimizer, LR schedule, timestep sampler; lock the folder.
    run = setup(cfg, log, entries, main_error=hub_error)
    cfg, acc = run.cfg, run.accelerator

    # Resume (or start), record the run, open the trackers, evaluator and uploader.
    if resume_from is not None:
        load_checkpoint(acc, resume_from)
        apply_optimizer_settings(run)  # a changed --learning_rate / --adam_* applies from here on
    try:
        session = start_session(run, resume_from, log, control, uploader)
        sampling_unet = run.ema.model if run.ema else run.unet  # previews, evaluation and export use the EMA weights

        # Training loop, until the planned step count or a stop (signal, --max_train_minutes).
        train_steps(run, session, sampling_unet)

        # Final grid, snapshot and export (skipped when preempted: the checkpoint is what matters then). The signal
        # handlers stay until end(): a signal now lets the export finish.
        preempted = session.control.preempted
        if not preempted:
            finish(run, session, sampling_unet)
        return end(run, session, "preempted" if preempted else None)
    finally:  # however it ends: before its first checkpoint, the run --overwrite_output_dir was replacing goes back
        restore_replaced_run(cfg, log)  # (nothing to do once this run has a checkpoint: the old run is deleted then)


def train_steps(run: Run, session: Session, sampling_unet) -> None:
    """The training loop: optimizer steps with their statistics, evaluations and saves, until run.max_steps or a
    stop (a signal or --max_train_minutes); a stop checkpoints first unless the run has nothing of its own yet."""
    cfg, progress, log = run.cfg, run.progress, session.log
    batches = run.data.batches(progress.step)
    while progress.step < run.max_steps:
        t_step = time.perf_counter()

        # One optimizer step: timesteps, noise, loss, backward, update, EMA, timestep-sampler update.
        losses, grad_norm = optimizer_step(run, progress.step, next(batches))
        progress.step += 1
        progress.images_seen += run.layout.global_batch
        run.stats.report("loss", losses)
        run.stats.report("grad_norm", grad_norm)
        progress.train_seconds += time.perf_counter() - t_step
        session.bar.update(1)

        # Statistics: one collective and one host sync per log step.
        if progress.step % cfg.logging_steps == 0 or progress.step == run.max_steps:
            log_statistics(run, session)

        # Evaluate: FID / proxy FD of the EMA model, logged with the training wall-clock (its own time excluded).
        if session.evaluator is not None and session.evaluator.due(progress.step):
            evaluate(run, session, sampling_unet)

        # Stop when asked to or out of budget; a run still replacing another has nothing of its own to keep yet.
        stop = session.control.should_stop(progress.train_seconds)
        if stop and session.control.preempted and session.replacing:
            log(f"stopping after step {progress.step}: {session.control.reason}; no checkpoint written; the run "
                "that --overwrite_output_dir was replacing goes back in place")
            break

        # Sample grid, post-hoc EMA snapshot, checkpoint, export (never from non-finite weights).
        save_due(run, session, sampling_unet, done=stop or progress.step >= run.max_steps)
        if stop:
            log(f"stopping after step {progress.step}: {session.control.reason}; checkpoint written, rerun "
                "the same command with --resume_from_checkpoint latest to continue")
            break
    session.bar.close()


# ------------------------------------------------------------------------------------------------ helpers


def finished_checkpoint(cfg: TrainConfig, resume_from: Optional[Path], num_images: int):
    """(progress, why) when the checkpoint to resume from ends a finished run (`export.finished_run`), read from its
    files before anything is built; else None."""
    if resume_from is None:
        return None
    progress = read_progress(resume_from)
    layout = Layout(cfg.train_batch_size, int(os.environ.get("WORLD_SIZE", "1")), cfg.gradient_accumulation_steps)
    why = finished_run(cfg, progress, planned_steps(cfg, num_images, layout))
    return (progress, why) if why else None


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


def rotate_checkpoints(run: Run, session: Session, exact: bool = False) -> None:
    """--checkpoints_total_limit (main process), only while the loss is in its running range: beyond the limit the
    newest checkpoint the loss vouches for is kept (session.LossRange), except at the end of a run (`exact`).
    save_checkpoint applies the same rule, with the same protection, right after each write."""
    limit = run.cfg.checkpoints_total_limit
    if limit and session.loss_range.left_at is None and run.accelerator.is_main_process:
        rotate(Path(run.cfg.output_dir), limit, None if exact else session.loss_range.protected())


def log_statistics(run: Run, session: Session) -> None:
    """Flush the step statistics (one collective, one host sync) and the timestep diagnostics to stats.jsonl, the
    trackers and the progress bar (or one line per log step when not on a terminal); then stop the run (Diverged,
    on every rank: the values are reduced) if the loss or the gradient norm was not finite."""
    progress = run.progress
    values = run.stats.flush(run.accelerator)
    values.update(session.report.record(run.timesteps, progress.step))
    record = {"step": progress.step, "images": progress.images_seen, "train_seconds": round(progress.train_seconds, 3),
              "lr": run.lr_scheduler.get_last_lr()[0], "world_size": run.accelerator.num_processes,
              "img_per_s": window_rate(session, progress), **values}
    session.window = (progress.train_seconds, progress.images_seen)
    session.stats_file.write(record)
    bins = run.cfg.log_timestep_bins or run.timesteps.tracks_by_default
    run.accelerator.log(tracker_values(record, bins), step=progress.step)
    if bins and run.accelerator.is_main_process:
        log_bins(run.accelerator, record, progress.step, run.cfg.ddpm_num_steps)
    loss = values.get("loss", math.nan)
    session.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{record['img_per_s']:.0f}", lr=f"{record['lr']:.2e}",
                            refresh=False)
    if session.bar.disable:
        session.log(f"step {progress.step}/{run.max_steps} loss={loss:.4f} img/s={record['img_per_s']:.0f} "
                    f"lr={record['lr']:.2e} train_time={progress.train_seconds:.0f}s")
    # fp16: the GradScaler skips steps with non-finite gradients itself (and lowers its scale), so only the loss
    checked = ("loss",) if run.accelerator.scaler is not None else ("loss", "grad_norm")
    bad = [f"{k} = {values[k]}" for k in checked if k in values and not math.isfinite(values[k])]
    first, session.logged_step = session.logged_step + 1, progress.step
    median = session.loss_range.observe(progress.step, loss) if "loss" in values else None
    if median is not None and run.accelerator.is_main_process:  # just left: `latest` skips what it does not vouch for
        lr_ = session.loss_range
        marked = mark_out_of_range(Path(run.cfg.output_dir), lr_.vouched_step, progress.step, lr_.resumed_at)
        if marked:
            session.log(f"marked {', '.join(marked)} (taken after the last in-range log step): `latest` skips them")
    if median is not None and not bad:
        session.log(f"warning: the loss left its running range at step {progress.step} ({loss:.3g}, over "
                    f"{RANGE_FACTOR:g}x the median {median:.3g} of the previous log steps): the newest checkpoint at "
                    f"or before step {session.loss_range.vouched_step} is kept from rotation until it returns")
    else:
        rotate_checkpoints(run, session)
    if bad:
        window = f" (mean over steps {first}-{progress.step})" if first < progress.step else ""
        raise diverged(run, session, f"{' and '.join(bad)} at step {progress.step}{window}")


def check_finite(run: Run, session: Session) -> None:
    """Before anything is written from the weights (grid, snapshot, checkpoint, export): Diverged if one is not
    finite (every rank: the weights are identical). Sync point: once per write, not per step."""
    finite = torch.stack([torch.isfinite(p).all() for p in run.unet.parameters()]).all()
    if not finite.item():
        raise diverged(run, session, f"non-finite weights after step {run.progress.step}")


def diverged(run: Run, session: Session, what: str) -> Diverged:
    """The one-line fault, naming the checkpoint to resume from: the newest, or while the loss is out of its running
    range the newest before it left it (else the newest written while it was in range: what `latest` resumes)."""
    protect = session.loss_range.protected() if session.loss_range.left_at is not None else None
    every_one = list_checkpoints(Path(run.cfg.output_dir))
    healthy = [p for p in every_one if out_of_range(p) is None]
    before = [p for p in healthy if protect is None or checkpoint_step(p) <= protect][-1:]
    which = "the newest checkpoint" if protect is None else "the newest checkpoint before the loss left its range"
    if not before and healthy:
        before, which = healthy[-1:], "the newest checkpoint written while the loss was in its range (`latest`)"
    after = " (every checkpoint was taken after the loss left its range)" if every_one else ""
    return Diverged(f"training diverged: {what}; nothing was saved from non-finite weights; "
                    + (f"resume from {before[0].name}, {which}, " if before else f"restart{after} ")
                    + "with a lower --learning_rate or gradient clipping (--max_grad_norm)")


def window_rate(session: Session, progress) -> float:
    """Training images per second since the last log step (training time only)."""
    t0, images0 = session.window
    return (progress.images_seen - images0) / max(progress.train_seconds - t0, 1e-9)


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
    run.accelerator.log({f"eval/{metric}": metrics[metric]}, step=progress.step)  # the trackers plot the score only
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
