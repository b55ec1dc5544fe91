"""A progress bar for trials: completed/total points, elapsed time and an ETA (stderr, when
it is a terminal)."""

from __future__ import annotations

from typing import Any

from rich.console import Console


class TrialProgress:
    def __init__(self, console: Console, total: int, enabled: bool, what: str = "points") -> None:
        self.console, self.total, self.enabled, self.what = console, total, enabled, what
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> TrialProgress:
        if self.enabled:
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
        return self

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
