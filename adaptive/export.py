"""The exported pipeline of a run: `DDPMPipeline.save_pretrained` into the run folder with its model card, written
aside and swapped into place with the stop signals held; its model card rewritten for a Hub repo; whether a resumed
run has nothing left to do because the pipeline of its last step is exported.

File names come from `rundir.ARTIFACTS` (`EXPORT_TMP` / `EXPORT_OLD`: the export being written, the one it replaces).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Optional

from .config import TrainConfig
from .faults import writing
from .model_card import build_model_card, write_model_card
from .rundir import ARTIFACTS, EXPORT_OLD, EXPORT_TMP, artifact, exported_step

__all__ = ["card_for_repo", "export_pipeline", "finished_run", "swap_in"]


def export_pipeline(cfg: TrainConfig, unet, noise_scheduler, progress, info: dict,
                    metrics: Optional[dict] = None) -> None:
    """DDPMPipeline(unet=EMA U-Net, scheduler).save_pretrained(output_dir) in safetensors, with a model card
    (main process only). Written into .export.tmp/ and swapped into place with the signals held (milliseconds), so an
    export interrupted at any point (a second Ctrl-C, a full disk) leaves the previous export whole."""
    from diffusers import DDPMPipeline

    out = Path(cfg.output_dir)
    tmp = out / EXPORT_TMP
    with writing(f"the pipeline of step {progress.step}", out, "checkpoints are unaffected"):
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            DDPMPipeline(unet=unet, scheduler=noise_scheduler).save_pretrained(tmp, safe_serialization=True)
            build_model_card(out, cfg, progress, info, metrics, info.get("hub_repo_id")).save(tmp / "README.md")
            # Written last: the export at this step is complete (a rerun of a finished run then has nothing to do).
            (tmp / ARTIFACTS["export_record"][0]).write_text(json.dumps({"step": progress.step, "metrics": metrics},
                                                                        indent=2))
            swap_in(out, tmp)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def swap_in(out: Path, tmp: Path) -> None:
    """Move every entry of `tmp` into `out`, replacing what is there, with the stop signals held until done."""
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1}
    old = out / EXPORT_OLD
    shutil.rmtree(old, ignore_errors=True)
    old.mkdir()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for entry in sorted(tmp.iterdir(), key=lambda p: p.name == ARTIFACTS["export_record"][0]):  # the record last
            if (out / entry.name).exists():
                os.rename(out / entry.name, old / entry.name)
            os.rename(entry, out / entry.name)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        shutil.rmtree(old, ignore_errors=True)


def card_for_repo(cfg: TrainConfig, progress, repo_id: str) -> None:
    """Rewrite the exported pipeline's model card so that its snippet loads `repo_id`: a finished run uploaded by a
    rerun with --push_to_hub was exported with its local path in the card (main process)."""
    out = Path(cfg.output_dir)
    info = json.loads(artifact(out, "run_info").read_text())
    metrics = json.loads(artifact(out, "export_record").read_text()).get("metrics")
    grids = sorted(artifact(out, "samples").glob("grid_*.png"))
    with writing("the model card", out):
        write_model_card(out, cfg, progress, {**info, "grid": grids[-1] if grids else None}, metrics, repo_id)


def finished_run(cfg: TrainConfig, progress, max_steps: int) -> Optional[str]:
    """Why a resumed run has nothing left to do (its step or wall-clock budget is used up and the pipeline of that
    step was exported), or None."""
    if progress.step >= max_steps:
        why = f"step {progress.step} of --max_train_steps {max_steps} reached"
    elif cfg.max_train_minutes and progress.train_seconds >= 60 * cfg.max_train_minutes:
        why = f"--max_train_minutes budget of {cfg.max_train_minutes:g} min spent at step {progress.step}"
    else:
        return None
    return why if exported_step(Path(cfg.output_dir)) == progress.step else None
