"""How far a running replay got, and how long it has left.

:class:`ReplayProgress` is fed by the engine's ``progress`` callback (the virtual time
reached) and by each request's record as the request ends (the sink's, so an engine that
never calls ``progress`` still shows the requests done); :func:`replay_size` is what it
measures against. :func:`shown` shows it while a replay runs: a bar on a terminal, a plain
line every :data:`LOG_EVERY_S` seconds otherwise (a long replay in CI is not silent),
nothing with ``--quiet``.

The fraction done is the requests ended over the requests the workload will send, where
that number is known before the replay (a trace's rows, ``stop.requests``, ``stop.sessions``
times a synthetic session's turns); with a virtual-time stop, also the virtual time over
that stop, the nearer of the two (a replay ends at its first stop). Requests, not virtual
time, because the requests are known for every kind of traffic (the last arrival of a
closed loop or of sessions depends on the replay itself), and because they count the work
left: a trace's last arrival is reached while an overloaded deployment still drains its
queues.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from servesim.errors import WorkloadError
from servesim.workloads.spec import (
    TRACE_FORMATS,
    SessionSource,
    SyntheticSource,
    WorkloadSpec,
    load_workload,
)

if TYPE_CHECKING:
    from rich.console import Console

    from servesim.engines.kernel.requests import RequestRecord
    from servesim.payload import Payload

LOG_EVERY_S = 5.0  # a log line this often, when stderr is no terminal
BAR_EVERY_S = 0.2  # the bar's figures this often
RECORDS_EVERY = 64  # the clock is read every this many ended requests


def replay_size(payload: Payload, formats: tuple[str, ...], base_dir: Path | None = None
                ) -> tuple[int | None, float | None]:
    """The requests a replay of ``payload`` will send and its virtual-time stop (ms), each
    None where unknown (both for a workload the replay will refuse)."""
    try:
        spec = load_workload(payload.workload, formats=formats)
    except WorkloadError:
        return None, None
    return expected_requests(spec, base_dir), spec.stop.max_time_ms


def expected_requests(spec: WorkloadSpec, base_dir: Path | None = None) -> int | None:
    """The requests a replay of ``spec`` will send, where known beforehand (None: it
    depends on the replay, or on a trace in a plugin's format)."""
    from servesim.workloads import resolve_trace_path

    source, stop = spec.source, spec.stop
    bounds = [stop.requests]
    if isinstance(source, SyntheticSource):
        bounds.append(stop.sessions)  # a synthetic session is one request
    elif isinstance(source, SessionSource):
        bounds.append(None if stop.sessions is None else stop.sessions * source.turns)
    elif stop.sessions is None and source.format in TRACE_FORMATS:
        bounds.append(_rows(resolve_trace_path(source.path, base_dir)))
    known = [b for b in bounds if b is not None]
    return min(known) if known else None


def _rows(path: Path) -> int | None:
    """The rows of a JSON-lines trace (lines not blank); None if it cannot be read (the
    replay says why)."""
    try:
        with open(path, "rb") as f:
            return sum(1 for line in f if not line.isspace())
    except OSError:
        return None


class ReplayProgress:
    """Virtual time reached and requests ended, out of ``requests`` and ``time_limit_ms``
    (None: unknown); wall time from ``clock``, from when it is made."""

    def __init__(self, requests: int | None, time_limit_ms: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.requests, self.time_limit_ms, self.clock = requests, time_limit_ms, clock
        self.virtual_ms = 0.0
        self.done = 0
        self.started = clock()
        self.show: Callable[[ReplayProgress], None] | None = None
        self.every_s = 0.0
        self._due = self.started

    def attach(self, show: Callable[[ReplayProgress], None], every_s: float) -> None:
        """From now on, ``show`` gets this object at most every ``every_s`` seconds."""
        self.show, self.every_s = show, every_s
        self._due = self.clock() + every_s

    def virtual_time(self, now_ms: float) -> None:
        """The engine's ``progress`` callback."""
        self.virtual_ms = now_ms
        self._tick()

    def request_ended(self, record: RequestRecord) -> None:
        """Called with each request's record as the request ends."""
        self.done += 1
        if self.done % RECORDS_EVERY == 0:
            self._tick()

    def _tick(self) -> None:
        if self.show is None:
            return
        now = self.clock()
        if now >= self._due:
            self._due = now + self.every_s
            self.show(self)

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    @property
    def fraction(self) -> float | None:
        """How much of the replay is done (None: unknown)."""
        parts = []
        if self.requests:
            parts.append(self.done / self.requests)
        if self.time_limit_ms:
            parts.append(self.virtual_ms / self.time_limit_ms)
        return min(1.0, max(parts)) if parts else None

    def eta_s(self) -> float | None:
        """Wall seconds left, at the pace so far (None: unknown)."""
        fraction = self.fraction
        if not fraction:
            return None
        return self.elapsed_s * (1.0 - fraction) / fraction

    def where(self) -> str:
        """``virtual time 1,450.2 s, 4,911 of 12,031 requests done``."""
        limit = f" of {self.time_limit_ms / 1000:,.1f}" if self.time_limit_ms else ""
        of = f" of {self.requests:,}" if self.requests is not None else ""
        return (f"virtual time {self.virtual_ms / 1000:,.1f}{limit} s, "
                f"{self.done:,}{of} requests done")

    def eta(self) -> str:
        """``, ETA 26 s`` (empty while unknown)."""
        eta = self.eta_s()
        return f", ETA {duration(eta)}" if eta is not None else ""

    def line(self, what: str) -> str:
        """``replay: 41%, virtual time 1,450.2 s, 4,911 of 12,031 requests done, 18 s
        elapsed, ETA 26 s``."""
        fraction = self.fraction
        done = f"{fraction:.0%}, " if fraction is not None else ""
        return f"{what}: {done}{self.where()}, {duration(self.elapsed_s)} elapsed{self.eta()}"

    def brief(self) -> str:
        """``4,911/12,031 requests, virtual 1,450.2 s, ETA 26 s``: beside a bar."""
        of = f"/{self.requests:,}" if self.requests is not None else ""
        return f"{self.done:,}{of} requests, virtual {self.virtual_ms / 1000:,.1f} s{self.eta()}"


def duration(seconds: float) -> str:
    """``26 s``, ``4 min 10 s``, ``2 h 05 min``."""
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


@contextlib.contextmanager
def shown(progress: ReplayProgress, console: Console, *, quiet: bool = False,
          what: str = "replay") -> Iterator[None]:
    """``progress`` shown on ``console`` while the block runs: a transient bar on a
    terminal, otherwise a line every :data:`LOG_EVERY_S` seconds (and a last one when the
    block ends without an exception, if any was written); nothing when ``quiet``."""
    if quiet:
        yield
    elif console.is_terminal:
        with _Bar(console, what) as bar:
            progress.attach(bar.show, BAR_EVERY_S)
            yield
    else:
        log = LogLines(console.file, what)
        progress.attach(log.show, LOG_EVERY_S)
        yield
        log.finish(progress)


class LogLines:
    """A progress line per call, for a log (stderr that is no terminal)."""

    def __init__(self, stream: IO[str], what: str) -> None:
        self.stream, self.what = stream, what
        self.written = 0

    def show(self, progress: ReplayProgress) -> None:
        self._write(progress.line(self.what))

    def finish(self, progress: ReplayProgress) -> None:
        """The last line, if the log has the others."""
        if self.written:
            self._write(f"{self.what}: done, {progress.where()}, "
                        f"{duration(progress.elapsed_s)} elapsed")

    def _write(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()
        self.written += 1


class _Bar:
    """A transient rich progress bar: the fraction done, or a pulse while it is unknown."""

    def __init__(self, console: Console, what: str) -> None:
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

        self._bar = Progress(TextColumn(what), BarColumn(bar_width=24), TaskProgressColumn(),
                             TextColumn("{task.description}"), console=console,
                             transient=True)
        self._task: Any = None

    def __enter__(self) -> _Bar:
        self._bar.__enter__()
        self._task = self._bar.add_task("", total=None)
        return self

    def show(self, progress: ReplayProgress) -> None:
        fraction = progress.fraction
        self._bar.update(self._task, description=progress.brief(),
                         total=None if fraction is None else 1.0, completed=fraction or 0.0)

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)  # type: ignore[arg-type]
