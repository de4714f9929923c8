"""Timestep samplers by name; `build_sampler(cfg, device, tables)` is what the training set-up calls.

A new method: one file in this package (a TimestepSampler subclass with `from_config`), one line in SAMPLERS, one
entry in the config's CHOICES["timestep_sampler"], and a test in tests/test_timesteps.py (docs/architecture.md).
"""

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


def build_sampler(cfg, device: torch.device | str, tables) -> TimestepSampler:
    """The configured method; `tables` (DiffusionTables) gives it the schedule's SNR and objective weights."""
    return SAMPLERS[cfg.timestep_sampler].from_config(cfg, device, tables)


__all__ = ["SAMPLERS", "TimestepSampler", "UniformSampler", "build_sampler"]
