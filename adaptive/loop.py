"""The training loop: `train()` reads top to bottom; `optimizer_step()` is one step; the helpers below each do one
thing the loop calls by name. Everything the loop works with is built by `adaptive.build.setup`; what it writes at
its save points is `adaptive/outputs.py`, the divergence guard `adaptive/guard.py`."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Optional

import torch

from .build import Run, apply_optimizer_settings, check_buildable, planned_steps, run_fraction, setup
from .checkpoint import load_checkpoint, read_progress
from .config import ConfigError, TrainConfig
from .control import StopControl
from .data import Layout, open_entries
from .export import finished_run
from .faults import check_launch
from .guard import watch_loss
from .hub import connect_hub
from .losses import per_sample_mse, q_sample, training_target
from .outputs import evaluate, finish, save_due
from .rundir import check_output_dir, fresh_start_line
from .seeding import generator, seed_for
from .session import Session, end, main_process_logger, nothing_to_train, restore_replaced_run, start_session
from .timesteps.base import DIAGNOSTIC_BINS, Draw, DrawRequest, asked
from .trackers import log_step


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

    # Check the launch (GPUs asked for and present), the model flags, the output folder, the data source and (main
    # process) the Hub token and repo before anything starts (bad input: one line, nothing touched; a replaced run is
    # cleared only right before training, in start_session).
    check_launch()
    check_buildable(cfg)
    resume_from = check_output_dir(cfg, log)
    entries = open_entries(cfg)
    uploader, hub_error = connect_hub(cfg, log)

    # A finished run rerun: nothing to train, decided from its checkpoint before any image is decoded (every rank
    # reads the same checkpoint, so every rank returns here; no process group has been formed).
    layout = Layout(cfg.train_batch_size, int(os.environ.get("WORLD_SIZE", "1")), cfg.gradient_accumulation_steps)
    finished = finished_checkpoint(cfg, resume_from, len(entries), layout)
    if finished is not None:
        control.restore_handlers()
        if hub_error:
            raise ConfigError(hub_error)
        return nothing_to_train(cfg, *finished, log, uploader)

    # A fresh start says so at once, so that a forgotten --output_dir or preset is visible before any step.
    if resume_from is None:
        log(fresh_start_line(cfg))

    # Build everything: accelerator, data, model, EMA, optimizer, LR schedule, timestep sampler; lock the folder.
    run = setup(cfg, log, entries, main_error=hub_error, layout=layout)
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


def finished_checkpoint(cfg: TrainConfig, resume_from: Optional[Path], num_images: int, layout: Layout):
    """(progress, why) when the checkpoint to resume from ends a finished run (`export.finished_run`), read from its
    files before anything is built; else None."""
    if resume_from is None:
        return None
    progress = read_progress(resume_from)
    why = finished_run(cfg, progress, planned_steps(cfg, num_images, layout))
    return (progress, why) if why else None


def log_statistics(run: Run, session: Session) -> None:
    """Flush the step statistics (one collective, one host sync) and the timestep diagnostics to stats.jsonl, the
    trackers and the progress bar (or one line per log step when not on a terminal); then the divergence guard
    (`guard.watch_loss`)."""
    progress = run.progress
    values = run.stats.flush(run.accelerator)
    values.update(session.report.record(run.timesteps, progress.step))
    record = {"step": progress.step, "images": progress.images_seen, "train_seconds": round(progress.train_seconds, 3),
              "lr": run.lr_scheduler.get_last_lr()[0], "world_size": run.accelerator.num_processes,
              "img_per_s": window_rate(session, progress), **values}
    session.window = (progress.train_seconds, progress.images_seen)
    session.stats_file.write(record)
    log_step(run.accelerator, record, progress.step, run.cfg.log_timestep_bins or run.timesteps.tracks_by_default,
             run.cfg.ddpm_num_steps)
    loss = values.get("loss", math.nan)
    session.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{record['img_per_s']:.0f}", lr=f"{record['lr']:.2e}",
                            refresh=False)
    if session.bar.disable:
        session.log(f"step {progress.step}/{run.max_steps} loss={loss:.4f} img/s={record['img_per_s']:.0f} "
                    f"lr={record['lr']:.2e} train_time={progress.train_seconds:.0f}s")
    watch_loss(run, session, values, loss)


def window_rate(session: Session, progress) -> float:
    """Training images per second since the last log step (training time only)."""
    t0, images0 = session.window
    return (progress.images_seen - images0) / max(progress.train_seconds - t0, 1e-9)

