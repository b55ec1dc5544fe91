"""Progress of trials on stderr: completed/total points, elapsed time and an ETA; a bar on a
terminal, a line every :data:`~servesim.progress.LOG_EVERY_S` seconds otherwise (a long
sweep in CI is not silent)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.console import Console

from servesim.progress import LOG_EVERY_S, duration


class TrialProgress:
    """``enabled``: shown at all (not ``--quiet``); ``what``: the trials' name (points,
    trials); ``command``: the log lines' prefix."""

    def __init__(self, console: Console, total: int, enabled: bool, what: str = "points",
                 command: str = "sweep", clock: Callable[[], float] = time.monotonic) -> None:
        self.console, self.total, self.what, self.command = console, total, what, command
        self.enabled, self.clock = enabled, clock
        self.done = 0
        self._log = enabled and not console.is_terminal
        self._started = self._due = clock()
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> TrialProgress:
        if self.enabled and not self._log:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task(self.what, total=self.total)
        self._started = self._due = self.clock()
        self._due += LOG_EVERY_S
        return self

    def advance(self) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.advance(self._task)
        elif self._log and self.clock() >= self._due:
            self._due = self.clock() + LOG_EVERY_S
            self._write(self.line())

    def line(self) -> str:
        """``sweep: 3 of 12 points done (25%), 40 s elapsed, ETA 2 min 00 s``."""
        elapsed = self.clock() - self._started
        left = elapsed * (self.total - self.done) / self.done if self.done else None
        eta = f", ETA {duration(left)}" if left is not None else ""
        share = f" ({self.done / self.total:.0%})" if self.total else ""
        return (f"{self.command}: {self.done:,} of {self.total:,} {self.what} done{share}, "
                f"{duration(elapsed)} elapsed{eta}")

    def _write(self, line: str) -> None:
        self.console.file.write(line + "\n")
        self.console.file.flush()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
