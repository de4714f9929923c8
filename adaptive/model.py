"""Builders for Diffusers' UNet2DModel and DDPMScheduler from a TrainConfig."""

from __future__ import annotations

from diffusers import DDPMScheduler, UNet2DModel

from .config import TrainConfig


def build_unet(cfg: TrainConfig) -> UNet2DModel:
    """The U-Net of the config (DDPM CIFAR-10 layout for the default preset, 35,746,307 parameters)."""
    return UNet2DModel(
        sample_size=cfg.resolution,
        in_channels=3,
        out_channels=3,
        block_out_channels=tuple(cfg.block_out_channels),
        layers_per_block=cfg.layers_per_block,
        down_block_types=tuple(cfg.down_block_types),
        up_block_types=tuple(cfg.up_block_types),
        attention_head_dim=cfg.attention_head_dim,
        dropout=cfg.dropout,
        norm_num_groups=cfg.norm_num_groups,
    )


def build_noise_scheduler(cfg: TrainConfig) -> DDPMScheduler:
    """DDPMScheduler with the configured betas and prediction type (used for training targets and sampling)."""
    return DDPMScheduler(
        num_train_timesteps=cfg.ddpm_num_steps,
        beta_schedule=cfg.ddpm_beta_schedule,
        beta_start=cfg.ddpm_beta_start,
        beta_end=cfg.ddpm_beta_end,
        prediction_type=cfg.prediction_type,
    )


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
