"""A progress line on standard error for the command line's long work (``dpaccount ledger
verify|show|list|export|report`` of a large ledger), drawn only when standard error is a
terminal: piped or redirected, or on a ``TERM=dumb`` terminal, nothing is written.

The library's long functions (`dpaccount.storage` stores' ``verify``,
`dpaccount.audit.verify_export`, `dpaccount.audit.write_export`,
`dpaccount.audit.spend_over_time`, `dpaccount.accounting.dpsgd.calibrate_dpsgd_noise`)
take a plain callback, ``progress(done, total)`` (``total`` None when it is not known in
advance, as in a search); they draw nothing themselves. `ProgressLine.stage` makes such a
callback for one step of a command.

It is a few lines of our own rather than tqdm or rich (see docs/architecture.md,
"Progress"): one line, rewritten in place with a carriage return and erased when the
work is done, is all the commands need, and neither library would then be worth a
dependency or an optional extra whose presence changes what a command prints.

Nothing the line shows comes from the data: it names the step (and the ledger, a name
the caller chose) and counts records.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["Progress", "ProgressLine", "is_terminal", "quiet", "stage", "with_progress"]

#: What the library's long functions call: ``progress(done, total)``.
Progress = Callable[[int, int | None], object]

#: Seconds between redraws (the first and the last state are always drawn).
REDRAW_SECONDS = 0.1
_BAR = 24


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is an interactive terminal that can take a rewritten line."""
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed or not a real file
        return False
    return bool(tty) and os.environ.get("TERM", "") != "dumb"


class ProgressLine:
    """One progress line on a terminal, rewritten in place.

    Args:
        stream: Where to draw (standard error by default).
        enabled: Draw or not; by default, only when ``stream`` is a terminal
            (`is_terminal`).

    Examples:
        >>> import io
        >>> line = ProgressLine(io.StringIO())   # not a terminal: quiet
        >>> line.stage("verifying")(5, 10)
        >>> line.enabled
        False
    """

    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None) -> None:
        self._stream = sys.stderr if stream is None else stream
        self.enabled = is_terminal(self._stream) if enabled is None else enabled
        self._drawn_at = -float("inf")
        self._shown = False

    def stage(self, what: str) -> Callable[[int, int | None], None]:
        """A ``progress(done, total)`` callback that draws ``what: done of total``."""

        def update(done: int, total: int | None) -> None:
            self.draw(what, done, total)

        return update

    def draw(self, what: str, done: int, total: int | None) -> None:
        """Draw the line now, unless it was drawn less than `REDRAW_SECONDS` ago (the
        first and the final state of a count are always drawn)."""
        if not self.enabled:
            return
        now = time.monotonic()
        final = total is not None and done >= total
        if self._shown and not final and now - self._drawn_at < REDRAW_SECONDS:
            return
        self._drawn_at = now
        if total:
            part = min(max(done / total, 0.0), 1.0)
            filled = int(part * _BAR)
            text = (f"{what}: [{'#' * filled}{'.' * (_BAR - filled)}] "
                    f"{done:,} of {total:,} ({part:.0%})")
        else:
            text = f"{what}: {done:,}" if done else f"{what} ..."
        width = max(shutil.get_terminal_size((80, 24)).columns - 1, 20)
        self._write("\r" + text[:width] + "\x1b[K")
        self._shown = True

    def close(self) -> None:
        """Erase the line (the command's own output then starts on a clean line)."""
        if self._shown:
            self._write("\r\x1b[K")
            self._shown = False

    def _write(self, text: str) -> None:
        try:
            self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is optional
            self.enabled = False

    def __enter__(self) -> ProgressLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- for the command line's handlers ---------------------------------------------------


def with_progress(command: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    """``command`` with a `ProgressLine` (``args.progress``) while it runs, erased before
    it returns or fails (so an error line starts on a clean line)."""

    def run(args: argparse.Namespace) -> int:
        with ProgressLine() as line:
            args.progress = line
            return command(args)

    return run


def stage(args: argparse.Namespace, what: str) -> Callable[[int, int | None], None] | None:
    """A ``progress(done, total)`` callback for one step of a command (None outside
    `with_progress`)."""
    line: Any = getattr(args, "progress", None)
    return None if line is None else line.stage(what)


def quiet(args: argparse.Namespace) -> None:
    """Erase the progress line before the command prints."""
    line: Any = getattr(args, "progress", None)
    if line is not None:
        line.close()
