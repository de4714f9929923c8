"""Loading a DDPMPipeline from anything a run leaves: an exported run folder, a checkpoint-<step> folder (its EMA or
training weights with the run's noise schedule), a run folder without an export, or a Hub id."""

from __future__ import annotations

from pathlib import Path

from .checkpoint import (MANIFEST, MODEL_FILE, checkpoint_step, find_latest, load_ema_weights, read_config,
                         verify_checkpoint)
from .config import ConfigError, TrainConfig
from .hub_wait import hub_wait
from .model import build_noise_scheduler, build_unet
from .rundir import artifact

__all__ = ["load_pipeline", "looks_local", "pipeline_from_checkpoint"]


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
    from diffusers import DDPMPipeline

    p = Path(model_path).expanduser()
    if p.is_dir():
        exported = artifact(p, "model_index").is_file()
        if not (exported and weights == "ema"):
            ckpt = p if checkpoint_step(p) is not None or (p / MANIFEST).is_file() else find_latest(p, log)
            if ckpt is None:
                raise ConfigError(f"{p} holds no exported pipeline and no valid checkpoint-<step> folder")
            if ckpt != p:
                log(f"{p} has {'no export' if not exported else 'an export of the EMA weights only'}: using "
                    f"{ckpt.name}, its newest valid checkpoint")
            return pipeline_from_checkpoint(ckpt, weights)
    elif looks_local(model_path):
        raise ConfigError(f"--model_path {model_path}: not found (no such folder; a Hub id is 'owner/name')")
    elif weights != "ema":
        raise ConfigError(f"--weights {weights} needs a local run or checkpoint folder, not {model_path!r}")
    try:
        with hub_wait("--model_path", model_path):
            return DDPMPipeline.from_pretrained(model_path)
    except ConfigError:
        raise
    except Exception as e:  # diffusers/huggingface_hub raise many types (OSError, EnvironmentError, HTTP errors)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConfigError(f"cannot load a DDPMPipeline from {model_path!r}: {msg}") from None


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
