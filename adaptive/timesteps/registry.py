"""Timestep methods by name: each method file registers its class (`@register`), whose `name`, `Options` (a small
frozen dataclass of `fields.setting`s: default, help, check) and `from_options` constructor are all the rest of the
project needs - the `--timestep_sampler` choices, the method's flags in `--help` (its own section), validation, the
saved config and the golden runs come from here. A user's method plugs in as `--timestep_sampler pkg.module:Class`.

Option names are flag names (`adaptive_balance`, `speed_k`): unique across methods and the training config.
"""

from __future__ import annotations

import dataclasses
import importlib
import re

from ..errors import ConfigError
from ..fields import check_fields
from .base import TimestepSampler

METHODS: dict[str, type[TimestepSampler]] = {}  # the built-in methods, in registration order
EXTERNAL = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # pkg.module:Class


def register(cls: type[TimestepSampler]) -> type[TimestepSampler]:
    """Class decorator of a built-in method: makes `cls.name` a `--timestep_sampler` choice."""
    check_method(cls, cls.name)
    taken = {n: m for m in METHODS.values() if m is not cls for n in option_names(m)}
    clash = sorted(set(option_names(cls)) & set(taken))
    if cls.name in METHODS and METHODS[cls.name] is not cls or clash:
        raise ValueError(f"timestep method {cls.name!r}: name or options {clash} already registered")
    METHODS[cls.name] = cls
    return cls


def check_method(cls, spec: str) -> None:
    """ConfigError unless `cls` is a usable method class (the contract in base.py)."""
    if not (isinstance(cls, type) and issubclass(cls, TimestepSampler)):
        raise ConfigError(f"--timestep_sampler {spec}: not a TimestepSampler subclass (adaptive/timesteps/base.py)")
    opts = getattr(cls, "Options", None)
    if not (dataclasses.is_dataclass(opts) and opts.__dataclass_params__.frozen):
        raise ConfigError(f"--timestep_sampler {spec}: {cls.__name__}.Options must be a frozen dataclass")


def method(spec: str) -> type[TimestepSampler]:
    """The method class of a `--timestep_sampler` value: a registered name or `pkg.module:Class`."""
    if spec in METHODS:
        return METHODS[spec]
    if not EXTERNAL.match(spec):
        raise ConfigError(f"--timestep_sampler {spec!r} is not one of {', '.join(METHODS)} (or pkg.module:Class)")
    module, _, name = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as e:  # not found, or the user's module failed while importing (any error of its code)
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise ConfigError(f"--timestep_sampler {spec}: cannot import it ({type(e).__name__}: {first})") from None
    check_method(cls, spec)
    return cls


def option_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls.Options))


def options_from(cls, values: dict):
    """`cls.Options` from a dict of (some of) its fields (lists become tuples); ConfigError on a bad value."""
    known = set(option_names(cls))
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in known}
    opts = cls.Options(**kwargs)
    check_fields(opts)
    return opts


def owner_of(option: str):
    """The registered method whose option this is, or None."""
    return next((m for m in METHODS.values() if option in option_names(m)), None)
