"""The timestep-sampler contract: everything the training loop knows about how t is chosen and how much it counts.

Per optimizer step the loop makes at most three calls, in this order, on every rank:
  draw(request) -> Draw(t [A*B], m [A*B], context)   this rank's timesteps and loss multipliers for its A micro-batches
                                                      (micro-batch i = rows i*B:(i+1)*B); by default its rows
                                                      (`request.rows`) of one draw from `probabilities()` for the
                                                      whole global batch from the step generator (identical on
                                                      every rank)
  ... the model minimises mean(m * L), L = w(t) MSE_t the configured objective's per-sample loss ...
  with around_update(model, accelerator, draw):       the optimizer update runs inside (methods that measure the model
                                                      before and after it, kim2025); every rank enters it
  observe(t [G], L [G], **asked)                      the global batch's t and objective losses (gathered from all
                                                      ranks in draw order); `grad_norm` (pre-clip) if asked for
and once per log step `diagnostics()` (tensors, no host sync). What a method needs beyond that it names in `needs`
(a subset of NEEDS); the loop passes only those. State lives in tensors on the device, is identical on every rank (it
is only updated from gathered data) and round-trips through `state_dict`/`load_state_dict`.

m is the whole per-sample loss multiplier. The configured objective is E_{t ~ U}[w(t) MSE_t]; an unbiased method
draws t ~ p and returns m = lambda(t) / (T p_t), which leaves the objective lambda(t) w(t) MSE_t (lambda = 1: the
configured one) unchanged in expectation; a method with `changes_objective = True` optimises something else on
purpose and says what in `describe()`. A method's settings are its `Options` (a frozen dataclass of
`fields.setting`s, registered with the method: registry.py); it is built by `from_options(options, cfg, device,
tables)`, where `cfg` gives the run's settings (steps, resolution, seed, clipping) and `options` its own.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import torch

from ..fields import NoOptions

if TYPE_CHECKING:
    from ..config.settings import TrainConfig
    from ..losses import DiffusionTables

DIAGNOSTIC_BINS = 10  # timestep bins for logged per-t statistics
NEEDS = ("step", "fraction", "grad_norm", "batch")  # what a method may ask the loop for (TimestepSampler.needs)


@dataclass(frozen=True)
class DrawRequest:
    """What the loop offers a draw. `step`, `fraction` and `batch` are None unless the method asked for them
    (`needs`)."""

    global_batch: int  # G = per-device batch x ranks x accumulation steps
    slices: tuple[slice, ...]  # this rank's micro-batches' rows of the global draw, in micro-step order
    generator: torch.Generator  # seeded from (seed, step): identical on every rank
    # micro-step -> its own (seed, step, micro, rank)
    micro_generator: Optional[Callable[[int], torch.Generator]] = None
    step: Optional[int] = None  # optimizer step
    fraction: Optional[float] = None  # share of the run done (steps, or the spent wall-clock budget)
    batch: Optional[Sequence[torch.Tensor]] = None  # this rank's micro-batches x0 [B, 3, S, S] in [-1, 1]

    def rows(self, t: torch.Tensor, m: torch.Tensor, context: Any = None) -> Draw:
        """This rank's Draw from a draw for the whole global batch (t, m [G]): its micro-batches' rows."""
        return Draw(torch.cat([t[sl] for sl in self.slices]), torch.cat([m[sl] for sl in self.slices]), context)


@dataclass(frozen=True)
class Draw:
    """One step's draw for this rank: t long [A*B], m float [A*B] (micro-batch i = rows i*B:(i+1)*B), and whatever
    the method keeps for its `around_update` hook (`context`)."""

    t: torch.Tensor
    m: torch.Tensor
    context: Any = None

    def micro(self, i: int, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(t [B], m [B]) of micro-batch i."""
        rows = slice(i * batch_size, (i + 1) * batch_size)
        return self.t[rows], self.m[rows]


def asked(needs, **offered) -> dict:
    """The offered values a method asked for."""
    return {k: v for k, v in offered.items() if k in needs}


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
    """Base class: draws t from `probabilities()` with multipliers 1/(T p_t), which keep E[m L] unbiased.

    Drawing has one override point, `draw`: a method that only changes p(t) overrides `probabilities` (and
    `weight_of`, if its multiplier is not 1/(T p_t)); a method that draws differently overrides `draw`.
    `probabilities` and `weight_of` also describe the method to its diagnostics and tests."""

    name = "base"
    changes_objective = False  # True for methods that deliberately optimise another objective than the configured one
    needs: frozenset[str] = frozenset()  # what the loop must pass beyond the defaults (a subset of NEEDS)
    tracks_by_default = True  # its per-bin diagnostics go to the trackers without --log_timestep_bins
    update_period = 1  # optimizer steps between its occasional extra work (a cost measurement spans whole periods)
    Options: type = NoOptions  # its settings: a frozen dataclass of fields.setting(...), flags of the same names

    def __init__(self, num_timesteps: int, device: torch.device | str = "cpu",
                 tables: Optional[DiffusionTables] = None, options: Any = None):
        self.num_timesteps = num_timesteps
        self.device = torch.device(device)
        self.tables = tables  # DiffusionTables (snr, objective weight per t) or None
        self.options = self.Options() if options is None else options  # its settings; defaults only in Options

    @classmethod
    def from_options(cls, options, cfg: TrainConfig, device: torch.device | str,
                     tables: DiffusionTables) -> TimestepSampler:
        """The method with its options (`cls.Options`) and the run's settings (`cfg`); a method that needs some of
        the run's settings (steps, resolution, clipping) overrides this and passes them to its `__init__`."""
        return cls(cfg.ddpm_num_steps, device, tables, options)

    @classmethod
    def check_options(cls, options, cfg: TrainConfig) -> None:
        """ConfigError if the options do not fit the run (each option's own range is checked by its field)."""

    # -- drawing -------------------------------------------------------------------------------------------------
    def probabilities(self) -> torch.Tensor:
        """Current proposal p(t), float32 [T] on the device, sums to 1."""
        return torch.full((self.num_timesteps,), 1.0 / self.num_timesteps, device=self.device)

    def objective_weights(self) -> torch.Tensor:
        """[T]: weight of each t in the declared objective relative to the configured one (1 = unchanged)."""
        return torch.ones(self.num_timesteps, device=self.device)

    def weight_of(self, t: torch.Tensor) -> torch.Tensor:
        """The loss multiplier m that a draw returns with timestep t: 1 / (T p_t) for unbiased samplers."""
        return importance_weights(self.probabilities(), t)

    def draw(self, request: DrawRequest) -> Draw:
        """This rank's t and m (the one override point for drawing). Default: one i.i.d. draw t ~ p for the whole
        global batch from the step generator (identical on every rank), m = weight_of(t); this rank's rows."""
        g = request.generator
        t = torch.multinomial(self.probabilities().to(g.device), request.global_batch, replacement=True, generator=g)
        return request.rows(t, self.weight_of(t.to(self.device)).to(g.device))

    # -- learning ------------------------------------------------------------------------------------------------
    def observe(self, t: torch.Tensor, loss: torch.Tensor, grad_norm: Optional[torch.Tensor] = None) -> None:
        """Learn from the global batch's timesteps [G] and per-sample objective losses [G] (the same on every rank);
        `grad_norm`, the step's pre-clip gradient norm, only for methods that ask for it."""

    @contextlib.contextmanager
    def around_update(self, model: torch.nn.Module, accelerator, draw: Draw) -> Iterator[None]:
        """The optimizer update runs inside (every rank): for methods that measure the model before and after it."""
        yield

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
