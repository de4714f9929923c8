"""SpeeD (Wang et al., CVPR 2025, arXiv 2405.17403): asymmetric sampling, dual (mirrored) timesteps, change-aware
weights.

Ported from the live code path of NUS-HPC-AI-Lab/SpeeD (`Speed_IDDPM`), with the schedule-dependent constants derived
from the configured betas instead of copied:
- m (mirror point): first t where the per-step increment of the noise std, d/dt sqrt(1 - abar_t), falls below
  1e-4 (x 1000/T), plus one - 642 on the linear schedule, as in the paper's code;
- tau (start of the "convergence area", hand-set to 700 in every SpeeD config): first t where that increment falls
  below half of m's threshold - 699 on the linear schedule;
- the change-aware weight uses d/dt (1 - abar_t), min-max normalised over all T (so w starts at ~0.41, not 0.4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch

from ..fields import setting
from .base import TimestepSampler
from .registry import register

M_THRESHOLD = 1e-4  # per-step increment of sqrt(1 - abar) at T = 1000 (SpeeD's code)
TAU_THRESHOLD = 0.5e-4  # our derivation of tau: half of m's threshold (reproduces tau ~ 700 on the linear schedule)


def speed_constants(alphas_cumprod: torch.Tensor) -> tuple[int, int, np.ndarray]:
    """(m, tau, mm) for a schedule: mirror point, asymmetry boundary, min-max-normalised d(1 - abar)/dt [T]."""
    abar = alphas_cumprod.double().cpu().numpy()
    T = len(abar)
    g = np.gradient(np.sqrt(1.0 - abar)) * T / 1000.0
    below = g < M_THRESHOLD
    if not below.any():
        raise ValueError("SpeeD: the noise-std increment never falls below 1e-4 on this schedule; no mirror point")
    m = int(np.argmax(below)) + 1
    tau = int(np.argmax(g < TAU_THRESHOLD)) if (g < TAU_THRESHOLD).any() else T
    d = np.gradient(1.0 - abar)
    mm = (d - d.min()) / (d.max() - d.min())
    return m, tau, mm


def speed_probabilities(T: int, tau: int, k: float) -> torch.Tensor:
    """Asymmetric proposal: p(t) proportional to k for t < tau and 1 for t >= tau (SpeeD, Sec. 4.2)."""
    p = torch.ones(T, dtype=torch.float64)
    p[:tau] = k
    return p / p.sum()


def speed_weights(mm: np.ndarray, tau: int, lam: float) -> torch.Tensor:
    """Change-aware weights: (1 - lam) + (2 lam - 1) mm_t for t < tau, 1 for t >= tau (SpeeD, Sec. 4.3)."""
    w = torch.ones(len(mm), dtype=torch.float64)
    w[:tau] = (1 - lam) + (2 * lam - 1) * torch.from_numpy(mm[:tau])
    return w


def dual_timesteps(t0: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """n//2 + 1 draws followed by their mirrors |m - t|, truncated to n (SpeeD's dual sampling)."""
    return torch.cat([t0, (m - t0).abs()])[:n]


@dataclass(frozen=True)
class SpeeDOptions:
    speed_k: float = setting(5.0, "SpeeD: sampling weight of t < tau relative to t >= tau")
    speed_lambda: float = setting(0.6, "SpeeD: change-aware weighting strength lambda")


@register
class SpeeDSampler(TimestepSampler):
    """SpeeD's sampling + weighting, per device batch, as in its code.

    CHANGES THE OBJECTIVE (deliberately, as the paper does): no importance correction, so the model minimises
    E_t~q[w_SpeeD(t) w(t) MSE_t] with q the dual-sampling marginal (~92% of draws below t = 642, weights 0.41-0.6
    below tau and 1 above).
    """

    name = "speed"
    Options = SpeeDOptions
    changes_objective = True  # no 1/p correction: the sampling distribution is part of the objective

    def __init__(self, num_timesteps, device="cpu", tables=None, options=None, *, per_device: Optional[int] = None):
        super().__init__(num_timesteps, device, tables, options)
        self.k, self.lam, self.per_device = self.options.speed_k, self.options.speed_lambda, per_device
        self.m, self.tau, mm = speed_constants(tables.alphas_cumprod)
        self.p = speed_probabilities(num_timesteps, self.tau, self.k).float().to(self.device)
        self.w = speed_weights(mm, self.tau, self.lam).float().to(self.device)

    @classmethod
    def from_options(cls, options: SpeeDOptions, cfg, device, tables):
        return cls(cfg.ddpm_num_steps, device, tables, options, per_device=cfg.train_batch_size)

    def _chunk(self, n: int, generator: torch.Generator) -> torch.Tensor:
        t0 = torch.multinomial(self.p.to(generator.device), n // 2 + 1, replacement=True, generator=generator)
        return dual_timesteps(t0, self.m, n)

    def draw(self, request):
        """Dual sampling per device batch of the global draw (its chunks of per_device rows)."""
        g, size = request.generator, request.global_batch
        n = self.per_device or size
        t = torch.cat([self._chunk(min(n, size - s), g) for s in range(0, size, n)])
        return request.rows(t, self.w[t.to(self.device)].to(g.device))

    def weight_of(self, t):
        return self.w[t]

    def probabilities(self):
        """Marginal of dual sampling for a per-device batch n: ((n//2+1) p(t) + (n//2-1) p_mirror(t)) / n."""
        n = self.per_device or 128
        n_orig, n_dual = n // 2 + 1, n - (n // 2 + 1)
        mirror = torch.zeros_like(self.p).index_add_(
            0, (self.m - torch.arange(self.num_timesteps, device=self.device)).abs(), self.p)
        return (n_orig * self.p + n_dual * mirror) / n

    def effective_weights(self):
        return self.num_timesteps * self.probabilities() * self.w * super().effective_weights()

    def describe(self):
        return {**super().describe(), "m": self.m, "tau": self.tau, "k": self.k, "lambda": self.lam,
                "objective": "E_t~q[w_SpeeD(t) w(t) MSE_t], q = dual-sampling marginal (no importance correction)"}
