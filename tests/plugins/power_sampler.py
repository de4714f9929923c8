"""A timestep method from outside the package (docs/adaptive.md, "Your own method"): t ~ p(t) proportional to
(t + 1)^-k, unbiased through the importance weights 1/(T p_t). Used as

    python train_accelerate.py --timestep_sampler tests.plugins.power_sampler:PowerSampler --power_exponent 0.3
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaptive.fields import at_least, setting
from adaptive.timesteps.base import TimestepSampler


@dataclass(frozen=True)
class PowerOptions:
    power_exponent: float = setting(0.5, "k of p(t) ~ (t + 1)^-k (0 = uniform)", check=at_least(0))


class PowerSampler(TimestepSampler):
    """More draws at low noise, p(t) ~ (t + 1)^-k, each weighted 1/(T p_t): the configured objective, unbiased."""

    name = "power"
    Options = PowerOptions

    def __init__(self, num_timesteps, device="cpu", tables=None, options=None):
        super().__init__(num_timesteps, device, tables, options)  # self.options: PowerOptions, the flags' values
        p = (torch.arange(num_timesteps, device=self.device) + 1.0) ** -self.options.power_exponent
        self.p = p / p.sum()

    def probabilities(self):
        return self.p


class CountingPowerSampler(PowerSampler):
    """PowerSampler that records the loop's calls into it (tests/test_methods.py: at most three per step)."""

    calls: list[str] = []

    def draw(self, request):
        self.calls.append("draw")
        return super().draw(request)

    def around_update(self, model, accelerator, draw):
        self.calls.append("around_update")
        return super().around_update(model, accelerator, draw)

    def observe(self, t, loss, grad_norm=None):
        self.calls.append("observe")
        return super().observe(t, loss, grad_norm)


class BrokenPowerSampler(PowerSampler):
    """A user's method whose constructor fails (tests/test_methods.py: one line naming it, the flag and the cause)."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("needs a GPU table this machine lacks")
