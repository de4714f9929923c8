"""Timestep methods: every module of this package but base, registry and report registers one (`@register`), so a
new method is one file here (docs/architecture.md). `build_sampler(cfg, device, tables)` is what the training set-up
calls; `registry.method(name)` resolves a `--timestep_sampler` value (a registered name or `pkg.module:Class`).
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import ConfigError
from . import uniform  # noqa: F401  (the default method registers first: the first choice in --help)
from .base import TimestepSampler
from .registry import METHODS, method
from .uniform import UniformSampler

if TYPE_CHECKING:
    from ..config.settings import TrainConfig
    from ..losses import DiffusionTables

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "registry", "report"):
        importlib.import_module(f"{__name__}.{_module.name}")  # each registers its method


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


__all__ = ["METHODS", "TimestepSampler", "UniformSampler", "build_sampler", "method"]
