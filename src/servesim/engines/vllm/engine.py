"""Aggregated replay: a pool of vLLM workers driven by a deterministic event loop.

Virtual time is a float number of milliseconds. A worker is ``attention_data`` rank
schedulers that run their passes in lockstep: a pass starts when the worker is idle and
some rank has work, every rank with work schedules its own batch at the same instant,
and the worker's pass ends when its slowest rank ends; every token of the pass is stamped
with that end time and becomes visible (sink, workload callbacks) only then.

Event order at one instant: pass completions, then arrivals; idle workers start their
next pass (in worker order) only after every event of the instant was processed, so an
arrival at exactly a pass boundary joins the next pass and a decision never sees an
unfinished pass.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from mypy_extensions import mypyc_attr

from servesim.backends import Backend
from servesim.engines.kernel.host_tier import host_links
from servesim.engines.kernel.links import SharedLink, Transfer
from servesim.engines.kernel.passes import PassEnd, PassReplay, PassWorker
from servesim.engines.kernel.rank import Seq
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, Workload
from servesim.engines.ranks.scheduler import RankPass, RankScheduler
from servesim.engines.routing.base import Router
from servesim.engines.routing.builtin import RoundRobin
from servesim.engines.routing.registry import make_router
from servesim.engines.routing.views import RoutedPool
from servesim.payload import RoleArgs
from servesim.timing import StepTimer, make_timer
from servesim.timing.base import front_end

Sink = Callable[[RequestRecord], None]


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """Run totals; per-request outcomes went to the sink."""

    end_ms: float  # time of the last processed event
    passes: int  # worker passes started (one per worker iteration, all ranks together)
    num_requests: int  # requests that arrived, i.e. records sent to the sink
    completed: int
    rejected: int
    incomplete: int
    worker_busy_ms: tuple[float, ...]  # per worker: sum of its completed pass durations
    speculation: dict[str, Any] = field(default_factory=dict)  # acceptance statistics
    host: dict[str, Any] = field(default_factory=dict)  # host (G2) tier figures

    @property
    def worker_seconds(self) -> float:
        """Provisioned worker time: every worker exists from t=0 to the end of the run."""
        return len(self.worker_busy_ms) * self.end_ms / 1000.0


@dataclass(slots=True, eq=False, kw_only=True)
class Worker(PassWorker):
    """One aggregated replica: its rank schedulers and the pass in flight."""


@mypyc_attr(allow_interpreted_subclasses=True)
class AggregatedReplay(PassReplay[Worker]):
    """One aggregated run; :func:`replay_aggregated` is the usual entry point. Keeping the
    object gives access to the workers (and their rank pools) after :meth:`run`.

    All workers are ready at t=0; ``startup_seconds`` only delays workers added during a
    run, which an aggregated replay without scaling never does. ``bulk_decode=False`` is
    the reference mode: every pass goes through the event heap (see
    :mod:`servesim.engines.kernel.passes`). Arrivals go to the worker ``router`` picks
    (default: the role's routing section's, round-robin without one).
    """

    def __init__(
        self,
        role: RoleArgs,
        timer: StepTimer,
        workload: Workload,
        sink: Sink,
        progress: Callable[[float], None] | None,
        *,
        bulk_decode: bool = True,
        policy: Backend | None = None,
        router: Router | None = None,
    ) -> None:
        super().__init__(workload, sink, progress, bulk_decode=bulk_decode)
        self.role = role
        self.front_end = front_end(timer, ("engine", "workers", role.worker_type, "timing"))
        dp = role.attention_data
        self._workers = [
            Worker(index=w, key=w, ranks=[RankScheduler(role, timer, w * dp + r, policy)
                                          for r in range(dp)])
            for w in range(role.replicas)
        ]
        # where arrivals go: round-robin (the default) reads no worker state, so only the
        # worker it picks next need end a steady segment at the next arrival
        router = router if router is not None else make_router(role)
        self.round_robin = isinstance(router, RoundRobin)
        self.routing = RoutedPool(router, self._workers, self._touch)
        self.dirty: list[Worker] = []
        self._attach_hosts(self._workers, role)

    @property
    def workers(self) -> Sequence[Worker]:
        return self._workers

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> ReplayStats:
        self.run_loop()
        return ReplayStats(**self.totals(),
                           worker_busy_ms=tuple(w.busy_ms for w in self.workers),
                           speculation=self.speculation_report(),
                           host=self.host_report())

    # -- events ---------------------------------------------------------------------------

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, PassEnd):
            self._end_pass(item.worker)
        elif isinstance(item, Transfer):
            item.link.finish(item, self.now)
        else:
            self._arrive(item)

    def _settle(self) -> None:
        if self.dirty:
            dirty, self.dirty = self.dirty, []
            for worker in self._starters(sorted(dirty, key=_index)):
                self._start_pass(worker)

    def _wake(self, worker: Worker) -> None:
        if not worker.busy:
            self.dirty.append(worker)

    def shared_links(self) -> list[tuple[str, SharedLink]]:
        """The host links in use, each with what it is (read by the invariant auditor)."""
        return host_links(self.workers)

    def _stamp(self, seq: Seq) -> Any:
        return seq.record.token_times

    def _touch_horizon(self, worker: Worker) -> float:
        # Round-robin: the next arrival goes to its next worker; the heap may hold earlier
        # ones. A router that read the workers' state last time touches them all at the
        # next arrival (an open-loop one; a released one cuts the segment all the same);
        # one that did not touches only the worker it picks, unknown here.
        if self.round_robin:
            if worker.index != cast(RoundRobin, self.routing.router).next:
                return float("inf")
            return self._horizon()
        ahead = self._lookahead
        if not self.routing.touched or ahead is None:
            return float("inf")
        return ahead.arrival_ms

    def _arrive(self, spec: RequestSpec) -> None:
        worker = self.routing.route(spec)
        # The request only joins a waiting queue, unless its placement reads the ranks.
        self._touch(worker, reads=worker.ranks[0].least_loaded)
        rank = worker.ranks[worker.place()]
        assert isinstance(rank, RankScheduler)
        record = self._open(spec, decode_worker=worker.index, pass_ends=worker.pass_ends)
        seq = rank.new_seq(spec, record)
        rank.submit(seq)
        if not worker.busy:
            self.dirty.append(worker)

    def _start_pass(self, worker: Worker) -> None:
        """Start ``worker``'s next pass, or a segment of steady decode passes."""
        if self.bulk_decode and self._begin_segment(worker):
            return
        now = self.now
        results, duration, progressed = self._run_ranks(worker)
        if not results:
            worker.wave_step = 0  # the DP group drained: the prefill cadence restarts
            return  # nothing to do: the worker sleeps until an arrival marks it dirty
        if not progressed:
            raise self._worker_stuck(worker, "worker",
                                     ("engine", "workers", self.role.worker_type))
        self._launch(worker, results, duration)
        for res in results:
            for seq in res.rejected:
                self._terminal(seq.spec, "rejected", now)

    def _end_pass(self, worker: Worker) -> None:
        end = self.now
        # (as RankPass: the compiled build reads the fields of its results natively)
        pending = cast(list[RankPass], self._close(worker))
        # Each token list is extended by this one-entry array, in place (``+=``: no method
        # lookup; append would parse the float argument anew for every token).
        stamp = array("d", (end,))
        for res in pending:
            for seq in res.emitted:  # a speculative burst: one entry per token
                times = seq.record.token_times
                times += stamp
        for res in pending:
            for seq in res.finished:
                self._terminal(seq.spec, "completed", end)
        self.dirty.append(worker)


def replay_aggregated(
    role: RoleArgs,
    workload: Workload,
    sink: Sink,
    *,
    progress: Callable[[float], None] | None = None,
    bulk_decode: bool = True,
    timer: StepTimer | None = None,
    policy: Backend | None = None,
    router: Router | None = None,
) -> ReplayStats:
    """Replay ``workload`` on ``role.replicas`` vLLM workers; every request that arrives is
    sent to ``sink`` exactly once, when it becomes terminal (or at the end, as incomplete).

    Open-loop requests are pulled lazily from ``workload.start()``; requests released by
    ``workload.on_terminal`` join the same event queue. ``progress`` (if given) receives
    the current virtual time in ms now and then and once at the end. ``bulk_decode=False``
    steps every pass (the reference mode; same results, slower). ``timer``, ``policy`` and
    ``router`` (the role's step timer, backend policy and router) default to the
    built-ins' (the router: the role's routing section's).
    """
    run = AggregatedReplay(role, timer or make_timer(role), workload, sink, progress,
                           bulk_decode=bulk_decode, policy=policy, router=router)
    return run.run()


def _index(worker: Worker) -> int:
    return worker.index
