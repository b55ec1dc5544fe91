"""Aggregated replay: a pool of vLLM workers driven by a deterministic event loop.

Virtual time is a float number of milliseconds. A worker is ``attention_data`` rank
schedulers that run their passes in lockstep: a pass starts when the worker is idle and
some rank has work, every rank with work schedules its own batch at the same instant,
and the worker's pass ends when its slowest rank ends; every token of the pass is stamped
with that end time and becomes visible (sink, workload callbacks) only then.

Event order at one instant: pass completions, then arrivals; idle workers start their
next pass only after every event of the instant was processed, so an arrival at exactly
a pass boundary joins the next pass and a decision never sees an unfinished pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from servesim.engines.kernel.audit import guard_replay
from servesim.engines.kernel.events import PHASE_ARRIVAL, PHASE_ENGINE, EventQueue
from servesim.engines.kernel.requests import (
    RequestRecord,
    RequestSpec,
    TerminalStatus,
    Workload,
)
from servesim.engines.vllm.scheduler import RankPass, RankScheduler, SeqState
from servesim.errors import Diagnostic, ReplayError
from servesim.payload import RoleArgs
from servesim.timing import StepTimer, make_timer

Sink = Callable[[RequestRecord], None]

# Report progress every this many loop iterations (and once at the end).
_PROGRESS_EVERY = 4096


@attrs.frozen(slots=True)
class ReplayStats:
    """Run totals; per-request outcomes went to the sink."""

    end_ms: float  # time of the last processed event
    passes: int  # worker passes started (one per worker iteration, all ranks together)
    num_requests: int  # requests that arrived, i.e. records sent to the sink
    completed: int
    rejected: int
    incomplete: int
    worker_busy_ms: tuple[float, ...]  # per worker: sum of its completed pass durations

    @property
    def worker_seconds(self) -> float:
        """Provisioned worker time: every worker exists from t=0 to the end of the run."""
        return len(self.worker_busy_ms) * self.end_ms / 1000.0


@attrs.define(slots=True, eq=False)
class Worker:
    """One replica: its rank schedulers and the pass in flight."""

    index: int
    ranks: list[RankScheduler]
    next_rank: int = 0
    wave_step: int = 0  # passes since the worker's DP group last drained
    busy: bool = False
    pass_start: float = 0.0
    pending: list[RankPass] = attrs.field(factory=list)
    busy_ms: float = 0.0


@attrs.define(slots=True, eq=False)
class _PassEnd:
    worker: Worker


class AggregatedReplay:
    """One aggregated run; :func:`replay_aggregated` is the usual entry point. Keeping the
    object gives access to the workers (and their rank pools) after :meth:`run`.

    All workers are ready at t=0; ``startup_seconds`` only delays workers added during a
    run, which an aggregated replay without scaling never does.
    """

    def __init__(
        self,
        role: RoleArgs,
        timer: StepTimer,
        workload: Workload,
        sink: Sink,
        progress: Callable[[float], None] | None,
    ) -> None:
        self.role = role
        self.workload = workload
        self.sink = sink
        self.progress = progress
        dp = role.attention_data
        self.workers = [
            Worker(index=w, ranks=[RankScheduler(role, timer, rank_offset=w * dp + r)
                                   for r in range(dp)])
            for w in range(role.replicas)
        ]
        self.events: EventQueue[_PassEnd | RequestSpec] = EventQueue()
        self.live: dict[int, SeqState] = {}
        self.now = 0.0
        self.next_worker = 0
        self.passes = 0
        self.num_requests = 0
        self.counts = {"completed": 0, "rejected": 0, "incomplete": 0}
        self.dirty: list[Worker] = []

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> ReplayStats:
        events = self.events
        cutoff = self.workload.max_time_ms
        arrivals: Iterator[RequestSpec] = iter(self.workload.start())
        lookahead = next(arrivals, None)
        inf = float("inf")
        iterations = 0
        guard = guard_replay(self)  # watchdog; invariant auditor when enabled
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
                events.push(lookahead.arrival_ms, PHASE_ARRIVAL, lookahead.request_id, lookahead)
                lookahead = next(arrivals, None)
            while True:
                t_event = events.peek_time()
                if t_event is None or t_event > t:
                    break
                _, _, item = events.pop()
                if isinstance(item, _PassEnd):
                    self._end_pass(item.worker)
                else:
                    self._arrive(item)
            if self.dirty:
                dirty, self.dirty = self.dirty, []
                for worker in dirty:
                    if not worker.busy:
                        self._start_pass(worker)
            guard.instant(self.now)
            iterations += 1
            if self.progress is not None and iterations % _PROGRESS_EVERY == 0:
                self.progress(self.now)
        self._flush_incomplete()
        guard.finish()
        if self.progress is not None:
            self.progress(self.now)
        return ReplayStats(
            end_ms=self.now,
            passes=self.passes,
            num_requests=self.num_requests,
            completed=self.counts["completed"],
            rejected=self.counts["rejected"],
            incomplete=self.counts["incomplete"],
            worker_busy_ms=tuple(w.busy_ms for w in self.workers),
        )

    # -- events ---------------------------------------------------------------------------

    def _arrive(self, spec: RequestSpec) -> None:
        worker = self.workers[self.next_worker]
        self.next_worker = (self.next_worker + 1) % len(self.workers)
        rank = worker.ranks[worker.next_rank]
        worker.next_rank = (worker.next_rank + 1) % len(worker.ranks)
        record = RequestRecord(
            request_id=spec.request_id,
            arrival_ms=spec.arrival_ms,
            input_length=spec.input_length,
            requested_output_length=spec.output_length,
            status="incomplete",
            session_id=spec.session_id,
            turn_index=spec.turn_index,
            decode_worker=worker.index,
        )
        seq = rank.new_seq(spec, record)
        if spec.request_id in self.live:
            raise ReplayError(
                [Diagnostic(code="workload-duplicate-id",
                            message=f"request id {spec.request_id} arrived twice while in flight")]
            )
        self.live[spec.request_id] = seq
        self.num_requests += 1
        rank.submit(seq)
        if not worker.busy:
            self.dirty.append(worker)

    def _start_pass(self, worker: Worker) -> None:
        now = self.now
        results: list[RankPass] = []
        duration = 0.0
        progressed = False
        dp_size = len(worker.ranks)
        for rank in worker.ranks:
            if not rank.has_work:
                continue
            res = rank.execute_pass(now, worker.wave_step, dp_size)
            results.append(res)
            progressed = progressed or res.progressed
            d = res.duration_ms
            if d > duration:
                duration = d
        if not results:
            worker.wave_step = 0  # the DP group drained: the prefill cadence restarts
            return  # nothing to do: the worker sleeps until an arrival marks it dirty
        if not progressed:
            raise self._stuck_error(worker)
        self.passes += 1
        worker.wave_step += 1
        worker.busy = True
        worker.pass_start = now
        worker.pending = results
        self.events.push(now + duration, PHASE_ENGINE, worker.index, _PassEnd(worker))
        for res in results:
            for seq in res.rejected:
                self._terminal(seq, "rejected", now)

    def _end_pass(self, worker: Worker) -> None:
        end = self.now
        worker.busy = False
        worker.busy_ms += end - worker.pass_start
        pending, worker.pending = worker.pending, []
        for res in pending:
            for seq in res.emitted:  # a speculative burst: one entry per token
                seq.record.token_times.append(end)
        for res in pending:
            for seq in res.finished:
                self._terminal(seq, "completed", end)
        self.dirty.append(worker)

    def _terminal(self, seq: SeqState, status: TerminalStatus, time_ms: float) -> None:
        record = seq.record
        record.status = status
        record.terminal_ms = time_ms
        del self.live[record.request_id]
        self.counts[status] += 1
        self.sink(record)
        for spec in self.workload.on_terminal(seq.spec, time_ms):
            if spec.arrival_ms < time_ms:
                raise self._order_error(spec.arrival_ms)
            self.events.push(spec.arrival_ms, PHASE_ARRIVAL, spec.request_id, spec)

    def _flush_incomplete(self) -> None:
        # Passes still in flight at the cutoff never completed: their tokens are dropped.
        for request_id in sorted(self.live):
            record = self.live[request_id].record
            record.status = "incomplete"
            self.counts["incomplete"] += 1
            self.sink(record)
        self.live.clear()

    # -- errors ---------------------------------------------------------------------------

    def _order_error(self, t: float) -> ReplayError:
        return ReplayError(
            [Diagnostic(code="workload-order",
                        message=f"workload produced an arrival at {t} ms, before the current "
                        f"virtual time {self.now} ms; arrivals must be nondecreasing")]
        )

    def _stuck_error(self, worker: Worker) -> ReplayError:
        heads = [r.waiting[0].spec.request_id for r in worker.ranks if r.waiting]
        return ReplayError(
            [Diagnostic(code="replay-stuck",
                        message=f"worker {worker.index} has work but cannot schedule any of it "
                        f"(waiting heads: {heads}); this is a scheduler invariant violation",
                        path=("engine", "workers", self.role.worker_type))]
        )


def replay_aggregated(
    role: RoleArgs,
    workload: Workload,
    sink: Sink,
    *,
    progress: Callable[[float], None] | None = None,
) -> ReplayStats:
    """Replay ``workload`` on ``role.replicas`` vLLM workers; every request that arrives is
    sent to ``sink`` exactly once, when it becomes terminal (or at the end, as incomplete).

    Open-loop requests are pulled lazily from ``workload.start()``; requests released by
    ``workload.on_terminal`` join the same event queue. ``progress`` (if given) receives
    the current virtual time in ms now and then and once at the end.
    """
    run = AggregatedReplay(role, make_timer(role), workload, sink, progress)
    return run.run()
