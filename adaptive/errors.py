"""Error types every module may raise and every CLI turns into one line (`faults.run_cli`); imports nothing of the
project, so that anything can import it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A user-facing problem (bad input, or a fault of the run in adaptive/faults.py): one line on stderr and
    `exit_code`, never a traceback."""

    exit_code = 2
