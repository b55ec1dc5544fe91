"""Arrival processes and the session driver that implements the ``Workload`` protocol.

Every workload is a stream of *units* (load and stop units): a session of one or more
turns. A plain synthetic request or a trace row without ``session_id`` is a one-turn
session. Turns of a session run strictly in order: turn ``k + 1`` is released when turn
``k`` ends, after its delay.

Request ids are structural, so they do not depend on when an engine pulls arrivals:
synthetic request ``i`` has id ``i``, synthetic session ``s`` turn ``k`` has id
``s * turns + k``, a trace row has its 0-based row index. A ``requests`` stop keeps the
requests whose id is below the count.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from servesim import codes
from servesim.engines.kernel.requests import RequestSpec
from servesim.errors import Diagnostic, WorkloadError
from servesim.limits import VIRTUAL_MS


class Session(Protocol):
    """One load unit: hands out its turns in order."""

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        """The first request, arriving at ``arrival_ms`` (``None``: the unit's own time)."""

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        """The turn after ``previous``, which ended at ``end_ms``; ``None`` when done."""


def poisson_arrivals(rate_per_s: float, seed: int) -> Iterator[float]:
    """First arrival at 0 ms, then cumulative ``expovariate(rate) * 1000`` ms gaps."""
    rng = random.Random(seed)
    t = 0.0
    while True:
        yield t
        t += rng.expovariate(rate_per_s) * 1000.0


def gamma_arrivals(rate_per_s: float, cv: float, seed: int) -> Iterator[float]:
    """First arrival at 0 ms, then gamma gaps of mean ``1000 / rate`` ms and coefficient
    of variation ``cv`` (shape ``1 / cv^2``): bursts and lulls for ``cv > 1``, steadier
    than poisson for ``cv < 1``. ``cv = 1`` is :func:`poisson_arrivals`, draw for draw."""
    if cv == 1.0:
        yield from poisson_arrivals(rate_per_s, seed)
        return
    rng = random.Random(seed)
    shape = 1.0 / (cv * cv)
    scale = 1000.0 / (rate_per_s * shape)
    t = 0.0
    while True:
        yield t
        t += rng.gammavariate(shape, scale)


def constant_arrivals(rate_per_s: float) -> Iterator[float]:
    """Arrival ``i`` at ``i * 1000 / rate`` ms."""
    interval = 1000.0 / rate_per_s
    i = 0
    while True:
        yield i * interval
        i += 1


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """``concurrency`` units in flight; a unit ending releases the next one at that time."""

    concurrency: int


@dataclass(frozen=True, slots=True)
class OpenLoop:
    """Units start at the times of a fresh ``arrivals()`` stream (``None``: own times)."""

    arrivals: Callable[[], Iterator[float]] | None


ArrivalPlan = ClosedLoop | OpenLoop


def _in_time(spec: RequestSpec) -> RequestSpec:
    """``spec``, unless it arrives past the virtual time a replay covers (a rate or speedup
    so small, or a delay so long, that the clock would lose its milliseconds or overflow)."""
    if not spec.arrival_ms <= VIRTUAL_MS:
        raise WorkloadError([Diagnostic(
            code=codes.ARRIVAL_TOO_LATE, path=("traffic", "load"),
            message=f"request {spec.request_id} arrives at {spec.arrival_ms:.3g} ms of virtual "
            f"time, past the {VIRTUAL_MS:g} ms (about 31 years) a replay covers",
            hint="raise the rate or the speedup, shorten the delays, or stop the replay "
                 "earlier (traffic.stop)")])
    return spec


class SessionWorkload:
    """Drives units through an arrival plan; satisfies the kernel ``Workload`` protocol.

    ``start()`` begins a fresh replay (state from a previous replay is discarded).
    """

    def __init__(
        self,
        units: Callable[[], Iterator[Session]],
        plan: ArrivalPlan,
        *,
        max_sessions: int | None = None,
        max_requests: int | None = None,
        max_time_ms: float | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._make_units = units
        self._plan = plan
        self._max_sessions = max_sessions
        self._max_requests = max_requests
        self._max_time_ms = max_time_ms
        self._on_close = on_close
        self._units: Iterator[Session] | None = None
        self._live: dict[int, Session] = {}
        self._released = 0

    @property
    def max_time_ms(self) -> float | None:
        return self._max_time_ms

    def _admissible(self, spec: RequestSpec) -> bool:
        if self._max_requests is not None and spec.request_id >= self._max_requests:
            return False
        return self._max_time_ms is None or spec.arrival_ms <= self._max_time_ms

    def _release(self, arrival_ms: float | None) -> RequestSpec | None:
        """First turn of the next unit, or ``None`` when no unit is left."""
        if self._units is None:
            return None
        if self._max_sessions is not None and self._released >= self._max_sessions:
            self._units = None
            return None
        unit = next(self._units, None)
        spec = None if unit is None else unit.first_turn(arrival_ms)
        if unit is None or spec is None or not self._admissible(spec):
            # ids and arrivals of later units only grow: nothing after this one is admissible
            self._units = None
            if not self._live:
                self.close()
            return None
        self._released += 1
        self._live[spec.request_id] = unit
        return _in_time(spec)

    def start(self) -> Iterator[RequestSpec]:
        if self._units is not None:  # a previous replay still reads
            self.close()
        self._units = self._make_units()
        self._live = {}
        self._released = 0
        if isinstance(self._plan, ClosedLoop):
            for _ in range(self._plan.concurrency):
                spec = self._release(0.0)
                if spec is None:
                    return
                yield spec
            return
        times = None if self._plan.arrivals is None else self._plan.arrivals()
        while True:
            spec = self._release(None if times is None else next(times))
            if spec is None:
                return
            yield spec

    def on_terminal(self, request: RequestSpec, time_ms: float) -> list[RequestSpec]:
        unit = self._live.pop(request.request_id, None)
        if unit is None:
            return []
        spec = unit.next_turn(request, time_ms)
        if spec is not None and self._admissible(spec):
            self._live[spec.request_id] = unit
            return [_in_time(spec)]
        if isinstance(self._plan, ClosedLoop):
            nxt = self._release(time_ms)
            if nxt is not None:
                return [nxt]
        if self._units is None and not self._live:
            self.close()  # the replay has nothing left to read
        return []

    def close(self) -> None:
        """Release resources (an open trace file); a later ``start()`` reopens them."""
        if self._on_close is not None:
            self._on_close()

    def __enter__(self) -> SessionWorkload:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the error that ended the replay is reported
            self.close()
