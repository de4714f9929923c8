"""Improved-DDPM loss-second-moment importance sampling (Nichol & Dhariwal 2021, Sec. 3.3,
LossSecondMomentResampler)."""

from __future__ import annotations

import torch

from .base import TimestepSampler
from .registry import register


def iddpm_probabilities(history: torch.Tensor, counts: torch.Tensor, history_len: int,
                        uniform_prob: float) -> torch.Tensor:
    """p_t = (1 - u) sqrt(E[L_t^2]) / sum + u / T once every t has a full history, else uniform (ibid., eq. 16)."""
    T = history.shape[0]
    if not bool((counts >= history_len).all()):  # host check of a [T] bool: only while warming up, see observe()
        return torch.full((T,), 1.0 / T, device=history.device)
    w = history.square().mean(1).sqrt()
    return (1 - uniform_prob) * w / w.sum() + uniform_prob / T


@register
class IDDPMSampler(TimestepSampler):
    """Keep the last 10 losses per t; uniform until all are full; then p ~ sqrt(E L^2) with a 0.001 uniform mix,
    weight 1/(T p_t). Unbiased for the configured objective. Updates come from the losses of all ranks, so every
    rank holds the same history (the public code did this too, but with an unseeded RNG and no saved state)."""

    name = "iddpm"
    history_len = 10
    uniform_prob = 0.001

    def __init__(self, num_timesteps, device="cpu", tables=None, options=None):
        super().__init__(num_timesteps, device, tables, options)
        self.history = torch.zeros(num_timesteps, self.history_len, device=self.device)  # ring buffers [T, 10]
        self.counts = torch.zeros(num_timesteps, dtype=torch.long, device=self.device)  # entries written per t
        self.warm = False  # every t has a full history; checked every 10 observations (a host sync), then fixed
        self.updates = 0
        self._p = None

    def probabilities(self):
        if self._p is None:
            if not self.warm:
                return torch.full((self.num_timesteps,), 1.0 / self.num_timesteps, device=self.device)
            self._p = iddpm_probabilities(self.history, self.counts, self.history_len, self.uniform_prob)
        return self._p

    @torch.no_grad()
    def observe(self, t, loss, grad_norm=None):
        """Append each (t, loss) to t's ring buffer, in batch order (later entries of the same t win)."""
        t, loss = t.to(self.device), loss.detach().float().to(self.device)
        order = torch.argsort(t, stable=True)
        ts, ls = t[order], loss[order]
        # rank of each sample among the samples of its t in this batch: 0, 1, 2, ...
        first = torch.searchsorted(ts, ts, right=False)
        rank = torch.arange(len(ts), device=self.device) - first
        n_t = torch.bincount(ts, minlength=self.num_timesteps)
        keep = rank >= (n_t[ts] - self.history_len)  # only the last history_len of each t matter
        ts, ls, rank = ts[keep], ls[keep], rank[keep]
        slot = (self.counts[ts] + rank) % self.history_len  # as if written one by one: oldest is overwritten next
        self.history[ts, slot] = ls
        self.counts += n_t
        self._p = None
        self.updates += 1
        if not self.warm and self.updates % 10 == 0:
            self.warm = bool((self.counts >= self.history_len).all())  # sync point: every 10 steps until warm

    def state_dict(self):
        return {"history": self.history.clone(), "counts": self.counts.clone(), "warm": self.warm,
                "updates": self.updates}

    def load_state_dict(self, state):
        self.history.copy_(state["history"].to(self.device))
        self.counts.copy_(state["counts"].to(self.device))
        self.warm, self.updates = bool(state["warm"]), int(state["updates"])
        self._p = None
