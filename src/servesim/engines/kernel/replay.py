"""The base of a replay engine's run: the event core plus the bookkeeping of requests.

A run subclasses :class:`Replay` and says what its events do (:meth:`Replay._dispatch`)
and what happens once the events of an instant were processed (:meth:`Replay._settle`).
The base keeps what every engine does the same way:

* :meth:`Replay._open` builds the client-visible :class:`RequestRecord` of an arrival
  (refusing an id already in flight) and keeps it *live*;
* :meth:`Replay._terminal` ends a live request (completed or rejected): stamps its status
  and terminal time, counts it, sends it to the sink and queues the requests the workload
  releases in reply;
* at the end of the run the requests still live go to the sink as ``incomplete``, in
  request-id order, without the tokens stamped after the last instant processed
  (:meth:`Replay._flush_incomplete`);
* :meth:`Replay.totals` and :meth:`Replay.result` are the run's totals and the
  :class:`~servesim.engines.base.ReplayResult` an engine returns;
* :meth:`Replay._stuck_error` is the ``replay-stuck`` error of a worker that has work and
  cannot schedule any of it.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from mypy_extensions import mypyc_attr

from servesim import codes
from servesim.engines.base import ReplayResult
from servesim.engines.kernel.core import EventLoop, Sink
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, TerminalStatus, Workload
from servesim.errors import Diagnostic, ReplayError


@mypyc_attr(allow_interpreted_subclasses=True)  # engines, ours and plugins', subclass it
class Replay(EventLoop):
    """One run of an engine: :meth:`run_loop` replays the workload; :attr:`live` holds the
    records of the requests in flight by request id."""

    def __init__(self, workload: Workload, sink: Sink,
                 progress: Callable[[float], None] | None) -> None:
        super().__init__(workload, sink, progress)
        self.live: dict[int, RequestRecord] = {}
        self.num_requests = 0  # requests that arrived, i.e. records sent to the sink
        self.counts = {"completed": 0, "rejected": 0, "incomplete": 0}
        self.passes = 0  # engine iterations, as the engine counts them

    def _open(self, spec: RequestSpec, *, prefill_worker: int | None = None,
              decode_worker: int | None = None, pass_ends: array | None = None
              ) -> RequestRecord:
        """The live record of ``spec``, which arrives now."""
        if spec.request_id in self.live:
            raise ReplayError(
                [Diagnostic(code=codes.WORKLOAD_DUPLICATE_ID,
                            message=f"request id {spec.request_id} arrived twice while in flight")]
            )
        record = RequestRecord(
            request_id=spec.request_id,
            arrival_ms=spec.arrival_ms,
            input_length=spec.input_length,
            requested_output_length=spec.output_length,
            status="incomplete",
            session_id=spec.session_id,
            turn_index=spec.turn_index,
            prefill_worker=prefill_worker,
            decode_worker=decode_worker,
            pass_ends=pass_ends,
        )
        self.live[spec.request_id] = record
        self.num_requests += 1
        return record

    def _terminal(self, spec: RequestSpec, status: TerminalStatus, time_ms: float) -> None:
        """``spec`` ended at ``time_ms``: send its record to the sink, release follow-ups."""
        record = self.live.pop(spec.request_id)
        record.status = status
        record.terminal_ms = time_ms
        self.counts[status] += 1
        self.sink(record)
        self._release(spec, time_ms)

    def _flush_incomplete(self) -> None:
        # In flight at the cutoff: passes and transfers that did not complete are dropped,
        # and so are tokens an engine stamped ahead of the end of the run.
        live, end = self.live, self.now
        for request_id in sorted(live):
            record = live[request_id]
            times = record.token_times
            while times and times[-1] > end:
                times.pop()
            record.status = "incomplete"
            self.counts["incomplete"] += 1
            self.sink(record)
        live.clear()

    def totals(self) -> dict[str, Any]:
        """The run's totals: end time, passes, requests by outcome."""
        counts = self.counts
        return {"end_ms": self.now, "passes": self.passes, "num_requests": self.num_requests,
                "completed": counts["completed"], "rejected": counts["rejected"],
                "incomplete": counts["incomplete"]}

    def result(self, gpu_seconds: dict[str, float],
               extra: dict[str, Any] | None = None) -> ReplayResult:
        """What the engine's ``replay`` returns after :meth:`run_loop`."""
        return ReplayResult(end_ms=self.now, gpu_seconds=gpu_seconds, passes=self.passes,
                            extra=extra if extra is not None else {})

    def _stuck_error(self, worker: str, waiting: list[int],
                     path: tuple[str, ...]) -> ReplayError:
        """``worker`` (e.g. "decode worker 3") has work but cannot schedule any of it."""
        return ReplayError(
            [Diagnostic(code=codes.REPLAY_STUCK,
                        message=f"{worker} has work but cannot schedule any of it (waiting "
                        f"heads: {waiting}); this is a scheduler invariant violation",
                        path=path)]
        )
