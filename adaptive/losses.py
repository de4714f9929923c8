"""Pure diffusion math: forward process, targets, per-sample losses and objective weightings (tensor in, tensor out).

Weightings are defined on the epsilon-MSE and converted to the model's parameterisation with
||d eps||^2 = SNR ||d x0||^2 = SNR / (SNR + 1) ||d v||^2 (Hang et al. 2023, Sec. 3.4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def snr(alphas_cumprod: torch.Tensor) -> torch.Tensor:
    """Signal-to-noise ratio abar / (1 - abar) (Kingma et al. 2021, eq. 3)."""
    return alphas_cumprod / (1.0 - alphas_cumprod)


def q_sample(x0: torch.Tensor, noise: torch.Tensor, sqrt_abar: torch.Tensor,
             sqrt_one_minus_abar: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) eps (Ho et al. 2020, eq. 4); coefficients are [B].

    Kept instead of DDPMScheduler.add_noise: the coefficients come from float64-built tables (add_noise takes float32
    square roots: up to 4.8e-7 apart) and the call is faster (docs/benchmarks/library/)."""
    return sqrt_abar[:, None, None, None] * x0 + sqrt_one_minus_abar[:, None, None, None] * noise


def training_target(prediction_type: str, x0: torch.Tensor, noise: torch.Tensor, sqrt_abar: torch.Tensor,
                    sqrt_one_minus_abar: torch.Tensor) -> torch.Tensor:
    """Regression target: eps (Ho et al. 2020), x0, or v = sqrt(abar) eps - sqrt(1-abar) x0 (Salimans & Ho 2022,
    eq. 19)."""
    if prediction_type == "epsilon":
        return noise
    if prediction_type == "sample":
        return x0
    if prediction_type == "v_prediction":
        return sqrt_abar[:, None, None, None] * noise - sqrt_one_minus_abar[:, None, None, None] * x0
    raise ValueError(f"unknown prediction_type {prediction_type!r}")


def per_sample_mse(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error per sample, [B, ...] -> [B], computed in float32."""
    return (pred.float() - target.float()).square().flatten(1).mean(1)


def min_snr_eps_weight(snr_t: torch.Tensor, gamma: float) -> torch.Tensor:
    """Min-SNR-gamma on the epsilon-MSE: min(SNR, gamma) / SNR (Hang et al. 2023, eq. 9); finite at SNR = 0."""
    return (gamma / snr_t).clamp(max=1.0)


def p2_eps_weight(snr_t: torch.Tensor, gamma: float, k: float) -> torch.Tensor:
    """P2 weighting on the epsilon-MSE: 1 / (k + SNR)^gamma (Choi et al. 2022, eq. 8)."""
    return (k + snr_t).pow(-gamma)


def eps_to_prediction_factor(snr_t: torch.Tensor, prediction_type: str) -> torch.Tensor:
    """Factor turning an epsilon-MSE weight into the weight of the model's own MSE (1, SNR, SNR/(SNR+1))."""
    if prediction_type == "epsilon":
        return torch.ones_like(snr_t)
    if prediction_type == "sample":
        return snr_t
    if prediction_type == "v_prediction":
        return snr_t / (snr_t + 1.0)
    raise ValueError(f"unknown prediction_type {prediction_type!r}")


def objective_weights(snr_t: torch.Tensor, loss_weighting: str, prediction_type: str, snr_gamma: float = 5.0,
                      p2_gamma: float = 1.0, p2_k: float = 1.0) -> torch.Tensor:
    """w(t) for every timestep: the objective is E_t,x0,eps[w(t) * MSE_t] with t uniform."""
    if loss_weighting == "none":
        return torch.ones_like(snr_t)
    if loss_weighting == "min_snr":
        eps_w = min_snr_eps_weight(snr_t, snr_gamma)
    elif loss_weighting == "p2":
        eps_w = p2_eps_weight(snr_t, p2_gamma, p2_k)
    else:
        raise ValueError(f"unknown loss_weighting {loss_weighting!r}")
    return eps_w * eps_to_prediction_factor(snr_t, prediction_type)


@dataclass
class DiffusionTables:
    """Per-timestep constants on the training device, float32 [T] (computed in float64)."""

    sqrt_abar: torch.Tensor
    sqrt_one_minus_abar: torch.Tensor
    snr: torch.Tensor
    weight: torch.Tensor  # objective weight w(t)
    alphas_cumprod: torch.Tensor  # float64 [T] on the CPU (exact schedule, for methods that derive constants)

    @classmethod
    def build(cls, alphas_cumprod: torch.Tensor, cfg, device) -> "DiffusionTables":
        abar = alphas_cumprod.double()
        s = snr(abar)
        w = objective_weights(s, cfg.loss_weighting, cfg.prediction_type, cfg.snr_gamma, cfg.p2_gamma, cfg.p2_k)
        f = lambda x: x.float().to(device)  # noqa: E731
        return cls(f(abar.sqrt()), f((1 - abar).sqrt()), f(s), f(w), abar.cpu())
