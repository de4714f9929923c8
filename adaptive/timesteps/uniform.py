"""Uniform timesteps: the DDPM default and the baseline of every comparison."""

from __future__ import annotations

import torch

from .base import TimestepSampler
from .registry import register


@register
class UniformSampler(TimestepSampler):
    """t ~ U{0, ..., T-1}, m = 1 (Ho et al. 2020, Algorithm 1)."""

    name = "uniform"
    tracks_by_default = False  # p is constant: its diagnostics only with --log_timestep_bins

    def weight_of(self, t):
        return torch.ones(t.shape, device=self.device)

    def draw(self, request):
        g = request.generator
        t = torch.randint(0, self.num_timesteps, (request.global_batch,), generator=g, device=g.device)
        return request.rows(t, self.weight_of(t).to(g.device))
