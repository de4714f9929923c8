"""Exponential moving average of the weights, identical on every rank (updated from the synchronised weights)."""

from __future__ import annotations

import copy

import torch


def ema_decay(num_updates: int, max_decay: float, min_decay: float = 0.0, warmup: str = "power",
              inv_gamma: float = 1.0, power: float = 0.75) -> float:
    """Decay for the `num_updates`-th update, as Diffusers' EMAModel.get_decay.

    power: 1 - (1 + n / inv_gamma)^-power (Karras' warm-up as in Diffusers); ratio: (1 + n) / (10 + n)
    (Diffusers without warm-up, the benchmark protocol); none: max_decay. n = num_updates - 1; the first update copies.
    """
    n = num_updates - 1
    if n <= 0:
        return 0.0
    if warmup == "power":
        d = 1.0 - (1.0 + n / inv_gamma) ** -power
    elif warmup == "ratio":
        d = (1.0 + n) / (10.0 + n)
    else:
        d = max_decay
    return max(min(d, max_decay), min_decay)


class EMA:
    """An eval-mode copy of the model whose parameters track the training weights with `torch._foreach_lerp_`.

    Kept instead of diffusers' EMAModel(foreach=True) (same decay schedule): EMAModel's s - (s - p)(1 - d) differs from
    lerp by up to 1 ulp on most updates (docs/benchmarks/library/), so switching would change every trained EMA and
    recorded result; lerp is also exact at the first update (a copy). The eval copy doubles as the sampling model."""

    def __init__(self, model: torch.nn.Module, max_decay: float, min_decay: float = 0.0, warmup: str = "power",
                 inv_gamma: float = 1.0, power: float = 0.75):
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        self.max_decay, self.min_decay, self.warmup = max_decay, min_decay, warmup
        self.inv_gamma, self.power = inv_gamma, power
        self.num_updates = 0
        self._ema = [p for p in self.model.parameters()]

    def decay(self) -> float:
        return ema_decay(self.num_updates, self.max_decay, self.min_decay, self.warmup, self.inv_gamma, self.power)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """One EMA step towards `model`'s parameters (no host sync)."""
        self.num_updates += 1
        src = [p.detach() for p in model.parameters()]
        torch._foreach_lerp_(self._ema, src, 1.0 - self.decay())

    def state_dict(self) -> dict:
        return {"num_updates": self.num_updates, "weights": self.model.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.num_updates = int(state["num_updates"])
        self.model.load_state_dict(state["weights"])
