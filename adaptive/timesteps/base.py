"""The timestep-sampler interface: the only thing the training loop knows about how t is chosen.

Per optimizer step the loop calls `sample(G, device, generator)` once for the whole global batch (every rank with the
same generator, so all ranks hold the same t and take their slice), minimises mean(loss(t, weight, per_sample_loss)),
and, if `needs_losses`, calls `update(t, loss)` with the per-sample objective losses gathered from all ranks. State
lives in tensors on the device, is identical on every rank, and round-trips through `state_dict`/`load_state_dict`.

The configured objective is E_{t ~ U}[w(t) MSE_t] (w from --loss_weighting, already inside per_sample_loss). An
unbiased sampler draws t ~ p and multiplies by 1/(T p_t), which leaves the objective and its gradient unchanged in
expectation (only the variance changes); a sampler with `changes_objective = True` optimises something else on
purpose and says what in `describe()`.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

DIAGNOSTIC_BINS = 10  # timestep bins for logged per-t statistics


def importance_weights(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """w = 1 / (T p_t): E_{t~p}[w f(t)] = mean_t f(t) for any f (Nichol & Dhariwal 2021, Sec. 3.3)."""
    return 1.0 / (p.numel() * p[t])


def entropy_fraction(p: torch.Tensor) -> torch.Tensor:
    """H(p) / log T: 1 for uniform, 0 for a point mass."""
    return -(p * p.clamp_min(1e-30).log()).sum() / math.log(p.numel())


def ess_fraction(p: torch.Tensor) -> torch.Tensor:
    """Effective sample size per draw of importance weights 1/(T p): (E_p w)^2 / E_p w^2 = T^2 / sum_t (1 / p_t)."""
    return p.numel() ** 2 / (1.0 / p.clamp_min(1e-30)).sum()


def bin_sum(values: torch.Tensor, bins: int = DIAGNOSTIC_BINS) -> torch.Tensor:
    """[T] -> [bins]: sums over equal-width timestep bins."""
    T = values.numel()
    idx = torch.arange(T, device=values.device) * bins // T
    return torch.zeros(bins, device=values.device, dtype=values.dtype).index_add_(0, idx, values)


def bin_mean(values: torch.Tensor, bins: int = DIAGNOSTIC_BINS) -> torch.Tensor:
    T = values.numel()
    counts = bin_sum(torch.ones(T, device=values.device, dtype=values.dtype), bins)
    return bin_sum(values, bins) / counts


class TimestepSampler:
    """Base class: draws t from `probabilities()` with importance weights 1/(T p_t), which keep E[w L] unbiased."""

    name = "base"
    changes_objective = False  # True for methods that deliberately optimise another objective than the configured one
    needs_losses = False  # True when update() uses the gathered per-sample losses
    conditional = False  # True when t depends on x0: the loop calls sample_conditional per micro-batch instead
    importance_sampler = True  # weight_of(t) p(t) T = objective_weights(t): exactly unbiased for the declared objective

    def __init__(self, num_timesteps: int, device: torch.device | str = "cpu", tables=None, cfg=None):
        self.num_timesteps = num_timesteps
        self.device = torch.device(device)
        self.tables = tables  # DiffusionTables (snr, objective weight per t) or None in unit tests
        self.cfg = cfg

    # -- drawing -------------------------------------------------------------------------------------------------
    def probabilities(self) -> torch.Tensor:
        """Current proposal p(t), float32 [T] on the device, sums to 1."""
        return torch.full((self.num_timesteps,), 1.0 / self.num_timesteps, device=self.device)

    def objective_weights(self) -> torch.Tensor:
        """[T]: weight of each t in the declared objective relative to the configured one (1 = unchanged)."""
        return torch.ones(self.num_timesteps, device=self.device)

    def weight_of(self, t: torch.Tensor) -> torch.Tensor:
        """The loss multiplier that `sample` returns with timestep t: 1 / (T p_t) for unbiased samplers."""
        return importance_weights(self.probabilities(), t)

    def sample(self, batch_size: int, device: torch.device | str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(t long [B], weight float [B]) with weight = 1 / (T p_t)."""
        p = self.probabilities()
        t = torch.multinomial(p.to(generator.device), batch_size, replacement=True, generator=generator).to(self.device)
        return t.to(device), self.weight_of(t).to(device)

    def sample_conditional(self, x0: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(t, weight) for this rank's micro-batch x0 [B, 3, S, S] (conditional samplers only)."""
        raise NotImplementedError

    def loss(self, t: torch.Tensor, weight: torch.Tensor, per_sample_loss: torch.Tensor) -> torch.Tensor:
        """Per-sample training loss [B] whose mean is minimised."""
        return weight * per_sample_loss

    # -- learning ------------------------------------------------------------------------------------------------
    def update(self, t: torch.Tensor, loss: torch.Tensor, grad_norm: Optional[torch.Tensor] = None) -> None:
        """Learn from the global batch's timesteps [G], per-sample objective losses [G] and the step's pre-clip gradient
        norm (all the same on every rank)."""

    # Hooks around the optimizer step, for methods that measure the model itself (kim2025); ctx carries
    # accelerator, model (unwrapped), autocast, seed. Every rank calls them.
    def begin_step(self, step: int, progress: float = 0.0) -> None:
        """Called first in every optimizer step; progress = fraction of the run done (steps or wall-clock budget)."""

    def before_optimizer_step(self, ctx) -> None:
        pass

    def after_optimizer_step(self, ctx) -> None:
        pass

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors that join the model's optimizer (none for the samplers shipped here)."""
        return []

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    # -- what the user sees --------------------------------------------------------------------------------------
    def effective_weights(self) -> torch.Tensor:
        """[T]: T p(t) x E[loss multiplier | t] x w(t) - how much each t counts in the expected gradient."""
        w_obj = self.tables.weight if self.tables is not None else torch.ones(self.num_timesteps, device=self.device)
        return w_obj  # unbiased: T p(t) * 1/(T p(t)) * w(t)

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """Tensors for logging (no host sync here; the caller syncs once per log step)."""
        p = self.probabilities()
        return {"p_by_t": bin_sum(p), "weight_by_t": bin_mean(self.effective_weights()),
                "p_entropy": entropy_fraction(p), "p_ess": ess_fraction(p)}

    def describe(self) -> dict:
        """What goes into the run's records: name, whether the objective is changed, and why."""
        return {"name": self.name, "changes_objective": self.changes_objective,
                "objective": "configured objective E_t~U[w(t) MSE_t], unbiased" if not self.changes_objective else ""}


class UniformSampler(TimestepSampler):
    """t ~ U{0, ..., T-1}, weight 1 (Ho et al. 2020, Algorithm 1)."""

    name = "uniform"

    def weight_of(self, t):
        return torch.ones(t.shape, device=self.device)

    def sample(self, batch_size, device, generator):
        t = torch.randint(0, self.num_timesteps, (batch_size,), generator=generator, device=generator.device)
        return t.to(device), torch.ones(batch_size, device=device)
