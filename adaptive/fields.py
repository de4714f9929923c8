"""Settings as data: a dataclass field carries its default, its `--help` text, its section, its closed set of values
and its check (`setting`), for the training config (`config.TrainConfig`) and every timestep method's options
(`timesteps.registry`). Imports nothing of the project but its error type."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

from .errors import ConfigError

Check = Callable[[Any], Optional[str]]  # value -> what is wrong with it ("must be > 0"), or None


def setting(default: Any, help: str, *, section: Optional[str] = None, choices: Optional[tuple] = None,
            check: Optional[Check] = None, model_key: bool = False) -> Any:
    """A dataclass field with its help text; `section` starts a new `--help` section with this field; `model_key`:
    the field defines the model or the objective, so resuming a checkpoint that differs in it is refused."""
    meta = {"help": help, "section": section, "choices": choices, "check": check, "model_key": model_key}
    if isinstance(default, (list, dict, set)):
        raise TypeError("mutable default: use a tuple")
    return dataclasses.field(default=default, metadata={k: v for k, v in meta.items() if v})


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The options of a timestep method that has none."""


def help_of(f: dataclasses.Field) -> str:
    return f.metadata.get("help", "")


def sections(cls) -> dict[str, str]:
    """Field name -> its `--help` section: the last `section=` at or above it (the first field's names the first)."""
    out, current = {}, "settings"
    for f in dataclasses.fields(cls):
        current = f.metadata.get("section", current)
        out[f.name] = current
    return out


# -- checks ---------------------------------------------------------------------------------------------------------
def at_least(low: float) -> Check:
    return lambda v: None if v is None or v >= low else f"must be >= {low:g} (got {v})"


def above(low: float) -> Check:
    return lambda v: None if v is None or v > low else f"must be > {low:g} (got {v})"


def within(low: float, high: float, *, open_low: bool = False, open_high: bool = False) -> Check:
    """low <= v <= high, or strict at an open end; the message writes the interval as [low, high] or (low, high)."""
    def check(v):
        ok = v is None or ((v > low) if open_low else (v >= low)) and ((v < high) if open_high else (v <= high))
        return None if ok else (f"must be in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'} "
                                f"(got {v})")
    return check


def check_fields(obj) -> None:
    """ConfigError naming the first field of the dataclass `obj` (as its flag) whose value is not finite, not one of
    its choices or fails its check."""
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if any(isinstance(x, float) and not math.isfinite(x) for x in (v if isinstance(v, tuple) else (v,))):
            raise ConfigError(f"--{f.name} must be a finite number (got {v})")
        allowed = f.metadata.get("choices")
        if allowed and v is not None and v not in allowed:
            raise ConfigError(f"--{f.name} {v!r} is not one of {', '.join(map(str, allowed))}")
        problem = f.metadata.get("check", lambda _: None)(v)
        if problem:
            raise ConfigError(f"--{f.name} {problem}")
