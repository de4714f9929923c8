"""One invocation of train(): what it keeps beside the Run (records, trackers, evaluator, Hub uploader, stop control,
progress bar, logging) - opened by `start_session`, closed by `end` - and the rerun of a finished run."""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import numpy as np

from .build import Run, cpu_has_native_bf16
from .config import TrainConfig
from .control import StopControl
from .evaluation import InTrainingEvaluator
from .export import card_for_repo
from .hub import HubUploader, finish_uploads
from .model import count_parameters
from .rundir import artifact, lock_output_dir, prepare_for_training, restore_aside, run_info, write_run_records
from .stats import JsonlWriter
from .timesteps.report import TimestepReport
from .trackers import open_trackers

if TYPE_CHECKING:  # for the annotations only; the code imports it where it uses it
    from tqdm.auto import tqdm


# The loss "leaves its running range" at a log step whose mean loss is over RANGE_FACTOR x the median of the previous
# RANGE_WINDOW in-range log steps (once there are RANGE_MIN of them). Healthy training lowers its loss, so large early
# losses never trip it; a blow-up (a finite one too: --learning_rate 1e6 with clipping) does at once.
RANGE_FACTOR, RANGE_WINDOW, RANGE_MIN = 10.0, 20, 5


@dataclass
class LossRange:
    """Which checkpoint rotation must keep: the newest one taken before the loss left its running range."""

    history: list = field(default_factory=list)  # the latest in-range log-step losses
    vouched_step: Optional[int] = None  # the weights up to this step gave in-range losses
    left_at: Optional[int] = None  # the log step at which the loss left its range; None while in range
    resumed_at: Optional[int] = None  # the step this process resumed from: its checkpoint stays the fallback

    def observe(self, step: int, loss: float) -> Optional[float]:
        """Record the mean loss of the log window ending at `step`; the running median when it has just left its
        range, else None."""
        median = float(np.median(self.history)) if len(self.history) >= RANGE_MIN else math.inf
        if not loss <= RANGE_FACTOR * median:  # a NaN is out of range too
            left, self.left_at = self.left_at is None, self.left_at or step
            return median if left else None
        self.history = [*self.history, loss][-RANGE_WINDOW:]
        self.vouched_step, self.left_at = step - 1, None  # that window's losses came from the weights before `step`
        return None

    def protected(self) -> Optional[int]:
        """The step at or before which the newest checkpoint is kept from rotation: a checkpoint's weights are vouched
        for by the loss of the next log step, so the one just written is not yet (None: no log step seen)."""
        return self.vouched_step

    @classmethod
    def from_stats(cls, path: Path, step: int) -> "LossRange":
        """The range as it was at `step`, from the log-step records of stats.jsonl (a resumed run)."""
        loss_range = cls()
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return loss_range
        for line in lines:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "lr" in record and "loss" in record and record.get("step", 0) <= step:
                loss_range.observe(record["step"], float(record["loss"]))
        return loss_range


@dataclass
class Session:
    """What one invocation of train() keeps beside the Run: records, uploader, evaluator, stop control, clocks."""

    log: Callable[[str], None]
    info: dict
    stats_file: JsonlWriter
    control: StopControl
    bar: tqdm
    uploader: Optional[HubUploader] = None
    evaluator: Optional[InTrainingEvaluator] = None
    report: TimestepReport = field(default_factory=TimestepReport)
    window: tuple = (0.0, 0)  # (train seconds, images seen) at the start of the current log window
    logged_step: int = 0  # the step of the last statistics flush (all finite up to it)
    last_metrics: Optional[dict] = None  # the latest evaluation record (for the model card)
    replacing: bool = False  # --overwrite_output_dir before the new run's first checkpoint: the old run is aside
    loss_range: LossRange = field(default_factory=LossRange)  # guards the last checkpoint before a blow-up


def main_process_logger():
    """print-like logging on the launcher's rank 0 only (usable before the accelerator exists)."""
    from tqdm.auto import tqdm

    launcher_rank = int(os.environ.get("RANK", "0"))

    def log(msg: str) -> None:
        if launcher_rank == 0:
            tqdm.write(msg, file=sys.stdout)
            sys.stdout.flush()

    return log


def nothing_to_train(cfg: TrainConfig, progress, why: str, log, uploader=None) -> dict:
    """A finished run rerun, recognised before anything is built: nothing is trained or rewritten; with
    --push_to_hub the upload is retried. The main process holds the folder's lock meanwhile."""
    log(f"nothing to train: {why} and its pipeline is exported in {cfg.output_dir} (raise --max_train_steps or "
        "--max_train_minutes to train on)")
    main = int(os.environ.get("RANK", "0")) == 0
    lock = lock_output_dir(Path(cfg.output_dir), log) if main else None
    try:
        uploaded = True
        if uploader is not None:  # the upload may be what the rerun is for
            card_for_repo(cfg, progress, uploader.repo_id)
            uploader.push(Path(cfg.output_dir), f"final pipeline at step {progress.step}")
            uploaded = finish_uploads(uploader, cfg, log, cfg.hub_upload_timeout)
    finally:
        if lock is not None:
            lock.close()
    return {"step": progress.step, "train_seconds": progress.train_seconds, "stopped": "finished",
            "world_size": int(os.environ.get("WORLD_SIZE", "1")), **({} if uploaded else {"hub": "not uploaded"})}


