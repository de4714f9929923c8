"""The timestep-sampler contract: everything the training loop knows about how t is chosen and how much it counts.

Per optimizer step the loop calls, in this order, on every rank:
  sample(G, generator, step, fraction) -> (t [G], m [G])  the whole global batch, identical on every rank (the same
                                                           generator), or None for methods that draw from x0
  take(draw, x0, sl, generator) -> (t [B], m [B])          this rank's micro-batch: by default its slice of the draw
  ... the model minimises mean(m * L), L = w(t) MSE_t the configured objective's per-sample loss ...
  before_update(model, accelerator)                        optional: methods that measure the model (kim2025)
  after_update(model, accelerator)                         around the optimizer step; every rank calls them
  update(t [G], L [G], grad_norm)                          the global batch's t and objective losses (gathered from
                                                           all ranks in draw order) and the pre-clip gradient norm
and once per log step `diagnostics()` (tensors, no host sync). State lives in tensors on the device, is identical on
every rank (it is only updated from gathered data) and round-trips through `state_dict`/`load_state_dict`.

m is the whole per-sample loss multiplier. The configured objective is E_{t ~ U}[w(t) MSE_t]; an unbiased method
draws t ~ p and returns m = lambda(t) / (T p_t), which leaves the objective lambda(t) w(t) MSE_t (lambda = 1: the
configured one) unchanged in expectation; a method with `changes_objective = True` optimises something else on
purpose and says what in `describe()`. Each method is built from the config by `from_config(cfg, device, tables)`.
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
    """Base class: draws t from `probabilities()` with multipliers 1/(T p_t), which keep E[m L] unbiased."""

    name = "base"
    changes_objective = False  # True for methods that deliberately optimise another objective than the configured one

    def __init__(self, num_timesteps: int, device: torch.device | str = "cpu", tables=None):
        self.num_timesteps = num_timesteps
        self.device = torch.device(device)
        self.tables = tables  # DiffusionTables (snr, objective weight per t) or None

    @classmethod
    def from_config(cls, cfg, device: torch.device | str, tables) -> "TimestepSampler":
        """The method with the config's settings (subclasses read their own fields here, and only here)."""
        return cls(cfg.ddpm_num_steps, device, tables)

    # -- drawing -------------------------------------------------------------------------------------------------
    def probabilities(self) -> torch.Tensor:
        """Current proposal p(t), float32 [T] on the device, sums to 1."""
        return torch.full((self.num_timesteps,), 1.0 / self.num_timesteps, device=self.device)

    def objective_weights(self) -> torch.Tensor:
        """[T]: weight of each t in the declared objective relative to the configured one (1 = unchanged)."""
        return torch.ones(self.num_timesteps, device=self.device)

    def weight_of(self, t: torch.Tensor) -> torch.Tensor:
        """The loss multiplier m that `sample` returns with timestep t: 1 / (T p_t) for unbiased samplers."""
        return importance_weights(self.probabilities(), t)

    def sample(self, batch_size: int, generator: torch.Generator, step: int = 0,
               fraction: float = 0.0) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """(t long [G], m float [G]) for the global batch, on the generator's device; `fraction` = share of the run
        done (steps, or the spent wall-clock budget), for methods whose objective follows the run."""
        p = self.probabilities()
        t = torch.multinomial(p.to(generator.device), batch_size, replacement=True, generator=generator)
        return t, self.weight_of(t.to(self.device)).to(generator.device)

    def take(self, draw, x0: torch.Tensor, sl: slice, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(t [B], m [B]) of this rank's micro-batch x0 [B, 3, S, S]: its slice `sl` of the global draw (methods that
        draw t from x0 use `generator`, seeded from (seed, step, micro-step, rank), instead)."""
        t, m = draw
        return t[sl], m[sl]

    # -- learning ------------------------------------------------------------------------------------------------
    def update(self, t: torch.Tensor, loss: torch.Tensor, grad_norm: Optional[torch.Tensor] = None) -> None:
        """Learn from the global batch's timesteps [G], per-sample objective losses [G] and the step's pre-clip gradient
        norm (all the same on every rank)."""

    def before_update(self, model: torch.nn.Module, accelerator) -> None:
        """Before the optimizer step (gradients computed), every rank: for methods that measure the model."""

    def after_update(self, model: torch.nn.Module, accelerator) -> None:
        """After the optimizer step, every rank: for methods that measure the model."""

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
        """Tensors for logging (no host sync here; the caller syncs once per log step): the proposal p [T], per-bin
        p and effective weight, entropy and ESS of p, method extras."""
        p = self.probabilities()
        return {"p": p, "p_by_t": bin_sum(p), "weight_by_t": bin_mean(self.effective_weights()),
                "p_entropy": entropy_fraction(p), "p_ess": ess_fraction(p)}

    def describe(self) -> dict:
        """What goes into the run's records: name, whether the objective is changed, and why."""
        return {"name": self.name, "changes_objective": self.changes_objective,
                "objective": "configured objective E_t~U[w(t) MSE_t], unbiased" if not self.changes_objective else ""}


class UniformSampler(TimestepSampler):
    """t ~ U{0, ..., T-1}, m = 1 (Ho et al. 2020, Algorithm 1)."""

    name = "uniform"

    def weight_of(self, t):
        return torch.ones(t.shape, device=self.device)

    def sample(self, batch_size, generator, step=0, fraction=0.0):
        t = torch.randint(0, self.num_timesteps, (batch_size,), generator=generator, device=generator.device)
        return t, self.weight_of(t).to(generator.device)
