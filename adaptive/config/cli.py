"""The command line of the training configuration: the one-line-error parser (no abbreviations, did-you-mean),
--help by section with each field's default and presets, a flag per field and per method option, resolving
defaults <- preset <- saved config <- flags, and `--like_run` for the scoring scripts."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import typing
from dataclasses import fields

from ..errors import ConfigError
from ..fields import help_of, sections
from ..secrets import SECRET_FIELDS, scrub_text
from .checks import validate
from .presets import PRESETS
from .settings import TrainConfig, _methods, config_fields, current_keys

# Closed sets of values, checked by the parser (one-line error on anything else); each field's `choices`.
CHOICES: dict[str, tuple] = {"preset": tuple(PRESETS),
                             **{f.name: f.metadata["choices"] for f in fields(TrainConfig) if "choices" in f.metadata}}



class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad flag as one line on stderr and exits with status 2. Flags must be spelled out:
    no abbreviations (`--hub_t` is not `--hub_token`), so a flag is always recognisable by its name."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)  # what error() scrubs secrets from
        return super().parse_known_args(args, namespace)

    def error(self, message):  # noqa: D401
        self.exit(2, f"{self.prog}: error: {scrub_text(message, getattr(self, '_argv', []))}"
                     f"{self.did_you_mean(message)}\n")

    def did_you_mean(self, message: str) -> str:
        """'; did you mean --learning_rate?' for each unrecognised flag with a near namesake ('' when none)."""
        if not message.startswith("unrecognized arguments:"):
            return ""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for token in message.split(":", 1)[1].split():
            if token.startswith("--"):
                near = difflib.get_close_matches(token.split("=", 1)[0], known, n=1, cutoff=0.75)
                hints += [(near[0], token.split("=", 1)[0])] if near else []
        if len(hints) == 1:
            return f"; did you mean {hints[0][0]}?"
        return f"; did you mean {', '.join(f'{n} (for {t})' for n, t in hints)}?" if hints else ""


def _base_type(tp):
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union:
        return _base_type([a for a in args if a is not type(None)][0])[0], True
    return tp, False


class _ExplicitNone:
    """Marks a flag given as 'none' (distinct from a flag not given, which the preset fills)."""

    def __repr__(self):
        return "None"


EXPLICIT_NONE = _ExplicitNone()


def _optional(conv):
    def parse(s: str):
        return EXPLICIT_NONE if s.lower() in ("none", "null") else conv(s)

    parse.__name__ = getattr(conv, "__name__", "value")
    return parse


def _fmt_default(v) -> str:
    return ",".join(map(str, v)) if isinstance(v, (tuple, list)) else str(v)


def help_text(f: dataclasses.Field, presets: bool = True) -> str:
    """The field's help, its default (none shown for an empty list) and the presets that set it otherwise."""
    default = f.default
    by_preset = {p: v[f.name] for p, v in PRESETS.items() if f.name in v and v[f.name] != default} if presets else {}
    shown = ([] if default == () else [f"default {_fmt_default(default)}"])
    shown += [f"{p}: {_fmt_default(v)}" for p, v in by_preset.items()]
    return (f"{help_of(f)} [{'; '.join(shown)}]" if shown else help_of(f)).replace("%", "%%")


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """--help shows each flag's default as `[default X]`, unless its help says it already or there is none to show
    (None, False, an empty list)."""

    def _get_help_string(self, action):
        text, default = action.help or "", action.default
        if ("[default" in text or not action.option_strings or default is None or default is False
                or default is argparse.SUPPRESS or (isinstance(default, (list, tuple)) and not default)):
            return text
        return f"{text} [default {_fmt_default(default).replace('%', '%%')}]"


def parse_train_args(argv=None, prog: str = "train_accelerate.py", description: typing.Optional[str] = None):
    """train_accelerate.py's command line: every TrainConfig field as a flag, plus --config FILE and
    --print_config (what the training script and the benchmarks' cost measurement parse)."""
    parser = OneLineParser(prog=prog, description=description)
    parser.add_argument("--config", default=None, help="start from a saved config (a run's config.json); flags given "
                                                       "override it")
    parser.add_argument("--print_config", action="store_true", help="print the resolved config (JSON) and exit")
    add_config_arguments(parser, sys.argv[1:] if argv is None else list(argv))
    return parser.parse_args(argv)


def add_config_arguments(parser: argparse.ArgumentParser, argv: typing.Optional[list[str]] = None) -> None:
    """One flag per config field, grouped by section, default None so that presets can fill the gaps; then one
    section per timestep method with its options (the built-in ones, and a `pkg.module:Class` named in `argv`)."""
    hints = typing.get_type_hints(TrainConfig)
    groups: dict[str, argparse._ArgumentGroup] = {}
    for f in config_fields().values():
        section = sections(TrainConfig)[f.name]
        group = groups.setdefault(section, parser.add_argument_group(section))
        metavar = "{" + ",".join(_methods().declared()) + "}|pkg.module:Class" if f.name == "timestep_sampler" else None
        _add_flag(group, f, hints[f.name], help_text(f), CHOICES.get(f.name), metavar)
    for decl in methods_named(argv):
        group = parser.add_argument_group(f"timestep method {decl.name} (--timestep_sampler {decl.spec})",
                                          decl.doc or None)
        hints = typing.get_type_hints(decl.Options)
        for f in fields(decl.Options):
            _add_flag(group, f, hints[f.name], help_text(f, presets=False), f.metadata.get("choices"))


