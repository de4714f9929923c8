"""EDM2 learned uncertainty weighting (Karras et al. 2024, Sec. 3, eq. 21) moved to DDPMScheduler timesteps."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..fields import above, setting
from .base import Draw, bin_mean
from .registry import register
from .uniform import UniformSampler


def uncertainty_grad(per_sample_loss: torch.Tensor, bins: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """d/du of mean_i (L_i e^-u_b(i) + u_b(i)) (Karras et al. 2024, eq. 21; at the optimum e^u = E[L]) for every bin
    b: sum_i in b (1 - L_i e^-u_b) / G."""
    g = 1.0 - per_sample_loss * torch.exp(-u[bins])
    g = torch.where(torch.isfinite(g), g, torch.zeros_like(g))  # a non-finite loss teaches u nothing
    return torch.zeros_like(u).index_add_(0, bins, g) / per_sample_loss.numel()


@dataclass(frozen=True)
class EDM2Options:
    uncertainty_lr: float = setting(1e-2, "Adam learning rate of edm2_uncertainty's log-variances u_t", check=above(0))


@register
class EDM2UncertaintySampler(UniformSampler):
    """t ~ U; the model minimises L_t e^{-u_b(t)} (+ u) with a learned log-variance u per timestep bin.

    CHANGES THE OBJECTIVE (deliberately): the model's loss at t is divided by e^{u_t} ~ E[L_t], i.e. every noise level
    is balanced to unit loss. The loss multiplier is m = e^{-u_b(t)} (the + u term of eq. 21 has no gradient in the
    model's parameters). u is learned by Adam on the exact gradient of that loss computed from the losses gathered from
    all ranks (so every rank holds the same u; EDM2 learns u with an MLP in the model's optimizer).
    """

    name = "edm2_uncertainty"
    Options = EDM2Options
    changes_objective = True
    tracks_by_default = True
    num_bins = 50  # u is piecewise constant over 50 equal-width timestep bins (EDM2: a smooth MLP of log sigma)

    def __init__(self, num_timesteps, device="cpu", tables=None, options=None):
        super().__init__(num_timesteps, device, tables, options)
        # log-variance per bin; EDM2 starts at 0
        self.u = torch.zeros(self.num_bins, device=self.device, requires_grad=True)
        self.opt = torch.optim.Adam([self.u], lr=self.options.uncertainty_lr, betas=(0.9, 0.99), eps=1e-8)

    def bins(self, t: torch.Tensor) -> torch.Tensor:
        return t * self.num_bins // self.num_timesteps

    def draw(self, request):
        d = super().draw(request)
        return Draw(d.t, d.m * torch.exp(-self.u.detach()[self.bins(d.t.to(self.device))]).to(d.m.device))

    @torch.no_grad()
    def observe(self, t, loss, grad_norm=None):
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
        for group in self.opt.param_groups:  # the configured --uncertainty_lr applies on resume, not the saved one
            group["lr"] = self.opt.defaults["lr"]

    def describe(self):
        return {**super().describe(),
                "objective": "sum_t w(t) MSE_t / e^{u_t}, u_t -> log E[w(t) MSE_t] (EDM2 balance)"}
