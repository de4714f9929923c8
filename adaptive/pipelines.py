"""Loading a DDPMPipeline from anything a run leaves: an exported run folder, a checkpoint-<step> folder (its EMA or
training weights with the run's noise schedule), a run folder without an export, or a Hub id."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path

from .checkpoint import (MANIFEST, MODEL_FILE, checkpoint_step, find_latest, load_ema_weights, read_config,
                         verify_checkpoint)
from .config import ConfigError, TrainConfig
from .hub_wait import hub_wait
from .model import build_noise_scheduler, build_unet
from .rundir import ASIDE, ASIDE_PARTIAL, artifact

__all__ = ["load_from_hub", "load_pipeline", "looks_local", "pipeline_from_checkpoint", "real_cause"]


def looks_local(model_path: str) -> bool:
    """A path that cannot be a Hub id ('owner/name'): absolute, ./ ../ ~, more than one '/', or one whose
    first part is a local folder (runs/x) - such a path that does not exist is 'not found', with no Hub round trip."""
    parts = model_path.split("/")
    return (model_path.startswith(("/", ".", "~")) or len(parts) > 2 or not all(parts)
            or Path(parts[0]).expanduser().is_dir())


def load_pipeline(model_path: str, weights: str = "ema", log=print):
    """A DDPMPipeline from anything a run leaves: an exported run folder, a checkpoint-<step> folder, a run folder
    without an export (its newest valid checkpoint, named in the log), or a Hub id. weights 'ema' (the exported /
    EMA U-Net) or 'raw' (the training weights of a checkpoint)."""
    p = Path(model_path).expanduser()
    if p.is_dir():
        exported = artifact(p, "model_index").is_file()
        if not (exported and weights == "ema"):
            ckpt = p if checkpoint_step(p) is not None or (p / MANIFEST).is_file() else find_latest(p, log)
            if ckpt is None:
                raise ConfigError(f"{p} holds no exported pipeline and no valid checkpoint-<step> folder"
                                  f"{mid_overwrite_hint(p)}")
            if ckpt != p:
                log(f"{p} has {'no export' if not exported else 'an export of the EMA weights only'}: using "
                    f"{ckpt.name}, its newest valid checkpoint")
            return pipeline_from_checkpoint(ckpt, weights)
        return load_exported(p)
    elif looks_local(model_path):
        raise ConfigError(f"--model_path {model_path}: not found (no such folder; a Hub id is 'owner/name')")
    elif weights != "ema":
        raise ConfigError(f"--weights {weights} needs a local run or checkpoint folder, not {model_path!r}")
    return load_from_hub(model_path)


def load_exported(p: Path):
    """DDPMPipeline.from_pretrained of a local run's export; a damaged export is a local one-line error (naming a
    checkpoint to sample instead), never a Hub error."""
    from diffusers import DDPMPipeline

    try:
        with quiet_logger("diffusers.pipelines.pipeline_utils"):
            return DDPMPipeline.from_pretrained(str(p))
    except Exception as e:  # safetensors, torch and diffusers raise many types for a damaged file
        try:
            ckpt = find_latest(p, lambda _: None)
        except ConfigError:  # checkpoints, none valid
            ckpt = None
        instead = f"; its newest valid checkpoint loads with --model_path {ckpt}" if ckpt else ""
        raise ConfigError(f"--model_path {p}: its exported pipeline does not load ({type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}){instead}") from None


def mid_overwrite_hint(p: Path) -> str:
    """Where the run that an --overwrite_output_dir start replaced is, when that start ended before its first
    checkpoint (rundir.ASIDE), and what restores it; '' otherwise."""
    aside, partial = p / ASIDE, p / ASIDE_PARTIAL
    restore = (f"any train_accelerate.py start on {p} (e.g. --output_dir {p} --resume_from_checkpoint latest) puts it "
               "back first")
    if aside.is_dir():
        return (f": an --overwrite_output_dir run stopped before its first checkpoint, and the run it replaced is "
                f"whole in {aside} - sample it with --model_path {aside}, or {restore}")
    if partial.is_dir():
        return (f": an --overwrite_output_dir run was stopped while moving the previous run into {partial}; "
                f"{restore}")
    return ""


def load_from_hub(model_path: str):
    """DDPMPipeline.from_pretrained(a Hub id), its wait bounded (hub_wait); a failure is one line with its real
    cause (`real_cause`), without diffusers' multi-line 'will try to load from local cache' warning before it."""
    from diffusers import DDPMPipeline
    from huggingface_hub import constants

    try:
        with hub_wait("--model_path", model_path), quiet_logger("diffusers.pipelines.pipeline_utils"):
            return DDPMPipeline.from_pretrained(model_path)
    except ConfigError:
        raise
    except Exception as e:  # diffusers/huggingface_hub raise many types (OSError, EnvironmentError, HTTP errors)
        raise ConfigError(f"--model_path {model_path}: cannot load a DDPMPipeline from the Hub at "
                          f"{constants.ENDPOINT}: {real_cause(e)}") from None


def real_cause(e: BaseException) -> str:
    """A failed Hub load in one line: the error diffusers raised it from (a 404, a refused connection, offline
    mode), since diffusers' own error only says 'check out the root cause in the stacktrace above' and none is shown."""
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    root = e.__cause__ or e
    lines = [line.strip() for line in str(root).splitlines() if line.strip()] or [type(root).__name__]
    if isinstance(root, RepositoryNotFoundError):  # the Hub answers 401/404 alike for a missing or private repo
        return f"{' '.join(lines[:2])} (a private or gated repo needs a login or HF_TOKEN)"
    if isinstance(root, HfHubHTTPError):
        return " ".join(lines[:2])  # 'NNN Client Error.' and what failed
    return lines[0] if root is e else f"{type(root).__name__}: {lines[0]}"


@contextmanager
def quiet_logger(name: str):
    """Only errors from the logger `name` inside the block."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def pipeline_from_checkpoint(ckpt: Path, weights: str = "ema"):
    """DDPMPipeline(U-Net with the checkpoint's EMA or training weights, the run's noise schedule)."""
    from diffusers import DDPMPipeline
    from safetensors.torch import load_file

    reason = verify_checkpoint(ckpt)
    if reason is not None:
        raise ConfigError(f"{ckpt} is not a valid checkpoint: {reason}")
    cfg = TrainConfig.from_dict({k: v for k, v in read_config(ckpt).items() if k in TrainConfig.__dataclass_fields__})
    if weights == "ema" and not cfg.use_ema:
        raise ConfigError(f"{ckpt} was trained without EMA; use --weights raw")
    unet = build_unet(cfg)
    state = load_ema_weights(ckpt) if weights == "ema" else load_file(str(ckpt / MODEL_FILE))
    unet.load_state_dict(state)
    return DDPMPipeline(unet=unet.eval(), scheduler=build_noise_scheduler(cfg))
