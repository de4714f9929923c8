"""Post-hoc EMA (Karras et al. 2024, "Analyzing and Improving the Training Dynamics of Diffusion Models", Sec. 3).

During training keep a few power-function EMAs (relative widths sigma_rel, e.g. 0.05 and 0.10) and save snapshots
of them every N steps. Afterwards any EMA length can be reconstructed as the least-squares combination of the
snapshots whose averaging profiles best match the wanted power-function profile (`reconstruct_ema.py`).
Progress is counted in optimizer steps; the profiles are scale-free, so this equals EDM2's counting in images.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

SNAPSHOT_RE = re.compile(r"^step-(\d+)-std-([0-9.]+)\.safetensors$")


def sigma_rel_to_gamma(sigma_rel: float) -> float:
    """Exponent gamma of the power-function profile with relative std sigma_rel (Karras et al. 2024, eq. 3):
    sigma_rel^2 = (gamma + 1) / ((gamma + 2)^2 (gamma + 3)), i.e. the largest real root of
    gamma^3 + 7 gamma^2 + (16 - 1/sigma^2) gamma + (12 - 1/sigma^2)."""
    k = 1.0 / sigma_rel**2
    roots = np.roots([1.0, 7.0, 16.0 - k, 12.0 - k])
    return float(roots.real[np.abs(roots.imag) < 1e-9].max())


def power_ema_beta(gamma: float, step: int) -> float:
    """Decay for the update at optimizer step `step` >= 1: (1 - 1/step)^(gamma + 1) (ibid., eq. 2); step 1 copies."""
    return (1.0 - 1.0 / step) ** (gamma + 1.0)


def profile_dot(t_a: np.ndarray, g_a: np.ndarray, t_b: np.ndarray, g_b: np.ndarray) -> np.ndarray:
    """Inner product of the averaging profiles f(tau) = (g+1) tau^g / t^(g+1) on [0, t] of two snapshots:
    (g_a+1)(g_b+1) min(t_a,t_b)^(g_a+g_b+1) / ((g_a+g_b+1) t_a^(g_a+1) t_b^(g_b+1)), computed in logs."""
    t_a, g_a, t_b, g_b = (np.asarray(x, np.float64) for x in (t_a, g_a, t_b, g_b))
    m = np.minimum(t_a, t_b)
    log = (np.log(g_a + 1) + np.log(g_b + 1) + (g_a + g_b + 1) * np.log(m) - np.log(g_a + g_b + 1)
           - (g_a + 1) * np.log(t_a) - (g_b + 1) * np.log(t_b))
    return np.exp(log)


def solve_coefficients(in_steps: Sequence[int], in_gammas: Sequence[float], out_step: int,
                       out_gamma: float) -> np.ndarray:
    """Weights c with sum_i c_i snapshot_i ~ the power EMA (out_step, out_gamma): least squares on the profiles."""
    t = np.asarray(in_steps, np.float64)
    g = np.asarray(in_gammas, np.float64)
    A = profile_dot(t[:, None], g[:, None], t[None, :], g[None, :])
    b = profile_dot(t, g, np.float64(out_step), np.float64(out_gamma))
    return np.linalg.lstsq(A, b, rcond=None)[0]


class PowerEMAs:
    """The power-function EMAs of the model for each sigma_rel; identical on every rank (updated from synced
    weights)."""

    def __init__(self, model: torch.nn.Module, sigma_rels: Sequence[float]):
        self.sigma_rels = [float(s) for s in sigma_rels]
        self.gammas = [sigma_rel_to_gamma(s) for s in self.sigma_rels]
        self.models = [copy.deepcopy(model).eval().requires_grad_(False) for _ in self.sigma_rels]
        self.step = 0

    def to(self, device):
        for m in self.models:
            m.to(device)
        return self

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.step += 1
        src = [p.detach() for p in model.parameters()]
        for ema, gamma in zip(self.models, self.gammas):
            torch._foreach_lerp_(list(ema.parameters()), src, 1.0 - power_ema_beta(gamma, self.step))

    def save_snapshots(self, folder: Path) -> list[Path]:
        """Write one safetensors file per profile, named step-<step>-std-<sigma_rel>.safetensors."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for m, s, g in zip(self.models, self.sigma_rels, self.gammas):
            path = folder / f"step-{self.step:09d}-std-{s:.4f}.safetensors"
            sd = {k: v.detach().contiguous().cpu() for k, v in m.state_dict().items()}
            save_file(sd, str(path), metadata={"step": str(self.step), "sigma_rel": str(s), "gamma": repr(g)})
            paths.append(path)
        return paths

    def state_dict(self) -> dict:
        return {"step": self.step, "sigma_rels": self.sigma_rels, "models": [m.state_dict() for m in self.models]}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])
        for m, sd in zip(self.models, state["models"]):
            m.load_state_dict(sd)


def list_snapshots(folder: Path) -> list[dict]:
    """[{path, step, sigma_rel, gamma}] of the snapshots in a folder, oldest first."""
    out = []
    for p in sorted(Path(folder).glob("step-*-std-*.safetensors")):
        m = SNAPSHOT_RE.match(p.name)
        if m:
            s = float(m.group(2))
            out.append({"path": p, "step": int(m.group(1)), "sigma_rel": s, "gamma": sigma_rel_to_gamma(s)})
    return sorted(out, key=lambda d: (d["step"], d["sigma_rel"]))


def reconstruct(snapshots: list[dict], sigma_rel: float, at_step: int | None = None,
                on_loaded: Callable[[], object] = lambda: None) -> tuple[dict, np.ndarray]:
    """State dict of the EMA with `sigma_rel` at `at_step` (default: the last snapshot), and the coefficients;
    `on_loaded` is called after each snapshot is added (a progress bar's update)."""
    from safetensors.torch import load_file

    if not snapshots:
        raise ValueError("no snapshots")
    at_step = at_step or max(s["step"] for s in snapshots)
    use = [s for s in snapshots if s["step"] <= at_step]
    coef = solve_coefficients([s["step"] for s in use], [s["gamma"] for s in use], at_step,
                              sigma_rel_to_gamma(sigma_rel))
    out: dict[str, torch.Tensor] = {}
    for c, s in zip(coef, use):
        sd = load_file(str(s["path"]))
        for k, v in sd.items():
            acc = out.get(k)
            out[k] = v.double() * float(c) if acc is None else acc + v.double() * float(c)
        on_loaded()
    return {k: v.float() for k, v in out.items()}, coef
