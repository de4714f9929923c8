"""Timestep samplers by name; `build_sampler(cfg, device)` is what the training loop calls."""

from __future__ import annotations

import torch

from .base import TimestepSampler, UniformSampler

SAMPLERS: dict[str, type[TimestepSampler]] = {
    UniformSampler.name: UniformSampler,
}


def build_sampler(cfg, device: torch.device | str, tables=None) -> TimestepSampler:
    """The configured sampler; `tables` (DiffusionTables) gives methods the schedule's SNR and objective weights."""
    cls = SAMPLERS[cfg.timestep_sampler]
    return cls(cfg.ddpm_num_steps, device=device)


__all__ = ["SAMPLERS", "TimestepSampler", "UniformSampler", "build_sampler"]
