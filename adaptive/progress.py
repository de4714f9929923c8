"""Progress on every long wait (data decoding, sampling, feature extraction, reference statistics): a tqdm bar on
whichever of stderr / stdout is a terminal, else plain lines on stdout - what a launcher's pipe or a log file shows
(`accelerate launch` hands its ranks no terminal, so a bar on stderr alone would stay invisible there).

    with progress(total=n, desc="evaluation: sampling", unit="img") as bar:
        bar.update(k)

Nothing is shown for work that ends within `delay` seconds; `enabled=False` (a rank other than the main one) shows
nothing at all.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO

PLAIN_EVERY_S = 10.0  # without a terminal: one line at most this often (and a last one at the end)
DELAY_S = 1.0  # work that ends sooner shows nothing


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or replaced streams
        return False


class PlainProgress:
    """Progress as lines, `desc: 250/1,000 img (25%), 12 s`: after `delay` seconds, then every `every` seconds, and
    a last line at the end unless the last one printed already said it (nothing at all for work shorter than
    `delay`)."""

    def __init__(self, total: int, desc: str, unit: str, delay: float, every: float, stream: TextIO):
        self.total, self.desc, self.unit, self.delay, self.every, self.stream = total, desc, unit, delay, every, stream
        self.n, self.start, self.last, self.printed_n = 0, time.monotonic(), None, None

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self.start >= self.delay and (self.last is None or now - self.last >= self.every):
            self._line(now)

    def _line(self, now: float) -> None:
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        print(f"{self.desc}: {self.n:,}/{self.total:,} {self.unit}{pct}, {now - self.start:.0f} s", file=self.stream,
              flush=True)
        self.last, self.printed_n = now, self.n

    def close(self) -> None:
        now = time.monotonic()
        if self.printed_n != self.n and (self.last is not None or now - self.start >= self.delay):
            self._line(now)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


def progress(total: int, desc: str, unit: str = "img", delay: Optional[float] = None, enabled: bool = True,
             streams: Optional[tuple[TextIO, TextIO]] = None, every: Optional[float] = None):
    """A progress reporter for `total` units of work (module docstring); `streams` = (stderr, stdout) (default the
    process's); `delay` / `every` default to DELAY_S / PLAIN_EVERY_S."""
    if not enabled:
        return NoProgress()
    delay = DELAY_S if delay is None else delay
    every = PLAIN_EVERY_S if every is None else every
    err, out = streams or (sys.stderr, sys.stdout)
    terminal = next((s for s in (err, out) if is_terminal(s)), None)
    if terminal is not None:
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, file=terminal, delay=delay, leave=False, dynamic_ncols=True,
                    smoothing=0.1)
    return PlainProgress(total, desc, unit, delay, every, out)
