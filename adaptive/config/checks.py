"""`validate`: the checks of a resolved TrainConfig that span several fields (each field's own check is its
`fields.setting(check=...)`, run by `fields.check_fields`)."""

from __future__ import annotations

import typing

from ..errors import ConfigError
from ..fields import check_fields
from .settings import TrainConfig

def validate(cfg: TrainConfig) -> None:
    """Raises ConfigError naming the first invalid value."""
    if not cfg.output_dir.strip():
        raise ConfigError("--output_dir must name a folder (an empty value would train into the current directory)")
    check_fields(cfg)  # every field: finite, one of its choices, its own check
    check_fields(cfg.method.Options(**cfg.timestep_options) if isinstance(cfg.timestep_options, typing.Mapping)
                 else cfg.timestep_options)  # a user's method that did not import: raises its import error first
    _check_counts(cfg)
    _check_run(cfg)
    _check_model_and_method(cfg)


def _check_counts(cfg: TrainConfig) -> None:
    """Counts and step numbers: positive, or none where none means off."""
    positive = ["resolution", "train_batch_size", "gradient_accumulation_steps", "ddpm_num_steps",
                "ddpm_num_inference_steps", "layers_per_block", "logging_steps", "num_grid_images",
                "eval_num_images", "eval_inference_steps", "eval_batch_size", "eval_ref_num_images", "norm_num_groups"]
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name} must be >= 1 (got {getattr(cfg, name)})")
    for name in ["max_train_steps", "num_epochs", "save_images_steps", "checkpointing_steps",
                 "checkpoints_total_limit", "max_train_samples", "eval_steps", "save_model_steps"]:
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name} must be >= 1 or none (got {v})")
    for name in ["lr_warmup_steps", "dataloader_num_workers"]:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name} must be >= 0 (got {getattr(cfg, name)})")
    if cfg.attention_head_dim is not None and cfg.attention_head_dim < 1:
        raise ConfigError(f"--attention_head_dim must be >= 1 or none (got {cfg.attention_head_dim})")


def _check_run(cfg: TrainConfig) -> None:
    """Run length, optimizer and process settings."""
    if cfg.max_train_steps is None and cfg.num_epochs is None:
        raise ConfigError("give --max_train_steps or --num_epochs")
    if cfg.max_train_minutes is not None and cfg.max_train_minutes <= 0:
        raise ConfigError(f"--max_train_minutes must be > 0 (got {cfg.max_train_minutes})")
    if not cfg.hub_upload_timeout > 0:
        raise ConfigError(f"--hub_upload_timeout must be > 0 seconds (got {cfg.hub_upload_timeout})")
    if cfg.max_grad_norm < 0:
        raise ConfigError(f"--max_grad_norm must be >= 0 (got {cfg.max_grad_norm})")
    if cfg.learning_rate <= 0:
        raise ConfigError(f"--learning_rate must be > 0 (got {cfg.learning_rate})")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0.0 <= getattr(cfg, name) < 1.0:
            raise ConfigError(f"--{name} must be in [0, 1) (got {getattr(cfg, name)})")
    if cfg.adam_epsilon < 0 or cfg.adam_weight_decay < 0:
        raise ConfigError("--adam_epsilon and --adam_weight_decay must be >= 0")
    if cfg.ddp_timeout_minutes <= 0:
        raise ConfigError(f"--ddp_timeout_minutes must be > 0 (got {cfg.ddp_timeout_minutes})")


def _check_model_and_method(cfg: TrainConfig) -> None:
    """Model shape, noise schedule, EMA, timestep method and evaluation settings."""
    if not 0.0 <= cfg.dropout < 1.0:
        raise ConfigError(f"--dropout must be in [0, 1) (got {cfg.dropout})")
    if not 0.0 <= cfg.ema_min_decay <= cfg.ema_max_decay < 1.0:
        raise ConfigError("EMA decays must satisfy 0 <= --ema_min_decay <= --ema_max_decay < 1")
    levels = len(cfg.block_out_channels)
    if len(cfg.down_block_types) != levels or len(cfg.up_block_types) != levels:
        raise ConfigError("--down_block_types, --up_block_types and --block_out_channels must have the same length")
    if cfg.resolution % (2 ** (len(cfg.block_out_channels) - 1)) != 0:
        raise ConfigError(f"--resolution {cfg.resolution} must be divisible by 2^(levels-1) = "
                          f"{2 ** (len(cfg.block_out_channels) - 1)}")
    if any(c % cfg.norm_num_groups for c in cfg.block_out_channels):
        raise ConfigError(f"every --block_out_channels value must be divisible by --norm_num_groups "
                          f"{cfg.norm_num_groups}")
    if not 0.0 < cfg.ddpm_beta_start < cfg.ddpm_beta_end < 1.0:
        raise ConfigError("betas must satisfy 0 < --ddpm_beta_start < --ddpm_beta_end < 1")
    if cfg.ema_snapshot_steps < 1:
        raise ConfigError("--ema_snapshot_steps must be >= 1")
    if any(not 0.0 < s < 0.289 for s in cfg.ema_snapshots):
        raise ConfigError("--ema_snapshots values are sigma_rel in (0, 0.289) (EDM2 uses 0.05 0.10)")
    cfg.method.check_options(cfg.timestep_options, cfg)
    if any(s < 1 for s in cfg.eval_at_steps):
        raise ConfigError("--eval_at_steps must be positive step numbers")
    if cfg.eval_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--eval_inference_steps cannot exceed --ddpm_num_steps")
    if cfg.ddpm_num_inference_steps > cfg.ddpm_num_steps:
        raise ConfigError("--ddpm_num_inference_steps cannot exceed --ddpm_num_steps")
