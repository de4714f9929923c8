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


# Under CPU bf16 autocast: attention over at most this many tokens uses `matmul_attention` instead of SDPA. Measured
# by benchmarks/attention_kernels.py (docs/benchmarks/throughput/2026-11-30/attention.md, idle machine): one 64-token
# cpu-tiny16 block takes 11-15 ms forward+backward that way against 25 with fp32 SDPA and 69 with bf16 SDPA (its CPU
# backward is slow for 8-channel heads), and 9 ms forward only against 16 with bf16 SDPA; at 256 tokens SDPA is as fast
# for training and 1.7x faster for sampling, so longer sequences keep it.
CPU_MATMUL_ATTENTION_MAX_TOKENS = 64


def attention_tokens(hidden_states) -> int:
    """Sequence length an attention block sees: H*W for (B, C, H, W) input, L for (B, L, C)."""
    return hidden_states.shape[-1] * hidden_states.shape[-2] if hidden_states.ndim == 4 else hidden_states.shape[1]


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(q k^T scale) v over (B, heads, L, d) as two matmuls in the input dtype (Vaswani et al. 2017, eq. 1).
    The softmax runs in that dtype too: PyTorch's softmax accumulates bf16 input in fp32, so its bf16 output equals an
    fp32 softmax rounded to bf16 (Diffusers' upcast_softmax; tested) without two casts of the L x L scores."""
    probs = torch.matmul(q * scale, k.transpose(-1, -2)).softmax(-1)
    return torch.matmul(probs, v)


class MatmulAttnProcessor(AttnProcessor2_0):
    """Self-attention of the U-Net's blocks with `matmul_attention` in place of SDPA (the parent handles every other
    case: masks, cross-attention, spatial or q/k norms)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        if (encoder_hidden_states is not None or attention_mask is not None or attn.spatial_norm is not None
                or attn.norm_q is not None or attn.norm_k is not None or hidden_states.ndim != 4):
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, temb, *args, **kwargs)
        residual = hidden_states
        b, c, h, w = hidden_states.shape
        x = hidden_states.view(b, c, h * w)
        x = (attn.group_norm(x) if attn.group_norm is not None else x).transpose(1, 2)
        heads = lambda y: y.view(b, h * w, attn.heads, -1).transpose(1, 2)  # noqa: E731
        out = matmul_attention(heads(attn.to_q(x)), heads(attn.to_k(x)), heads(attn.to_v(x)), attn.scale)
        out = attn.to_out[1](attn.to_out[0](out.transpose(1, 2).reshape(b, h * w, -1)))
        out = out.transpose(1, 2).reshape(b, c, h, w)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor


class CpuAttnProcessor(MatmulAttnProcessor):
    """SDPA; under CPU bf16 autocast (training and sampling), short sequences use `matmul_attention` (faster there)."""

    # The parent's named parameters, spelled out: Attention.forward inspects this signature and warns (every call)
    # about, then drops, any keyword it does not name - e.g. the U-Net's temb.
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args,
                 **kwargs):
        kwargs.update(encoder_hidden_states=encoder_hidden_states, attention_mask=attention_mask, temb=temb)
        if (hidden_states.device.type == "cpu" and torch.is_autocast_enabled("cpu")
                and attention_tokens(hidden_states) <= CPU_MATMUL_ATTENTION_MAX_TOKENS):
            return super().__call__(attn, hidden_states, *args, **kwargs)
        return AttnProcessor2_0.__call__(self, attn, hidden_states, *args, **kwargs)


def configure_attention(unet, impl: str = "auto", device_type: str = "cpu"):
    """Pick the attention kernel: 'sdpa' (torch scaled_dot_product_attention, Diffusers' default), 'classic'
    (Diffusers' AttnProcessor: baddbmm + softmax), 'matmul' (`matmul_attention`: two matmuls and a softmax) or 'auto'
    = SDPA, on the CPU with short sequences through `matmul_attention` under bf16 autocast
    (CPU_MATMUL_ATTENTION_MAX_TOKENS; bf16 SDPA backward over 8-channel heads is slow on the CPU). Same math every way;
    returns the U-Net.
    """
    if impl == "auto":
        proc = CpuAttnProcessor() if device_type == "cpu" else AttnProcessor2_0()
    else:
        proc = {"classic": AttnProcessor, "matmul": MatmulAttnProcessor}.get(impl, AttnProcessor2_0)()
    for module in unet.modules():
        if isinstance(module, Attention):
            module.set_processor(proc)
    return unet


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())
