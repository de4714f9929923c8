"""Training configuration (a package face): `settings` (the frozen TrainConfig, its JSON round trip, `replace`,
reading a saved config), `presets` (named presets as plain dicts), `checks` (`validate`, the checks across fields)
and `cli` (the parser, --help, resolving defaults <- preset <- saved config <- flags, `--like_run`)."""

from ..errors import ConfigError
from .checks import validate
from .cli import (CHOICES, EXPLICIT_NONE, NOT_INHERITED, DefaultsHelpFormatter, OneLineParser, add_config_arguments,
                  fill_like_run, help_text, like_run_help, parse_train_args, precision_override, resolve_config)
from .presets import PRESETS
from .settings import MODEL_KEYS, TrainConfig, config_fields, current_keys, load_run_config, read_config, replace

__all__ = ["CHOICES", "EXPLICIT_NONE", "MODEL_KEYS", "NOT_INHERITED", "PRESETS", "ConfigError", "DefaultsHelpFormatter",
           "OneLineParser", "TrainConfig", "add_config_arguments", "config_fields", "current_keys", "fill_like_run",
           "help_text", "like_run_help", "load_run_config", "parse_train_args", "precision_override", "read_config",
           "replace", "resolve_config", "validate"]
