"""EDM2 learned uncertainty weighting (Karras et al. 2024, Sec. 3, eq. 21) moved to DDPMScheduler timesteps."""

from __future__ import annotations

import torch

from .base import TimestepSampler, bin_mean


def uncertainty_loss(per_sample_loss: torch.Tensor, u_t: torch.Tensor) -> torch.Tensor:
    """L / e^u + u (Karras et al. 2024, eq. 21): at the optimum e^u = E[L], so every noise level contributes ~1."""
    return per_sample_loss * torch.exp(-u_t) + u_t


def uncertainty_grad(per_sample_loss: torch.Tensor, bins: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """d/du of mean_i (L_i e^-u_b(i) + u_b(i)) for every bin b: sum_i in b (1 - L_i e^-u_b) / G."""
    g = 1.0 - per_sample_loss * torch.exp(-u[bins])
    return torch.zeros_like(u).index_add_(0, bins, g) / per_sample_loss.numel()


class EDM2UncertaintySampler(TimestepSampler):
    """t ~ U; the model minimises L_t e^{-u_b(t)} (+ u) with a learned log-variance u per timestep bin.

    CHANGES THE OBJECTIVE (deliberately): the model's loss at t is divided by e^{u_t} ~ E[L_t], i.e. every noise level
    is balanced to unit loss. u is learned by Adam on the exact gradient of the same loss computed from the losses
    gathered from all ranks (so every rank holds the same u; EDM2 learns u with an MLP in the model's optimizer).
    """

    name = "edm2_uncertainty"
    changes_objective = True
    importance_sampler = False  # no 1/p correction: the sampling distribution is part of the objective
    needs_losses = True
    num_bins = 50  # u is piecewise constant over 50 equal-width timestep bins (EDM2: a smooth MLP of log sigma)

    def __init__(self, num_timesteps, device="cpu", tables=None, cfg=None):
        super().__init__(num_timesteps, device, tables, cfg)
        lr = getattr(cfg, "uncertainty_lr", 1e-2) if cfg is not None else 1e-2
        self.u = torch.zeros(self.num_bins, device=self.device, requires_grad=True)  # log-variance per bin; EDM2 starts at 0
        self.opt = torch.optim.Adam([self.u], lr=lr, betas=(0.9, 0.99), eps=1e-8)

    def bins(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.num_bins // self.num_timesteps

    def weight_of(self, t):
        return torch.ones(t.shape, device=self.device)

    def sample(self, batch_size, device, generator):
        t = torch.randint(0, self.num_timesteps, (batch_size,), generator=generator, device=generator.device)
        return t.to(device), torch.ones(batch_size, device=device)

    def loss(self, t, weight, per_sample_loss):
        return weight * uncertainty_loss(per_sample_loss, self.u[self.bins(t)].detach())

    @torch.no_grad()
    def update(self, t, loss, grad_norm=None):
        t = t.to(self.device)
        self.u.grad = uncertainty_grad(loss.float().to(self.device), self.bins(t), self.u)
        self.opt.step()
        self.u.grad = None

    def u_per_t(self) -> torch.Tensor:
        return self.u.detach()[self.bins(torch.arange(self.num_timesteps, device=self.device))]

    def effective_weights(self):
        return super().effective_weights() * torch.exp(-self.u_per_t())

    def diagnostics(self):
        return {**super().diagnostics(), "u_by_t": bin_mean(self.u_per_t())}

    def state_dict(self):
        return {"u": self.u.detach().clone(), "opt": self.opt.state_dict()}

    def load_state_dict(self, state):
        with torch.no_grad():
            self.u.copy_(state["u"].to(self.device))
        self.opt.load_state_dict(state["opt"])

    def describe(self):
        return {**super().describe(), "objective": "sum_t w(t) MSE_t / e^{u_t}, u_t -> log E[w(t) MSE_t] (EDM2 balance)"}
