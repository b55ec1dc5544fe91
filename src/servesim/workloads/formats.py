"""Trace formats: how a ``traffic.source.format`` name becomes sessions.

A *loader* is called with a :class:`TraceFile` and returns a :class:`TraceReader`. The
built-in ``mooncake`` and ``mooncake-delta`` loaders are registered through the
``servesim_register_trace_formats`` hook like any plugin's; :func:`request_format` makes
a loader from a function that simply yields requests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

import attrs

from servesim.engines.kernel.requests import RequestSpec
from servesim.workloads.driver import Session


@attrs.frozen
class TraceFile:
    """What a loader is asked to read (built by the workload from the payload)."""

    path: Path  # the file, resolved against the payload's folder; it exists
    name: str  # the path as written in the config, for diagnostics
    format: str
    block_size: int  # traffic.source.block_size: tokens per hash id
    use_timestamps: bool  # the load replays the trace's own timestamps
    speedup: float = 1.0  # trace_timestamps: divide timestamps and delays by this
    max_requests: int | None = None  # a requests stop: rows beyond it need not be read


class TraceReader(Protocol):
    """An open trace."""

    def sessions(self) -> Iterator[Session]:
        """The trace's sessions in file order; called again at the start of every replay."""
        ...

    def close(self) -> None:
        """Release files; called when the replay ends (also on errors)."""
        ...


TraceLoader = Callable[[TraceFile], TraceReader]


class MooncakeTrace:
    """A Mooncake JSONL trace (spec §7.2), read lazily; ``delta`` for ``mooncake-delta``."""

    def __init__(self, trace: TraceFile, *, delta: bool = False) -> None:
        self.trace, self.delta = trace, delta
        self._counts: dict[str, int] | None = None
        self._readers: list[Any] = []

    def sessions(self) -> Iterator[Session]:
        from servesim.workloads.mooncake import MooncakeReader, count_session_rows
        from servesim.workloads.trace import trace_sessions

        t = self.trace
        if self._counts is None:
            self._counts = count_session_rows(t.path)
        self.close()
        reader = MooncakeReader(t.path, t.name, t.block_size, require_timestamps=t.use_timestamps,
                                max_rows=t.max_requests, session_rows=self._counts)
        self._readers.append(reader)
        return trace_sessions(reader, speedup=t.speedup, delta=self.delta)

    def close(self) -> None:
        while self._readers:
            self._readers.pop().close()


def mooncake(trace: TraceFile) -> TraceReader:
    """Mooncake JSONL: one request per line, hash ids, optional sessions."""
    return MooncakeTrace(trace)


def mooncake_delta(trace: TraceFile) -> TraceReader:
    """Mooncake JSONL whose later session turns hold only the new input."""
    return MooncakeTrace(trace, delta=True)


BUILTIN_FORMATS: dict[str, TraceLoader] = {"mooncake": mooncake, "mooncake-delta": mooncake_delta}


# -- plain request streams -------------------------------------------------------------------

@attrs.frozen(slots=True)
class OneTurn:
    """A one-request session; with no arrival given it arrives at its own time / speedup."""

    spec: RequestSpec
    speedup: float = 1.0

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        when = self.spec.arrival_ms / self.speedup if arrival_ms is None else arrival_ms
        return self.spec.evolve(arrival_ms=when)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        return None


class _RequestStream:
    def __init__(self, read: Callable[[TraceFile], Iterable[RequestSpec]],
                 trace: TraceFile) -> None:
        self.read, self.trace = read, trace
        self._open: list[Any] = []

    def sessions(self) -> Iterator[Session]:
        self.close()
        requests = iter(self.read(self.trace))
        self._open.append(requests)
        speedup = self.trace.speedup if self.trace.use_timestamps else 1.0
        return (OneTurn(spec, speedup) for spec in requests)

    def close(self) -> None:
        while self._open:
            close = getattr(self._open.pop(), "close", None)
            if close is not None:
                close()


def request_format(read: Callable[[TraceFile], Iterable[RequestSpec]]) -> TraceLoader:
    """A loader from ``read(trace)``, which yields one :class:`RequestSpec` per request.

    Each request is a one-turn session. ``request_id`` must be dense and unique (the row
    index is a good choice); ``arrival_ms`` is the request's time in the trace, used by a
    ``trace_timestamps`` load (divided by the speedup) and ignored by a concurrency load.
    ``read`` is called again at every replay start; a generator is closed at the end.
    """

    def load(trace: TraceFile) -> TraceReader:
        return _RequestStream(read, trace)

    load.__name__ = getattr(read, "__name__", "load")
    load.__doc__ = read.__doc__
    return load


# -- exceptions from third-party loaders name the plugin ------------------------------------

Guard = Callable[[str], AbstractContextManager[None]]


def guarded_loader(loader: TraceLoader, guard: Guard, hook: str) -> TraceLoader:
    """``loader`` with every call into it (and its readers and sessions) run under ``guard``."""

    def load(trace: TraceFile) -> TraceReader:
        with guard(hook):
            reader = loader(trace)
        return _GuardedReader(reader, guard, hook)

    return load


class _GuardedReader:
    def __init__(self, reader: TraceReader, guard: Guard, hook: str) -> None:
        self.reader, self.guard, self.hook = reader, guard, hook

    def sessions(self) -> Iterator[Session]:
        with self.guard(f"{self.hook} sessions()"):
            it = iter(self.reader.sessions())
        while True:
            with self.guard(f"{self.hook} sessions()"):
                session = next(it, None)
            if session is None:
                return
            yield _GuardedSession(session, self.guard, self.hook)

    def close(self) -> None:
        with self.guard(f"{self.hook} close()"):
            self.reader.close()


class _GuardedSession:
    __slots__ = ("guard", "hook", "session")

    def __init__(self, session: Session, guard: Guard, hook: str) -> None:
        self.session, self.guard, self.hook = session, guard, hook

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        with self.guard(f"{self.hook} first_turn()"):
            return self.session.first_turn(arrival_ms)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        with self.guard(f"{self.hook} next_turn()"):
            return self.session.next_turn(previous, end_ms)
