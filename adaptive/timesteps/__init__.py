"""Timestep methods: every module of this package but base, registry and report declares and registers one
(`@register`), so a new method is one file here (docs/architecture.md). `build_sampler(cfg, device, tables)` is what
the training set-up calls; `registry.method(name)` resolves a `--timestep_sampler` value (a registered name or
`pkg.module:Class`). Importing the package imports no method file and no torch: a method's file is imported when the
method is built, and `METHODS` (every built-in method class) imports them all when first read.
"""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from .registry import load_all, method

if TYPE_CHECKING:
    import torch

    from ..config.settings import TrainConfig
    from ..losses import DiffusionTables
    from .base import TimestepSampler


def build_sampler(cfg: TrainConfig, device: torch.device | str, tables: DiffusionTables) -> TimestepSampler:
    """The configured method with its options (`cfg.timestep_options`); `tables` (DiffusionTables) gives it the
    schedule's SNR and objective weights."""
    cls = method(cfg.timestep_sampler)
    try:
        return cls.from_options(cfg.timestep_options, cfg, device, tables)
    except Exception as e:  # a user's method (pkg.module:Class) that fails to build: its class, the flag, the cause
        if isinstance(e, (ConfigError, MemoryError)) or ":" not in cfg.timestep_sampler:
            raise  # ours: already one line, or a bug of a built-in method (its traceback is the report)
        where = traceback.extract_tb(e.__traceback__)[-1]
        raise ConfigError(f"--timestep_sampler {cfg.timestep_sampler}: building {cls.__name__} failed: "
                          f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''} "
                          f"({Path(where.filename).name}:{where.lineno})") from None


def __getattr__(name: str):
    """`METHODS` (every built-in method, imported now), `TimestepSampler`, `UniformSampler`: on first use (torch)."""
    if name == "METHODS":
        return load_all()
    if name == "TimestepSampler":
        from .base import TimestepSampler  # imports torch: the package itself loads without it

        return TimestepSampler
    if name == "UniformSampler":
        from .uniform import UniformSampler  # imports torch: the package itself loads without it

        return UniformSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["METHODS", "TimestepSampler", "UniformSampler", "build_sampler", "method"]
