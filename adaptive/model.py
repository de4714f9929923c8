"""Builders for Diffusers' UNet2DModel and DDPMScheduler from a TrainConfig."""

from __future__ import annotations

import torch
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.models.attention_processor import Attention, AttnProcessor, AttnProcessor2_0

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


# Training under CPU bf16 autocast: attention over at most this many tokens runs in fp32. Measured by
# benchmarks/attention_kernels.py (docs/benchmarks/throughput/): at 64 tokens (cpu-tiny16) fp32 SDPA forward+backward
# is ~1.7x faster than bf16 classic and ~2.3x faster than bf16 SDPA; at 256 tokens the precisions are within noise.
CPU_FP32_ATTENTION_MAX_TOKENS = 64


def attention_tokens(hidden_states) -> int:
    """Sequence length an attention block sees: H*W for (B, C, H, W) input, L for (B, L, C)."""
    return hidden_states.shape[-1] * hidden_states.shape[-2] if hidden_states.ndim == 4 else hidden_states.shape[1]


class CpuAttnProcessor(AttnProcessor2_0):
    """SDPA; while training under CPU bf16 autocast, short sequences run in fp32 (faster there, and exact-er)."""

    # The parent's named parameters, spelled out: Attention.forward inspects this signature and warns (every call)
    # about, then drops, any keyword it does not name - e.g. the U-Net's temb.
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        kwargs.update(encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, temb=temb)
        if (hidden_states.device.type == "cpu" and torch.is_grad_enabled() and torch.is_autocast_enabled("cpu")
                and attention_tokens(hidden_states) <= CPU_FP32_ATTENTION_MAX_TOKENS):
            with torch.autocast("cpu", enabled=False):
                return super().__call__(attn, hidden_states.float(), *args, **kwargs)
        return super().__call__(attn, hidden_states, *args, **kwargs)


def configure_attention(unet, impl: str = "auto", device_type: str = "cpu"):
    """Pick the attention kernel: 'sdpa' (torch scaled_dot_product_attention, Diffusers' default), 'classic'
    (Diffusers' AttnProcessor: baddbmm + softmax), or 'auto' = SDPA, on the CPU with short sequences computed in fp32
    while training under bf16 autocast (CPU_FP32_ATTENTION_MAX_TOKENS; bf16 SDPA backward over 8-channel heads is
    slow on the CPU). Same math every way; returns the U-Net.
    """
    if impl == "auto":
        proc = CpuAttnProcessor() if device_type == "cpu" else AttnProcessor2_0()
    else:
        proc = AttnProcessor() if impl == "classic" else AttnProcessor2_0()
    for module in unet.modules():
        if isinstance(module, Attention):
            module.set_processor(proc)
    return unet


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
