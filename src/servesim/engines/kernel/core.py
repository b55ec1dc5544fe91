"""The discrete-event core of a replay: virtual clock, event heap, arrivals, settling.

:class:`EventLoop` knows nothing of schedulers. It pulls the workload's open-loop arrivals
lazily, queues each as an event (after the serving front end's latency, if any), pops
events in ``(time, phase, key)`` order and hands each to :meth:`EventLoop._dispatch`;
once every event of an instant was processed it calls :meth:`EventLoop._settle` (start
idle workers, retry handoffs), and after the last instant (or past the workload's
cutoff) :meth:`EventLoop._flush_incomplete`. Events are cancelled through the heap
(:meth:`servesim.engines.kernel.events.EventQueue.cancel`).

Zero-delay events pushed while settling are processed in a later *round* at the same
instant; :attr:`EventLoop.event_order` tells a handler where in the instant it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from mypy_extensions import mypyc_attr

from servesim import codes
from servesim.engines.kernel.events import PHASE_ARRIVAL, EventQueue
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, Workload
from servesim.errors import Diagnostic, ReplayError

Sink = Callable[[RequestRecord], None]

# ``progress`` (when given) is called at most every PROGRESS_INTERVAL_S of wall time, looked
# at every PROGRESS_EVERY loop iterations; once at the end, and on an interrupt with the
# virtual time reached.
PROGRESS_EVERY = 64
PROGRESS_INTERVAL_S = 0.5
# ``EventLoop.event_order`` while the first round of events of an instant settles, and in
# the later rounds at the same instant (events pushed by that settling).
AFTER_EVENTS = (PHASE_ARRIVAL + 1, 0)
LATER_ROUND = (PHASE_ARRIVAL + 2, 0)


class Guard(Protocol):
    """Run-time checks a loop calls after an instant and once at the end: after each
    instant when ``every_instant``, else after each later round of events at one instant
    (a loop that stops advancing time)."""

    every_instant: bool

    def instant(self, now: float) -> None: ...

    def finish(self) -> None: ...


class NoGuard:
    every_instant = False

    def instant(self, now: float) -> None:
        pass

    def finish(self) -> None:
        pass


@mypyc_attr(allow_interpreted_subclasses=True)  # engines, ours and plugins', subclass it
class EventLoop:
    """Clock and event heap of one run (see the module docstring)."""

    def __init__(self, workload: Workload, sink: Sink,
                 progress: Callable[[float], None] | None) -> None:
        self.workload = workload
        self.sink = sink
        self.progress = progress
        self._progress_due = 0.0  # (time.monotonic) the next progress call, at the earliest
        self.events: EventQueue[Any] = EventQueue()
        self.now = 0.0
        self._lookahead: RequestSpec | None = None
        # the serving front end's latency by prompt length: a request reaches the engine
        # that long after its arrival (set by an engine from its timer, see timing.base)
        self.front_end: Callable[[int], float] | None = None
        # (phase, key) of the event being processed; AFTER_EVENTS once all of an instant's
        # events were
        self.event_order = AFTER_EVENTS

    # -- hooks ------------------------------------------------------------------------------

    def _dispatch(self, item: Any) -> None:
        """Process one event popped at ``self.now`` (an arrival is a RequestSpec)."""
        raise NotImplementedError

    def _settle(self) -> None:
        """After the events of an instant (start idle workers...)."""
        raise NotImplementedError

    def _flush_incomplete(self) -> None:
        """After the last instant: send the requests still in flight to the sink."""
        raise NotImplementedError

    def _guard(self) -> Guard:
        """The run-time checks of this run (none by default)."""
        return NoGuard()

    # -- main loop ------------------------------------------------------------------------

    def run_loop(self) -> None:
        """Process events in order until none is left or the cutoff is passed."""
        try:
            self._run_events()
        except KeyboardInterrupt:  # Ctrl-C or a timeout: the caller learns where it stopped
            if self.progress is not None:
                self.progress(self.now)
            raise
        if self.progress is not None:
            self.progress(self.now)

    def _run_events(self) -> None:
        events = self.events
        cutoff = self.workload.max_time_ms
        arrivals: Iterator[RequestSpec] = iter(self.workload.start())
        lookahead = next(arrivals, None)
        self._lookahead = lookahead
        inf = float("inf")
        settled = -inf  # the instant of the last settle
        iterations = 0
        guard = self._guard()
        every_instant = guard.every_instant
        while True:
            t_event = events.peek_time()
            t = inf if t_event is None else t_event
            if lookahead is not None and lookahead.arrival_ms < t:
                t = lookahead.arrival_ms
            if t == inf or (cutoff is not None and t > cutoff):
                break
            if t < self.now:
                raise self._order_error(t)
            self.now = t
            while lookahead is not None and lookahead.arrival_ms <= t:
                self._admit(lookahead)
                lookahead = next(arrivals, None)
            self._lookahead = lookahead
            # A later round at one instant (after a settle pushed zero-delay events) comes
            # after every event that was in the heap at the instant's first round.
            later_round = t == settled
            while True:
                t_event = events.peek_time()
                if t_event is None or t_event > t:
                    break
                _, phase, key, item = events.pop_keyed()
                self.event_order = LATER_ROUND if later_round else (phase, key)
                self._dispatch(item)
            self.event_order = LATER_ROUND if later_round else AFTER_EVENTS
            self._settle()
            settled = t
            if every_instant or later_round:
                guard.instant(self.now)
            iterations += 1
            if iterations % PROGRESS_EVERY == 0 and self.progress is not None:
                self._report_progress()
        self._flush_incomplete()
        guard.finish()

    def _report_progress(self) -> None:
        """Call ``progress`` with the virtual time, unless it was called less than
        PROGRESS_INTERVAL_S ago."""
        clock = time.monotonic()
        if clock >= self._progress_due and self.progress is not None:
            self._progress_due = clock + PROGRESS_INTERVAL_S
            self.progress(self.now)

    def _release(self, spec: RequestSpec, time_ms: float) -> None:
        """Queue the requests the workload releases because ``spec`` ended at ``time_ms``."""
        for new in self.workload.on_terminal(spec, time_ms):
            if new.arrival_ms < time_ms:
                raise self._order_error(new.arrival_ms)
            self._admit(new)

    def _admit(self, spec: RequestSpec) -> None:
        """Queue ``spec``'s arrival event: at its arrival, or after the front end's latency."""
        at = spec.arrival_ms
        if self.front_end is not None:
            at += self.front_end(spec.input_length)
        self.events.push(at, PHASE_ARRIVAL, spec.request_id, spec)

    def _horizon(self) -> float:
        """Time of the next event in the heap or admission of the run's next arrival."""
        t_event = self.events.peek_time()
        t = float("inf") if t_event is None else t_event
        lookahead = self._lookahead
        if lookahead is not None and lookahead.arrival_ms < t:
            at = lookahead.arrival_ms
            if self.front_end is not None:
                at += self.front_end(lookahead.input_length)
            t = min(t, at)
        return t

    def _order_error(self, t: float) -> ReplayError:
        return ReplayError(
            [Diagnostic(code=codes.WORKLOAD_ORDER,
                        message=f"workload produced an arrival at {t} ms, before the current "
                        f"virtual time {self.now} ms; arrivals must be nondecreasing")]
        )
