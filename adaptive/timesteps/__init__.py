"""Timestep samplers by name; `build_sampler(cfg, device, tables)` is what the training loop calls."""

from __future__ import annotations

import torch

from .adaptive import AdaptiveSampler
from .base import TimestepSampler, UniformSampler
from .edm2 import EDM2UncertaintySampler
from .iddpm import IDDPMSampler
from .kim2025 import Kim2025Sampler
from .speed import SpeeDSampler

SAMPLERS: dict[str, type[TimestepSampler]] = {
    cls.name: cls for cls in (UniformSampler, IDDPMSampler, SpeeDSampler, EDM2UncertaintySampler, Kim2025Sampler,
                AdaptiveSampler)
}


def build_sampler(cfg, device: torch.device | str, tables=None) -> TimestepSampler:
    """The configured sampler; `tables` (DiffusionTables) gives methods the schedule's SNR and objective weights."""
    cls = SAMPLERS[cfg.timestep_sampler]
    return cls(cfg.ddpm_num_steps, device=device, tables=tables, cfg=cfg)


__all__ = ["SAMPLERS", "TimestepSampler", "UniformSampler", "build_sampler"]
