"""The training loop: `train()` reads top to bottom; `optimizer_step()` is one step; the helpers below each do one
thing the loop calls by name. Everything the loop works with is built by `adaptive.build.setup`."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from .build import Run, run_fraction, setup
from .checkpoint import save_checkpoint
from .config import TrainConfig
from .control import StopControl
from .data import open_entries
from .image_sampler import generate_distributed, save_grid
from .losses import per_sample_mse, q_sample, training_target
from .model import count_parameters
from .rundir import (artifact, check_output_dir, export_pipeline, finished_run, make_uploader, run_info,
                     write_run_records)
from .seeding import generator, seed_for
from .stats import JsonlWriter, tracker_config
from .timesteps.base import DIAGNOSTIC_BINS
from .timesteps.report import TimestepReport, tracker_values


def optimizer_step(run: Run, step: int, micro_batches: list[torch.Tensor]):
    """One optimizer step over this rank's micro-batches; returns (local per-sample losses [accum * B], grad norm)."""
    cfg, acc, layout, timesteps, tables = run.cfg, run.accelerator, run.layout, run.timesteps, run.tables
    device, rank = acc.device, acc.process_index

    # Draw this step's timesteps, loss multipliers and noise for the global batch (identical on every rank).
    g = generator(device, cfg.seed, "step", step)
    draw = timesteps.sample(layout.global_batch, g, step, run_fraction(run, step))  # ([G], [G])
    noise_all = torch.randn((layout.global_batch, 3, cfg.resolution, cfg.resolution), generator=g, device=device)
    torch.manual_seed(seed_for(cfg.seed, "dropout", rank, step))  # dropout masks: (seed, rank, step)

    # Evaluate the loss and accumulate gradients over this rank's micro-batches.
    local_losses, local_t = [], []
    for micro, x0 in enumerate(micro_batches):
        sl = layout.slice(micro, rank)
        t, m = timesteps.take(draw, x0, sl, generator(device, cfg.seed, "t", step, micro, rank))  # [B], [B]
        noise, sa, s1 = noise_all[sl], tables.sqrt_abar[t], tables.sqrt_one_minus_abar[t]
        with acc.accumulate(run.model):
            x_t = q_sample(x0, noise, sa, s1)  # [B, 3, S, S]
            if cfg.channels_last:
                x_t = x_t.contiguous(memory_format=torch.channels_last)
            pred = run.model(x_t, t).sample
            loss_b = tables.weight[t] * per_sample_mse(pred, training_target(cfg.prediction_type, x0, noise, sa, s1))
            acc.backward((m * loss_b).mean())
        local_losses.append(loss_b.detach())
        local_t.append(t)
        run.stats.report_binned("loss_by_t", t * DIAGNOSTIC_BINS // cfg.ddpm_num_steps, loss_b, DIAGNOSTIC_BINS)

    # Optimizer step (pre-clip global norm; without clipping the call only measures it), LR schedule, EMA.
    timesteps.before_update(run.unet, acc)
    grad_norm = acc.clip_grad_norm_(run.model.parameters(), cfg.max_grad_norm if cfg.max_grad_norm > 0 else math.inf)
    run.optimizer.step()
    run.lr_scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    timesteps.after_update(run.unet, acc)
    for avg in (run.ema, run.phema):
        if avg is not None:
            avg.update(run.unet)

    # Timestep-sampler update from the global batch.
    losses = torch.cat(local_losses)
    timesteps.update(*gather_global_batch(acc, layout, torch.cat(local_t), losses), grad_norm=grad_norm)
    return losses, grad_norm


def gather_global_batch(accelerator, layout, local_t: torch.Tensor, losses: torch.Tensor):
    """(t [G], loss [G]) of the global batch on every rank, in the (micro, rank, i) order of the global draw."""
    world = accelerator.num_processes
    if world == 1:
        return local_t, losses

    def order(x):  # gather is rank-major [world, accum * B]; the global draw is (micro, rank, i)
        return accelerator.gather(x).view(world, layout.accum, layout.batch_size).transpose(0, 1).reshape(-1)

    return order(local_t), order(losses)


@dataclass
class Session:
    """What one invocation of train() keeps beside the Run: records, uploader, evaluator, stop control, clocks."""

    log: object
    info: dict
    stats_file: JsonlWriter
    control: StopControl
    bar: object
    uploader: object = None
    evaluator: object = None
    report: TimestepReport = field(default_factory=TimestepReport)
    window: tuple = (0.0, 0)  # (train seconds, images seen) at the start of the current log window
    last_metrics: Optional[dict] = None  # the latest evaluation record (for the model card)


def train(cfg: TrainConfig) -> dict:
    """Train as configured; returns a summary (final step, train seconds, why it stopped)."""
    log = main_process_logger()

    # Check the output folder and the data source before anything starts (bad input: one line, nothing touched).
    resume_from = check_output_dir(cfg, log)
    entries = open_entries(cfg)

    # Build everything: accelerator, data, model, EMA, optimizer, LR schedule, timestep sampler.
    run = setup(cfg, log, resume_from, entries)
    cfg, acc, progress = run.cfg, run.accelerator, run.progress

    # Resume (or start), record the run, open the trackers, evaluator and uploader.
    if resume_from is not None:
        acc.load_state(str(resume_from))
        why = finished_run(cfg, progress, run.max_steps)
        if why:  # every rank loaded the same state, so every rank returns here (no collective is skipped)
            return nothing_to_train(run, why, log)
    session = start_session(run, resume_from, log)
    sampling_unet = run.ema.model if run.ema else run.unet  # previews, evaluation and export use the EMA weights
    batches = run.data.batches(progress.step)

    # Training loop.
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

        # Sample grid, post-hoc EMA snapshot, checkpoint, export; stop when asked to or out of budget.
        stop = session.control.should_stop(progress.train_seconds)
        done = stop or progress.step >= run.max_steps
        if every(progress.step, cfg.save_images_steps) and not done:
            preview(run, session, sampling_unet)
        if run.phema is not None and every(progress.step, cfg.ema_snapshot_steps) and acc.is_main_process:
            run.phema.save_snapshots(artifact(Path(cfg.output_dir), "ema_snapshots"))
        if every(progress.step, cfg.checkpointing_steps) or done:
            checkpoint(run, session)
        if every(progress.step, cfg.save_model_steps) and not done:
            publish(run, session, sampling_unet, f"pipeline at step {progress.step}")
        if stop:
            log(f"stopping after step {progress.step}: {session.control.reason}; checkpoint written, rerun the same "
                "command with --resume_from_checkpoint latest to continue")
            break
    session.bar.close()
    session.control.close()

    # Final grid, snapshot and export (skipped when preempted: the checkpoint is what matters then).
    preempted = session.control.preempted
    if not preempted:
        if run.phema is not None and acc.is_main_process and not every(progress.step, cfg.ema_snapshot_steps):
            run.phema.save_snapshots(artifact(Path(cfg.output_dir), "ema_snapshots"))
        grid = preview(run, session, sampling_unet)
        publish(run, session, sampling_unet, f"final pipeline at step {progress.step}", grid)
    return end(run, session, "preempted" if preempted else None)


# ------------------------------------------------------------------------------------------------ helpers


def every(step: int, interval: Optional[int]) -> bool:
    return bool(interval) and step % interval == 0


def main_process_logger():
    """print-like logging on the launcher's rank 0 only (usable before the accelerator exists)."""
    from tqdm.auto import tqdm

    launcher_rank = int(os.environ.get("RANK", "0"))

    def log(msg: str) -> None:
        if launcher_rank == 0:
            tqdm.write(msg, file=sys.stdout)
            sys.stdout.flush()

    return log


def nothing_to_train(run: Run, why: str, log) -> dict:
    """A finished run rerun: nothing is trained or rewritten; with --push_to_hub the upload is retried."""
    cfg, progress = run.cfg, run.progress
    log(f"nothing to train: {why} and its pipeline is exported in {cfg.output_dir} (raise --max_train_steps or "
        "--max_train_minutes to train on)")
    if run.accelerator.is_main_process and cfg.push_to_hub:  # the upload may be what the rerun is for
        uploader = make_uploader(cfg, log)
        uploader.push(Path(cfg.output_dir), f"final pipeline at step {progress.step}")
        uploader.close()
    return {"step": progress.step, "train_seconds": progress.train_seconds, "stopped": "finished",
            "world_size": run.accelerator.num_processes}


def start_session(run: Run, resume_from: Optional[Path], log) -> Session:
    """Run records, stats file (rewound to the resumed step), trackers, evaluator, uploader, stop control, bar."""
    from tqdm.auto import tqdm

    cfg, acc, progress = run.cfg, run.accelerator, run.progress
    out, is_main = Path(cfg.output_dir), acc.is_main_process
    stats_file = JsonlWriter(artifact(out, "stats"), is_main)
    if resume_from is not None:
        stats_file.truncate_after(progress.step)
        log(f"resumed from {resume_from} at step {progress.step}")
    elif is_main:
        artifact(out, "stats").unlink(missing_ok=True)
    num_params = count_parameters(run.unet)
    info = run_info(acc, cfg, run.layout, num_params, run.data)
    if is_main:
        write_run_records(out, cfg, info, run.timesteps.describe())
    uploader = make_uploader(cfg, log) if is_main and cfg.push_to_hub else None
    evaluator = None
    if cfg.eval_steps or cfg.eval_at_steps:
        from .evaluation import InTrainingEvaluator

        evaluator = InTrainingEvaluator(cfg, acc, run.data.images, log)
    acc.init_trackers(cfg.tracker_project_name, config=tracker_config(cfg))
    log(f"world_size={acc.num_processes} device={acc.device} mixed_precision={acc.mixed_precision} "
        f"params={num_params:,} global_batch={run.layout.global_batch} (= {cfg.train_batch_size} per device x "
        f"{acc.num_processes} processes x {cfg.gradient_accumulation_steps} accumulation) steps={run.max_steps} "
        f"sampler={run.timesteps.name} weighting={cfg.loss_weighting}")
    control = StopControl(acc.num_processes, cfg.max_train_minutes * 60 if cfg.max_train_minutes else None)
    bar = tqdm(total=run.max_steps, initial=progress.step, disable=not (is_main and sys.stdout.isatty()), desc="train",
               unit="step", dynamic_ncols=True, file=sys.stdout)
    return Session(log, info, stats_file, control, bar, uploader, evaluator,
                   window=(progress.train_seconds, progress.images_seen))


def log_statistics(run: Run, session: Session) -> None:
    """Flush the step statistics (one collective, one host sync) and the timestep diagnostics to stats.jsonl, the
    trackers and the progress bar (or one line per log step when not on a terminal)."""
    progress = run.progress
    values = run.stats.flush(run.accelerator)
    values.update(session.report.record(run.timesteps, progress.step))
    record = {"step": progress.step, "images": progress.images_seen, "train_seconds": round(progress.train_seconds, 3),
              "lr": run.lr_scheduler.get_last_lr()[0], "world_size": run.accelerator.num_processes,
              "img_per_s": window_rate(session, progress), **values}
    session.window = (progress.train_seconds, progress.images_seen)
    session.stats_file.write(record)
    run.accelerator.log(tracker_values(record), step=progress.step)
    loss = values.get("loss", math.nan)
    session.bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{record['img_per_s']:.0f}", lr=f"{record['lr']:.2e}",
                            refresh=False)
    if session.bar.disable:
        session.log(f"step {progress.step}/{run.max_steps} loss={loss:.4f} img/s={record['img_per_s']:.0f} "
                    f"lr={record['lr']:.2e} train_time={progress.train_seconds:.0f}s")


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
    session.stats_file.write(record)
    run.accelerator.log({f"eval/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step=progress.step)
    session.last_metrics = record
    metric = session.evaluator.featnet.metric
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
    session.report.save_heatmap(artifact(out, "heatmap"), cfg.ddpm_num_steps,
                                f"p(t) over training - {cfg.timestep_sampler}")
    return save_grid(images, artifact(out, "samples") / f"grid_{run.progress.step:07d}.png")


def checkpoint(run: Run, session: Session) -> None:
    """checkpoint-<step> (every rank; its time is not training time); pushed too with --push_checkpoints."""
    t0 = time.perf_counter()
    path = save_checkpoint(run.accelerator, Path(run.cfg.output_dir), run.progress.step, run.cfg.to_dict(),
                           run.cfg.checkpoints_total_limit)
    run.progress.train_seconds += time.perf_counter() - t0
    session.last_checkpoint = run.progress.step
    session.log(f"saved {path}")
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


def end(run: Run, session: Session, stopped: Optional[str]) -> dict:
    """Wait for the uploads, tear the process group down; the run's summary."""
    if session.uploader is not None:
        session.uploader.close(timeout=30 if stopped == "preempted" else None)
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()
    summary = {"step": run.progress.step, "train_seconds": run.progress.train_seconds,
               "stopped": session.control.reason, "world_size": run.accelerator.num_processes}
    session.log(f"done: {json.dumps(summary)}")
    return summary
