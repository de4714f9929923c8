"""The timestep-sampler interface: the only thing the training loop knows about how t is chosen.

Per optimizer step the loop calls `sample(G, device, generator)` once for the whole global batch (every rank with the
same generator, so all ranks hold the same t and take their slice), minimises mean(loss(t, weight, per_sample_loss)),
and, if `needs_losses`, calls `update(t, loss)` with the per-sample losses gathered from all ranks. State lives in
tensors on the device, is identical on every rank, and round-trips through `state_dict` / `load_state_dict`.
"""

from __future__ import annotations

from typing import Optional

import torch


class TimestepSampler:
    """Base class: draws t from `probabilities()` with importance weights 1/(T p_t), which keep E[w L] unbiased."""

    name = "base"
    changes_objective = False  # True for methods that deliberately optimise another objective than the configured one
    needs_losses = False  # True when update() uses the gathered per-sample losses

    def __init__(self, num_timesteps: int, device: torch.device | str = "cpu"):
        self.num_timesteps = num_timesteps
        self.device = torch.device(device)

    # -- drawing -------------------------------------------------------------------------------------------------
    def probabilities(self) -> torch.Tensor:
        """Current proposal p(t), float32 [T] on the device, sums to 1."""
        return torch.full((self.num_timesteps,), 1.0 / self.num_timesteps, device=self.device)

    def sample(self, batch_size: int, device: torch.device | str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(t long [B], weight float [B]) with weight = 1 / (T p_t)."""
        p = self.probabilities()
        t = torch.multinomial(p, batch_size, replacement=True, generator=generator)
        weight = 1.0 / (self.num_timesteps * p[t])
        return t.to(device), weight.to(device)

    def loss(self, t: torch.Tensor, weight: torch.Tensor, per_sample_loss: torch.Tensor) -> torch.Tensor:
        """Per-sample training loss [B] whose mean is minimised."""
        return weight * per_sample_loss

    # -- learning ------------------------------------------------------------------------------------------------
    def update(self, t: torch.Tensor, loss: torch.Tensor) -> None:
        """Learn from the global batch's timesteps [G] and per-sample losses [G] (identical on every rank)."""

    def parameters(self) -> list[torch.nn.Parameter]:
        """Trainable tensors that join the optimizer (none for most samplers)."""
        return []

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def diagnostics(self) -> dict[str, torch.Tensor]:
        """Tensors for logging (no host sync here; the caller syncs once per log step)."""
        return {}

    def describe(self) -> dict:
        """What goes into the run's config: name, whether the objective is changed, and why."""
        return {"name": self.name, "changes_objective": self.changes_objective}


class UniformSampler(TimestepSampler):
    """t ~ U{0, ..., T-1}, weight 1 (Ho et al. 2020, Algorithm 1)."""

    name = "uniform"

    def sample(self, batch_size, device, generator):
        t = torch.randint(0, self.num_timesteps, (batch_size,), generator=generator, device=generator.device)
        return t.to(device), torch.ones(batch_size, device=device)
