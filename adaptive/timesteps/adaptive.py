"""`adaptive` (ours): the configured objective at a stationary loss scale, optimised with variance-aware stratified
importance sampling; optionally an online loss-balanced objective (--adaptive_balance > 0).

Statistics (from the per-sample losses gathered from all ranks, identical on every rank, on the device):
  m1_b, m2_b = running means of L and L^2 in timestep bin b (L = the configured objective's per-sample loss).
Objective (explicit, see docs/adaptive.md):
  lambda_b = m1_b^-beta / mean_b'(m1_b'^-beta)          (beta = --adaptive_balance; 0, the default since issue 54's
                                                         v4 development table, = the configured objective)
  J = (1/T) sum_t lambda_b(t) E[L_t]                     at its fixed point every bin contributes ~equally (beta = 1)
Loss scale (the only thing Adam is not invariant to, through --max_grad_norm; derivation in docs/adaptive.md):
  the weighted loss is s times the unit-normalised one; s = c / max_k gbar_k, where gbar is the running mean of the
  gradient norm per unit scale and c = --max_grad_norm (1 without clipping): the largest s under which the smoothed
  gradient norm has never exceeded the clip threshold.
Sampling (unbiased for J):
  q_b = lambda_b sqrt(m2_b)   (RMS of the weighted loss: a per-sample gradient-norm proxy, Katharopoulos & Fleuret 2018)
  p_b = (1 - eps) q_b / sum q + eps / B;  t = stratified inverse-CDF draw over bins, uniform within the bin
  weight = lambda_b(t) / (B p_b(t)),  so that E_t~p[weight L_t] = J exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..errors import ConfigError
from ..fields import above, at_least, setting, within
from .base import TimestepSampler, bin_mean
from .registry import register

NORM_RATE = 0.1  # update rate of the running mean of the gradient norm per unit scale (~10-step memory)


def balance_weights(m1: torch.Tensor, beta: float, normalize: str = "unit", floor: float = 0.0) -> torch.Tensor:
    """lambda_b proportional to m1_b^-beta (EDM2's balance e^-u with e^u = E[L] when beta = 1), normalised so that
    'unit': the expected weighted loss (1/B) sum_b lambda_b m1_b is 1 at every step - a stationary gradient scale
    for Adam, whose second-moment estimate (beta2 = 0.999) otherwise lags a fast-falling loss - or 'mean': mean 1.
    floor > 0: lambda_b >= floor x the configured objective's weight under the same normalisation (beta = 0), so
    that the balance boosts the low-loss (high-noise) levels without starving the high-loss ones; then renormalised."""
    m1 = m1.clamp_min(1e-12)

    def normalised(lam):
        return lam / (lam * m1).mean() if normalize == "unit" else lam / lam.mean()

    lam = normalised(m1.pow(-beta))
    return normalised(torch.maximum(lam, floor * normalised(torch.ones_like(m1)))) if floor > 0 else lam


def proposal(lam: torch.Tensor, scale: torch.Tensor, uniform_mix: float) -> torch.Tensor:
    """p_b proportional to lambda_b * scale_b with a uniform floor: the variance-optimal proposal when a sample's
    gradient norm is proportional to scale_b (Katharopoulos & Fleuret 2018, eq. 8)."""
    q = lam * scale.clamp_min(0)
    q = torch.where(torch.isfinite(q), q, torch.zeros_like(q))
    total = q.sum()
    q = torch.where(total > 0, q / total.clamp_min(1e-30), torch.full_like(q, 1.0 / q.numel()))
    return (1 - uniform_mix) * q + uniform_mix / q.numel()


def clip_anchored_scale(unit_norm_peak: torch.Tensor, max_grad_norm: float) -> torch.Tensor:
    """Loss scale s = c / peak of the smoothed unit-scale gradient norm: the smoothed norm s*gbar never exceeds the clip
    threshold c (Adam is invariant to s; clipping then bounds single-step outliers only; docs/adaptive.md)."""
    return (max_grad_norm if max_grad_norm > 0 else 1.0) / unit_norm_peak.clamp_min(1e-12)


def stratified_bins(p: torch.Tensor, n: int, generator: torch.Generator) -> torch.Tensor:
    """n draws from p [B] by inverse CDF at stratified uniforms (i + U_i) / n, then randomly permuted."""
    dev = generator.device
    u = (torch.arange(n, device=dev) + torch.rand(n, generator=generator, device=dev)) / n
    cdf = torch.cumsum(p.to(dev).double(), 0)
    cdf = cdf / cdf[-1]
    b = torch.searchsorted(cdf, u.double(), right=True).clamp_max(p.numel() - 1)
    return b[torch.randperm(n, generator=generator, device=dev)]


def check_bins(bins: int, num_timesteps: int) -> None:
    """The timestep bins must split the T timesteps evenly."""
    if bins < 1 or num_timesteps % bins:
        raise ConfigError(f"--adaptive_bins {bins} must divide --ddpm_num_steps {num_timesteps}")


@dataclass(frozen=True)
class AdaptiveOptions:
    adaptive_balance: float = setting(0.0, "objective weight E[L_t]^-beta at the start (0 = configured, "
                                           "0.5 = gradient-balanced, 1 = loss-balanced)")
    adaptive_balance_final: Optional[float] = setting(0.0, "beta at the end of the anneal (linear in progress); "
                                                           "None = constant")
    adaptive_anneal_fraction: float = setting(1.0, "share of the run over which beta goes to its final value (then "
                                                   "stays)", check=within(0, 1, open_low=True))
    adaptive_weight_floor: float = setting(0.0, "lambda >= this x the configured objective's weight (0 = no floor)",
                                           check=at_least(0))
    adaptive_bins: int = setting(100, "timestep bins of the running loss statistics (must divide --ddpm_num_steps)")
    adaptive_uniform_mix: float = setting(0.1, "uniform floor of the proposal")
    adaptive_ema: float = setting(0.05, "statistics update rate per sample of a bin")
    adaptive_warmup_steps: int = setting(20, "uniform draws and configured objective for the first N steps",
                                         check=at_least(0))
    adaptive_stratified: bool = setting(True, "stratified (low-discrepancy) draws over the global batch")
    adaptive_normalize: str = setting("unit", "unit = expected weighted loss 1 (stationary gradient scale) | mean",
                                      choices=("unit", "mean"))
    adaptive_proposal: str = setting("loss", "p ~ lambda x loss RMS (loss) | x sqrt(mean loss) (grad) | uniform",
                                     choices=("loss", "grad", "uniform"))
    adaptive_proposal_power: float = setting(1.0, "exponent gamma on the proposal's per-bin statistic (p ~ lambda x "
                                                  "stat^gamma; 1 = as named, 0 = lambda alone)", check=within(0, 4))
    adaptive_loss_scale: Optional[float] = setting(None, "fixed loss scale s (ablations); None = the clip-anchored "
                                                         "rule s = max_grad_norm / peak smoothed gradient norm per "
                                                         "unit scale", check=above(0))


@register
class AdaptiveSampler(TimestepSampler):
    name = "adaptive"
    Options = AdaptiveOptions
    needs = frozenset({"fraction", "grad_norm"})  # the balance anneals over the run; the loss scale follows |g|

    def __init__(self, num_timesteps: int, device="cpu", tables=None, options: Optional[AdaptiveOptions] = None, *,
                 max_grad_norm: float):
        """`options`: the method's settings (their defaults and meaning: AdaptiveOptions); `max_grad_norm`: the run's
        clipping threshold, which anchors the loss scale."""
        super().__init__(num_timesteps, device, tables, options)
        o = self.options
        check_bins(o.adaptive_bins, num_timesteps)
        self.num_bins = o.adaptive_bins
        self.width = num_timesteps // o.adaptive_bins
        self.beta0 = float(o.adaptive_balance)
        self.beta1 = self.beta0 if o.adaptive_balance_final is None else float(o.adaptive_balance_final)
        self.anneal = float(o.adaptive_anneal_fraction)
        self.floor = float(o.adaptive_weight_floor)
        self.fraction = 0.0  # share of the run done, given with every draw
        self.uniform_mix = float(o.adaptive_uniform_mix)
        self.rate = float(o.adaptive_ema)
        self.warmup = int(o.adaptive_warmup_steps)
        self.stratified = bool(o.adaptive_stratified)
        self.normalize = o.adaptive_normalize
        self.proposal_kind = o.adaptive_proposal
        self.proposal_power = float(o.adaptive_proposal_power)
        # The loss scale s: Adam is invariant to it, gradient clipping is not. None = the clip-anchored rule (s from
        # the measured gradient norm, clip_anchored_scale); a number fixes s (the hand-set constant of earlier
        # versions).
        self.fixed_scale = None if o.adaptive_loss_scale is None else float(o.adaptive_loss_scale)
        self.max_grad_norm = float(max_grad_norm)
        self.scale = torch.ones((), device=self.device)  # s, set at the end of the warm-up (see observe)
        self.unit_norm = torch.zeros((), device=self.device)  # running mean of the gradient norm per unit scale
        self.unit_norm_peak = torch.zeros((), device=self.device)  # its maximum so far
        self.changes_objective = self.beta0 != 0 or self.beta1 != 0
        self.m1 = torch.zeros(self.num_bins, device=self.device)  # running mean of L per bin
        self.m2 = torch.zeros(self.num_bins, device=self.device)  # running mean of L^2 per bin
        self.hits = torch.zeros(self.num_bins, device=self.device)  # samples seen per bin
        self.updates = 0
        self._cache = None

    @classmethod
    def from_options(cls, options: AdaptiveOptions, cfg, device, tables):
        return cls(cfg.ddpm_num_steps, device, tables, options, max_grad_norm=cfg.max_grad_norm)

    @classmethod
    def check_options(cls, options: AdaptiveOptions, cfg) -> None:
        check_bins(options.adaptive_bins, cfg.ddpm_num_steps)

    @property
    def beta(self) -> float:
        """Balance exponent now: beta0 -> beta1 linearly over the first `anneal` share of the run, then beta1."""
        return self.beta0 + (self.beta1 - self.beta0) * min(1.0, max(0.0, self.fraction / self.anneal))

    def set_fraction(self, fraction: float) -> None:
        """The share of the run done (the balance anneals with it)."""
        if fraction != self.fraction and self.beta0 != self.beta1:
            self._cache = None
        self.fraction = fraction

    # -- the current proposal -------------------------------------------------------------------------------------
    def _tables(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(lambda [B], p [B]) - recomputed after each update, cached otherwise."""
        if self._cache is None:
            if self.updates < self.warmup:
                ones = torch.ones(self.num_bins, device=self.device)
                self._cache = (ones, ones / self.num_bins)
            else:
                lam = self.scale * balance_weights(self.m1, self.beta, self.normalize, self.floor)
                self._cache = (lam, proposal(lam, self.gradient_scale(), self.uniform_mix))
        return self._cache

    def gradient_scale(self) -> torch.Tensor:
        """Per-bin proxy of a sample's gradient norm: 'loss' sqrt(E[L^2]) (the loss RMS, iDDPM's statistic), 'grad'
        sqrt(E[L]) (the RMS of the output-space gradient 2 (pred - target) / D, since L is a mean squared error),
        'uniform' 1 (no importance sampling, the weights alone carry lambda); 'loss' and 'grad' raised to the
        proposal power gamma."""
        if self.proposal_kind == "uniform":
            return torch.ones_like(self.m1) / self.m1.clamp_min(1e-12).pow(-self.beta)  # cancels lambda: p uniform
        stat = (self.m2 if self.proposal_kind == "loss" else self.m1).clamp_min(0).sqrt()
        return stat if self.proposal_power == 1.0 else stat.pow(self.proposal_power)

    def probabilities(self):
        _, p = self._tables()
        return (p / self.width).repeat_interleave(self.width)

    def objective_weights(self) -> torch.Tensor:
        """[T]: the declared objective's weight relative to the configured one (lambda_b(t))."""
        lam, _ = self._tables()
        return lam.repeat_interleave(self.width)

    def weight_of(self, t):
        lam, p = self._tables()
        b = t // self.width
        return lam[b] / (self.num_bins * p[b])

    def draw(self, request):
        """Bins for the whole global batch (stratified, or i.i.d. from p), t uniform within its bin; this rank's
        rows."""
        self.set_fraction(request.fraction)
        _, p = self._tables()
        g, size = request.generator, request.global_batch
        if self.stratified:
            b = stratified_bins(p, size, g)
        else:
            b = torch.multinomial(p.to(g.device), size, replacement=True, generator=g)
        t = b * self.width + torch.randint(0, self.width, (size,), generator=g, device=g.device)
        return request.rows(t, self.weight_of(t.to(self.device)).to(g.device))

    # -- learning ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def observe(self, t, loss, grad_norm=None):
        t = t.to(self.device)
        loss = loss.detach().float().to(self.device)
        loss = torch.where(torch.isfinite(loss), loss, torch.zeros_like(loss)).clamp(max=1e6)
        b = t // self.width
        n = torch.zeros(self.num_bins, device=self.device).index_add_(0, b, torch.ones_like(loss))
        s1 = torch.zeros(self.num_bins, device=self.device).index_add_(0, b, loss)
        s2 = torch.zeros(self.num_bins, device=self.device).index_add_(0, b, loss.square())
        hit = n > 0
        # per-hit EMA: a bin seen k times this step moves by 1 - (1 - rate)^k towards this step's mean
        alpha = torch.where(self.hits > 0, 1 - (1 - self.rate) ** n, torch.ones_like(n))
        alpha = torch.where(hit, alpha, torch.zeros_like(alpha))
        mean1, mean2 = s1 / n.clamp_min(1), s2 / n.clamp_min(1)
        self.m1 += alpha * (mean1 - self.m1)
        self.m2 += alpha * (mean2 - self.m2)
        self.hits += n
        if self.updates >= self.warmup:  # this step was trained with the normalised weights, at scale s
            self._update_scale(grad_norm)
        if self.updates + 1 >= self.warmup:
            self._fill_unseen()
        if self.updates + 1 == self.warmup:  # the normalised weights start: s from the configured objective's loss
            self.scale = self._initial_scale()
        self.updates += 1
        self._cache = None

    def _initial_scale(self) -> torch.Tensor:
        """s for the first normalised step: the fixed value, or the configured objective's mean loss (the weighted
        loss continues where the warm-up's left off; the rule takes over from the next step)."""
        if self.fixed_scale is not None:
            return torch.full((), self.fixed_scale, device=self.device)
        return self.m1.mean().clamp_min(1e-12)

    def _update_scale(self, grad_norm) -> None:
        """The clip-anchored rule: gbar <- running mean of |g| / s, peak <- max(peak, gbar), s <- c / peak (on the
        device; a non-finite norm is skipped)."""
        if self.fixed_scale is not None or grad_norm is None:
            return
        g = torch.as_tensor(grad_norm, device=self.device).float() / self.scale
        ok = torch.isfinite(g)
        first = self.unit_norm_peak == 0
        mean = torch.where(first, g, self.unit_norm + NORM_RATE * (g - self.unit_norm))
        self.unit_norm = torch.where(ok, mean, self.unit_norm)
        self.unit_norm_peak = torch.where(ok, torch.maximum(self.unit_norm_peak, self.unit_norm), self.unit_norm_peak)
        self.scale = torch.where(self.unit_norm_peak > 0, clip_anchored_scale(self.unit_norm_peak, self.max_grad_norm),
                                 self.scale)

    def _fill_unseen(self) -> None:
        """Bins never hit take the nearest seen bin's statistics (only possible early or with tiny batches)."""
        seen = self.hits > 0
        idx = torch.arange(self.num_bins, device=self.device)
        seen_idx = torch.where(seen, idx, torch.full_like(idx, -10**6))
        left = torch.cummax(seen_idx, 0).values
        right_src = torch.where(seen, idx, torch.full_like(idx, 10**6)).flip(0)
        right = torch.cummin(right_src, 0).values.flip(0)
        nearest = torch.where((idx - left) <= (right - idx), left, right).clamp(0, self.num_bins - 1)
        self.m1 = torch.where(seen, self.m1, self.m1[nearest])
        self.m2 = torch.where(seen, self.m2, self.m2[nearest])

    # -- state and diagnostics -----------------------------------------------------------------------------------
    def state_dict(self):
        return {"m1": self.m1.clone(), "m2": self.m2.clone(), "hits": self.hits.clone(), "updates": self.updates,
                "scale": self.scale.clone(), "unit_norm": self.unit_norm.clone(),
                "unit_norm_peak": self.unit_norm_peak.clone()}

    def load_state_dict(self, state):
        self.m1 = state["m1"].to(self.device).clone()
        self.m2 = state["m2"].to(self.device).clone()
        self.hits = state["hits"].to(self.device).clone()
        self.updates = int(state["updates"])
        for k in ("scale", "unit_norm", "unit_norm_peak"):
            setattr(self, k, state[k].to(self.device).clone())
        self._cache = None

    def effective_weights(self):
        return super().effective_weights() * self.objective_weights()

    def diagnostics(self):
        d = super().diagnostics()
        d["loss_mean_by_t"] = bin_mean(self.m1.repeat_interleave(self.width))
        d["loss_scale"] = self.scale.clone()
        d["unit_grad_norm"] = self.unit_norm.clone()
        return d

    def describe(self):
        return {**super().describe(), "balance": self.beta0, "balance_final": self.beta1,
                "anneal_fraction": self.anneal, "weight_floor": self.floor, "bins": self.num_bins,
                "uniform_mix": self.uniform_mix, "ema": self.rate, "warmup_steps": self.warmup,
                "stratified": self.stratified, "normalize": self.normalize,
                "loss_scale": "clip-anchored rule" if self.fixed_scale is None else self.fixed_scale,
                "proposal": self.proposal_kind, "proposal_power": self.proposal_power,
                "objective": ("(1/T) sum_t lambda(t) w(t) E[MSE_t], lambda(t) = E[L_t]^-beta / mean, beta = "
                              f"{self.beta0:g} -> {self.beta1:g} over {self.anneal:g} of the run "
                              "(online, EDM2-style balance)") if self.changes_objective else
                "configured objective E_t~U[w(t) MSE_t], unbiased, rescaled by a global factor"}
