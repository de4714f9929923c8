"""Kim, Ki, Shim, Lee, "Adaptive Non-Uniform Timestep Sampling for Diffusion Model Training" (CVPR 2025,
arXiv 2411.09998).

A port of the behaviour of ku-dmlab/Adaptive-Timestep-Sampler (its intent where the published code is broken):
- policy pi(t | x0): CNN (3->32->64->128 conv + max-pool) + MLP (2 x 256) -> (alpha, beta) = softplus + 1e-5, last
  layer initialised to weight 0, bias 0.5 (Beta(0.974, 0.974), near uniform); t = round(u (T - 1)), u ~ Beta;
- the diffusion loss is the plain batch mean (no importance correction);
- every 40 optimizer steps: the VLB terms KL_t(x0) (fixed-large variance, bits/dim) of ONE shared x0 for all T
  timesteps before and after the model update give Delta in R^T; (Delta, sum Delta) enter a ring buffer of 20; the
  3 timesteps whose Delta best predicts sum Delta (|Pearson r|, i.e. sklearn's f_regression ranking; S starts at
  {0, 1, 2}) define the reward r_j = sum_{s in S} [KL_s(x_j) before - after] + 0.01 H(Beta_j) (entropy not detached,
  as in the code); REINFORCE loss -mean_j log pi(u_j | x_j) r_j, gradient clip 1, Adam lr 1e-2.
Deviations, all towards the paper's intent: the selector's 1-tuple crash is fixed; the policy, its optimizer, the
buffer and S are checkpointed; every KL uses one U-Net forward (the code did a second, discarded one); the 40-step
counter runs over optimizer steps (not batches within an epoch); selection starts with 3 buffer rows (with 2 every
correlation is degenerate); noise comes from seeded generators. The policy's input size follows the resolution.
CHANGES THE OBJECTIVE (deliberately): the model minimises E_x0 E_t~pi(.|x0)[w(t) MSE_t].
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..seeding import generator as make_generator
from .base import Draw, TimestepSampler
from .registry import register

UPDATE_EVERY = 40
BUFFER = 20
NUM_SELECTED = 3
ENTROPY_COEF = 0.01
POLICY_LR = 1e-2
EPS_U = 1e-6  # u is clamped to [EPS_U, 1 - EPS_U]: log_prob is infinite at 0 and 1


class BetaPolicy(nn.Module):
    """Kim et al.'s policy network: x0 [B, 3, S, S] in [-1, 1] -> (alpha, beta) [B]."""

    def __init__(self, resolution: int):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )
        flat = 128 * (resolution // 8) ** 2
        self.head = nn.Sequential(nn.Linear(flat, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 2))
        nn.init.zeros_(self.head[-1].weight)
        nn.init.constant_(self.head[-1].bias, 0.5)

    def forward(self, x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.head(self.features(x0).flatten(1))
        ab = F.softplus(out) + 1e-5
        return ab[:, 0], ab[:, 1]


def sample_gamma(alpha: torch.Tensor, generator: torch.Generator, candidates: int = 8) -> torch.Tensor:
    """Gamma(alpha, 1) draws from a seeded generator (Marsaglia & Tsang 2000; alpha < 1 via the U^(1/alpha) boost).

    Vectorised with `candidates` proposals per element (acceptance >= 95% each, so all-rejected has probability
    < 1e-10; such an element falls back to its mean) - no data-dependent loop, no host sync.
    """
    a = alpha.detach().float()
    boost = a < 1
    a1 = torch.where(boost, a + 1, a)
    d = a1 - 1.0 / 3
    c = 1.0 / torch.sqrt(9 * d)
    dev = generator.device
    x = torch.randn((candidates, *a.shape), generator=generator, device=dev).to(a.device)
    u = torch.rand((candidates, *a.shape), generator=generator, device=dev).to(a.device)
    v = (1 + c * x) ** 3
    ok = (v > 0) & (u.clamp_min(1e-30).log() < 0.5 * x**2 + d - d * v + d * v.clamp_min(1e-30).log())
    first = torch.argmax(ok.int(), dim=0)
    g = torch.gather(d * v, 0, first[None])[0]
    g = torch.where(ok.any(0), g, a1)
    ub = torch.rand(a.shape, generator=generator, device=dev).to(a.device)
    return torch.where(boost, g * ub.clamp_min(1e-30) ** (1.0 / a), g)


def kl_coefficients(betas: torch.Tensor) -> torch.Tensor:
    """c_t with KL_t = c_t ||eps - eps_hat||^2 / D + const, fixed-large variance (Ho et al. 2020, eq. 12; Kim's
    code)."""
    b = betas.double()
    a = 1 - b
    abar = torch.cumprod(a, 0)
    abar_prev = torch.cat([torch.ones(1, dtype=b.dtype), abar[:-1]])
    post_var = b * (1 - abar_prev) / (1 - abar)
    sigma2 = b.clone()
    sigma2[0] = post_var[1]
    return (b**2 / (2 * sigma2 * a * (1 - abar))) / math.log(2)  # bits per dimension


def pearson_scores(X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """|Pearson r| of every column of X [n, T] with y [n] (f_regression ranks by r^2); 0 for constant columns."""
    Xc, yc = X - X.mean(0), y - y.mean()
    den = Xc.norm(dim=0) * yc.norm()
    return torch.where(den > 0, (Xc * yc[:, None]).sum(0).abs() / den.clamp_min(1e-30), torch.zeros_like(den))


@dataclass(frozen=True)
class PolicyDraw:
    """What a policy-update step's draw keeps for the update around the optimizer step: the step and, per
    micro-batch, x0 [B, 3, S, S] and the Beta draws u [B]."""

    step: int
    x0: tuple[torch.Tensor, ...]
    u: tuple[torch.Tensor, ...]


@register
class Kim2025Sampler(TimestepSampler):
    name = "kim2025"
    changes_objective = True  # no 1/p correction: the sampling distribution is part of the objective
    needs = frozenset({"step", "batch"})  # t is drawn from each sample's x0; the policy learns every 40 steps
    update_period = UPDATE_EVERY

    def __init__(self, num_timesteps, device="cpu", tables=None, options=None, *, resolution: int, seed: int):
        super().__init__(num_timesteps, device, tables, options)
        self.resolution, self.seed = resolution, seed
        self.policy = BetaPolicy(self.resolution).to(self.device)
        self.opt = torch.optim.Adam(self.policy.parameters(), lr=POLICY_LR)
        abar = tables.alphas_cumprod.double()
        betas = 1 - abar / torch.cat([torch.ones(1, dtype=abar.dtype), abar[:-1]])
        self.c = kl_coefficients(betas).float().to(self.device)  # [T]
        self.buffer_x = torch.zeros(BUFFER, num_timesteps, device=self.device)  # Delta rows
        self.buffer_y = torch.zeros(BUFFER, device=self.device)  # sum Delta
        self.filled, self.ptr = 0, 0
        self.selected = torch.arange(NUM_SELECTED, device=self.device)  # S, starts {0, 1, 2}
        self.updates = 0
        self.last_ab = torch.full((2, 1), 0.974, device=self.device)  # for diagnostics

    @classmethod
    def from_options(cls, options, cfg, device, tables):
        return cls(cfg.ddpm_num_steps, device, tables, options, resolution=cfg.resolution, seed=cfg.seed)

    # -- drawing -------------------------------------------------------------------------------------------------
    @staticmethod
    def is_update_step(step: int) -> bool:
        return step % UPDATE_EVERY == 0

    def draw(self, request):
        """No global draw: each micro-batch's t from its x0 (`take`), with the micro-step's own generator."""
        parts = [self.take(x0, request.micro_generator(i)) for i, x0 in enumerate(request.batch)]
        context = None
        if self.is_update_step(request.step):
            context = PolicyDraw(request.step, tuple(x0.detach() for x0 in request.batch),
                                 tuple(u for _, _, u in parts))
        return Draw(torch.cat([t for t, _, _ in parts]), torch.cat([m for _, m, _ in parts]), context)

    @torch.no_grad()
    def take(self, x0: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(t, m, u) [B] of micro-batch x0: t_i = round(u_i (T - 1)), u_i ~ Beta(pi(x0_i)); m = 1 (the plain batch
        mean)."""
        alpha, beta = self.policy(x0.float())
        ga, gb = sample_gamma(alpha, generator), sample_gamma(beta, generator)
        u = (ga / (ga + gb).clamp_min(1e-30)).clamp(EPS_U, 1 - EPS_U)
        t = torch.round(u * (self.num_timesteps - 1)).long()
        self.last_ab = torch.stack([alpha, beta])
        return t, torch.ones_like(u), u

    def weight_of(self, t):
        return torch.ones(t.shape, device=self.device)

    def probabilities(self):
        """Mean of the discretised Beta densities of the last sampled batch (diagnostics)."""
        grid = ((torch.arange(self.num_timesteps, device=self.device) + 0.5)
                / self.num_timesteps).clamp(EPS_U, 1 - EPS_U)
        a, b = self.last_ab[0][:64, None], self.last_ab[1][:64, None]
        dens = torch.distributions.Beta(a, b).log_prob(grid[None]).exp().mean(0)
        return dens / dens.sum()

    # -- the policy update around the optimizer step ----------------------------------------------------------------
    @torch.no_grad()
    def _kl_terms(self, model, x0: torch.Tensor, t: torch.Tensor, gen: torch.Generator, autocast, chunk: int = 250):
        """KL_t(x0_i) up to a constant: c_t mean((eps - eps_hat)^2), one U-Net forward per term, fresh noise."""
        out = []
        sa, s1 = self.tables.sqrt_abar, self.tables.sqrt_one_minus_abar
        for i in range(0, len(t), chunk):
            xi, ti = x0[i : i + chunk], t[i : i + chunk]
            eps = torch.randn(xi.shape, generator=gen, device=gen.device).to(xi.device)
            xt = sa[ti][:, None, None, None] * xi + s1[ti][:, None, None, None] * eps
            with autocast():
                pred = model(xt, ti).sample
            out.append(self.c[ti] * (pred.float() - eps).square().flatten(1).mean(1))
        return torch.cat(out)

    def _measure(self, model, acc, drawn: PolicyDraw, phase: str) -> dict:
        """KL terms of one shared x0 at all T timesteps (split across ranks, gathered) and of this rank's x0 at the
        selected timesteps S. Collectives: every rank calls this at the same steps."""
        x_local = torch.cat(drawn.x0)
        # one x0 shared by all ranks (rank 0's first image), its T timesteps split across ranks
        shared = x_local[:1].clone()
        if acc.num_processes > 1:
            from accelerate.utils import broadcast

            shared = broadcast(shared, from_process=0)
        per = -(-self.num_timesteps // acc.num_processes)
        ts = torch.arange(acc.process_index * per, min(self.num_timesteps, (acc.process_index + 1) * per),
                          device=self.device)
        ts = torch.cat([ts, ts.new_full((per - len(ts),), self.num_timesteps - 1)])  # pad to equal length
        g = make_generator(self.device, self.seed, "kim2025", drawn.step, phase, acc.process_index)
        kl_all = self._kl_terms(model, shared.expand(per, -1, -1, -1), ts, g, acc.autocast)
        if acc.num_processes > 1:
            kl_all = acc.gather(kl_all)
        kl_all = kl_all[: self.num_timesteps]
        s = self.selected
        xs = x_local.repeat_interleave(len(s), 0)
        kl_s = self._kl_terms(model, xs, s.repeat(len(x_local)), g, acc.autocast).view(len(x_local), len(s))
        return {"all": kl_all, "S": kl_s}

    @contextlib.contextmanager
    def around_update(self, model, accelerator, draw):
        """On a policy-update step: the KL terms before and after the optimizer update, then the policy step."""
        drawn = draw.context
        if drawn is None:
            yield
            return
        before = self._measure(model, accelerator, drawn, "before")
        yield
        after = self._measure(model, accelerator, drawn, "after")
        self._learn(accelerator, drawn, before, after)

    def _learn(self, accelerator, drawn: PolicyDraw, before: dict, after: dict) -> None:
        """REINFORCE step of the policy from the KL decrease, then the buffer and the selected timesteps S."""
        delta = before["all"] - after["all"]  # [T]
        reward = (before["S"] - after["S"]).sum(1)  # [B_local]
        # policy gradient (REINFORCE), averaged over ranks like the original DDP-wrapped policy
        x_local = torch.cat(drawn.x0)
        u = torch.cat(drawn.u)
        alpha, beta = self.policy(x_local.float())
        dist = torch.distributions.Beta(alpha, beta)
        entropy = dist.entropy()
        r = reward.detach() + ENTROPY_COEF * entropy  # entropy not detached, as in the original code
        loss = -(dist.log_prob(u) * r).mean()
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        acc = accelerator
        if acc.num_processes > 1:
            for p in self.policy.parameters():
                p.grad = acc.reduce(p.grad, reduction="mean")
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.opt.step()
        # buffer and timestep selection (used from the next update on)
        with torch.no_grad():
            self.buffer_x[self.ptr] = delta
            self.buffer_y[self.ptr] = delta.sum()
            self.ptr = (self.ptr + 1) % BUFFER
            self.filled = min(BUFFER, self.filled + 1)
            if self.filled >= 3:
                scores = pearson_scores(self.buffer_x[: self.filled], self.buffer_y[: self.filled])
                self.selected = torch.topk(scores, NUM_SELECTED).indices.sort().values
        self.updates += 1

    # -- state ---------------------------------------------------------------------------------------------------
    def state_dict(self):
        return {"policy": self.policy.state_dict(), "opt": self.opt.state_dict(), "buffer_x": self.buffer_x.clone(),
                "buffer_y": self.buffer_y.clone(), "filled": self.filled, "ptr": self.ptr,
                "selected": self.selected.clone(), "updates": self.updates}

    def load_state_dict(self, state):
        self.policy.load_state_dict(state["policy"])
        self.opt.load_state_dict(state["opt"])
        self.buffer_x.copy_(state["buffer_x"].to(self.device))
        self.buffer_y.copy_(state["buffer_y"].to(self.device))
        self.filled, self.ptr, self.updates = int(state["filled"]), int(state["ptr"]), int(state["updates"])
        self.selected = state["selected"].to(self.device)

    def diagnostics(self):
        d = super().diagnostics()
        d["kim_alpha"] = self.last_ab[0].mean()
        d["kim_beta"] = self.last_ab[1].mean()
        return d

    def describe(self):
        return {**super().describe(), "objective": "E_x0 E_t~pi(.|x0)[w(t) MSE_t], plain batch mean (policy learned)",
                "update_every": UPDATE_EVERY, "buffer": BUFFER, "selected": NUM_SELECTED}