def methods_named(argv: typing.Optional[list[str]]) -> list:
    """The built-in methods' declarations and the `pkg.module:Class` given as --timestep_sampler in `argv` (if
    any)."""
    found = list(_methods().declared().values())
    for i, arg in enumerate(argv or []):
        value = argv[i + 1] if arg == "--timestep_sampler" and i + 1 < len(argv) else (
            arg.split("=", 1)[1] if arg.startswith("--timestep_sampler=") else None)
        if value and value not in _methods().declared() and _methods().EXTERNAL.match(value):
            decl = _methods().declaration(value)
            if decl.spec not in {d.spec for d in found}:
                found.append(decl)
    return found


def _add_flag(group, f: dataclasses.Field, hint, help: str, choices: typing.Optional[tuple],
              metavar: typing.Optional[str] = None) -> None:
    tp, optional = _base_type(hint)
    kw: dict = dict(default=None, help=help, **({"metavar": metavar} if metavar else {}))
    if tp is bool:
        kw["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        kw["type"] = lambda s, elem=elem: [elem(x) for x in s.split(",") if x]
        kw["nargs"] = "+"
        kw["metavar"] = elem.__name__.upper()
    else:
        kw["type"] = _optional(tp) if optional else tp
        if choices:
            kw["choices"] = list(choices) + ([EXPLICIT_NONE] if optional else [])
            kw["metavar"] = "{" + ",".join(choices) + "}"
    group.add_argument(f"--{f.name}", **kw)


# Keys of a saved config that are never taken over: they say what this invocation should do to the folder.
NOT_INHERITED = ("overwrite_output_dir", "resume_from_checkpoint")


def resolve_config(args: argparse.Namespace, saved: typing.Optional[dict] = None) -> TrainConfig:
    """Dataclass defaults <- preset <- a saved config (a run's config.json or --config file) <- flags that were given;
    the method's options likewise (a flag of another method than the chosen one is an error)."""
    saved = {k: v for k, v in (saved or {}).items() if k not in NOT_INHERITED and k not in SECRET_FIELDS}
    preset_name = getattr(args, "preset", None) or saved.get("preset") or TrainConfig.preset
    if preset_name not in PRESETS:
        raise ConfigError(f"unknown preset {preset_name!r} (choose from {', '.join(PRESETS)})")
    chosen = getattr(args, "timestep_sampler", None) or saved.get("timestep_sampler") or PRESETS[preset_name].get(
        "timestep_sampler", TrainConfig.timestep_sampler)
    method = _methods().declaration(chosen)
    saved = current_keys({**saved, "timestep_sampler": chosen})
    options = _methods().option_names(method)
    unknown = sorted(set(saved) - set(config_fields()) - set(options))
    if unknown:
        raise ConfigError(f"the saved config has unknown keys: {', '.join(unknown)}")
    values = {**PRESETS[preset_name], **{k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()},
              "preset": preset_name}
    hints = {**typing.get_type_hints(TrainConfig), **typing.get_type_hints(method.Options)}
    for name, v in vars(args).items():
        if v is None or (name not in config_fields() and name not in options):
            if v is not None and (owner := _methods().owner_of(name)) is not None:
                raise ConfigError(f"--{name} is an option of --timestep_sampler {owner.name}, not of {chosen}")
            continue
        if v is EXPLICIT_NONE:
            v = None
        elif typing.get_origin(_base_type(hints[name])[0]) is tuple:
            v = tuple(x for part in v for x in (part if isinstance(part, list) else [part]))
        values[name] = v
    cfg = TrainConfig(**{k: v for k, v in values.items() if k in config_fields()},
                      timestep_options={k: v for k, v in values.items() if k in options})
    validate(cfg)
    return cfg


# Re-scoring a run as it was scored (`sample.py` / `evaluate_fid.py --like_run RUN`): a CLI's table maps its flags to
# (default, the run config's field); a flag not given takes the run's value, else its default.


def like_run_help(text: str, flag: str, table: dict) -> str:
    """`text [default X; --like_run: the run's FIELD]` for a flag of `table`."""
    default, field = table[flag]
    return f"{text} [default {_fmt_default(default)}; --like_run: the run's {field}]".replace("%", "%%")


def fill_like_run(args: argparse.Namespace, table: dict, run: typing.Optional[TrainConfig]) -> argparse.Namespace:
    """`args` with every flag of `table` that was not given (None) set to the run's field, or without a run to its
    default."""
    values = {flag: getattr(run, field) if run is not None else default for flag, (default, field) in table.items()
              if getattr(args, flag) is None}
    return argparse.Namespace(**{**vars(args), **values})


def precision_override(cfg: TrainConfig, given: typing.Optional[str], saved: dict,
                       launcher: typing.Optional[str]) -> typing.Optional[str]:
    """The start-up line when the config's mixed_precision - from the preset or the resumed run, not a flag (`given`) -
    overrides the accelerate config's (`launcher`: $ACCELERATE_MIXED_PRECISION, which accelerate launch sets); None
    when it does not."""
    if given is not None or cfg.mixed_precision is None or launcher in (None, cfg.mixed_precision):
        return None
    source = "the run's saved config" if saved.get("mixed_precision") is not None else f"preset {cfg.preset}"
    return (f"mixed_precision {cfg.mixed_precision} (from {source}) overrides the accelerate config's {launcher}; "
            f"pass --mixed_precision {launcher} to use that")