def start_session(run: Run, resume_from: Optional[Path], log, control: StopControl, uploader=None) -> Session:
    """Evaluator (the last check that can fail on bad input), then - nothing written before - the replaced run
    cleared, run records, stats file (rewound to the resumed step), trackers, stop control, bar; keeps the Hub
    uploader (main process, repo already checked by `hub.connect_hub`)."""
    from tqdm.auto import tqdm

    cfg, acc, progress = run.cfg, run.accelerator, run.progress
    out, is_main = Path(cfg.output_dir), acc.is_main_process
    evaluator = None
    if cfg.eval_steps or cfg.eval_at_steps:
        evaluator = InTrainingEvaluator(cfg, acc, run.data.images, log)
    if is_main:
        prepare_for_training(cfg, resume_from, log)  # a replaced run moved aside (put back if this run ends before its
        # first checkpoint: `restore_replaced_run`, `checkpoint`)
    stats_file = JsonlWriter(artifact(out, "stats"), is_main)
    loss_range = LossRange()
    if resume_from is not None:
        dropped = stats_file.truncate_after(progress.step)
        if dropped:
            log(f"warning: {artifact(out, 'stats')}: skipped {dropped} line(s) that are not a step's record (torn "
                "by a kill or edited)")
        if is_main:
            loss_range = LossRange.from_stats(artifact(out, "stats"), progress.step)
            loss_range.resumed_at = progress.step
        log(f"resumed from {resume_from} at step {progress.step}")
    elif is_main:
        artifact(out, "stats").unlink(missing_ok=True)
    num_params = count_parameters(run.unet)
    info = run_info(acc, cfg, run.layout, num_params, run.data)
    if uploader is not None:
        info["hub_repo_id"] = uploader.repo_id  # the model card's usage snippet loads it
    if is_main:
        write_run_records(out, cfg, info, run.timesteps.describe())
    open_trackers(acc, cfg, resumed_at=progress.step if resume_from is not None else None)
    log(f"world_size={acc.num_processes} device={acc.device} mixed_precision={acc.mixed_precision} "
        f"params={num_params:,} global_batch={run.layout.global_batch} (= {cfg.train_batch_size} per device x "
        f"{acc.num_processes} processes x {cfg.gradient_accumulation_steps} accumulation) steps={run.max_steps} "
        f"sampler={run.timesteps.name} weighting={cfg.loss_weighting}")
    if acc.device.type == "cpu" and acc.mixed_precision == "bf16" and not cpu_has_native_bf16():
        log("warning: this CPU has no native bf16 (AVX512-BF16 / AMX), so bf16 autocast is emulated and far slower "
            "than fp32 (10.6x for cpu-tiny16 on an AVX2-only EPYC); --mixed_precision no trains faster here")
    control.attach(acc.num_processes, cfg.max_train_minutes * 60 if cfg.max_train_minutes else None,
                   timedelta(minutes=cfg.ddp_timeout_minutes))
    bar = tqdm(total=run.max_steps, initial=progress.step, disable=not (is_main and sys.stdout.isatty()), desc="train",
               unit="step", dynamic_ncols=True, file=sys.stdout)
    return Session(log, info, stats_file, control, bar, uploader, evaluator,
                   window=(progress.train_seconds, progress.images_seen), logged_step=progress.step,
                   replacing=cfg.overwrite_output_dir and resume_from is None, loss_range=loss_range)


def restore_replaced_run(cfg: TrainConfig, log) -> None:
    """This run ends (fails, or is stopped by a signal) before its first checkpoint: the run it was replacing goes
    back in place (main process; nothing when no run was aside)."""
    if int(os.environ.get("RANK", "0")) == 0 and restore_aside(Path(cfg.output_dir)):
        log(f"{cfg.output_dir}: this run ended before its first checkpoint; the run it replaced is back in place")


def end(run: Run, session: Session, stopped: Optional[str]) -> dict:
    """Wait for the uploads (at most --hub_upload_timeout), tear the process group down; the run's summary ("hub":
    "not uploaded" when a finished run's final upload did not reach the Hub)."""
    cfg = run.cfg
    timeout = min(30.0, cfg.hub_upload_timeout) if stopped == "preempted" else cfg.hub_upload_timeout
    uploaded = finish_uploads(session.uploader, cfg, session.log, timeout)
    session.control.close()  # restores the signal handlers: a signal during the export above let it finish
    if run.lock is not None:
        run.lock.close()
    run.accelerator.wait_for_everyone()
    run.accelerator.end_training()
    summary = {"step": run.progress.step, "train_seconds": run.progress.train_seconds,
               "stopped": session.control.reason, "world_size": run.accelerator.num_processes}
    if not uploaded and stopped != "preempted":  # preempted: the rerun trains on and uploads at its end anyway
        summary["hub"] = "not uploaded"
    session.log(f"done: {json.dumps(summary)}")
    return summary
