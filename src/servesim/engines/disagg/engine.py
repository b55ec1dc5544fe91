"""Disaggregated (prefill/decode) replay: two worker pools joined by a KV transfer.

One request's path, all in virtual milliseconds:

1. its arrival is placed on a prefill worker by the prefill role's router (round-robin by
   default; then over that worker's attention-DP ranks), which schedules a hidden copy
   with one output token like any vLLM request; decode costs nothing there, so the copy
   finishes at the end of the pass that completes its prompt, and its KV is *held* on the
   prefill rank;
2. at that pass end the decode role's router places it on a decode worker (then a rank),
   which reserves the prompt's blocks (reusing prefix blocks already resident there); a
   reservation that does not fit waits and is retried, in order, whenever that rank
   finishes a pass; a prompt the decode side can never hold is rejected there and then;
3. once reserved, the KV transfer sends ``tokens * bytes_per_token + state_bytes`` (tokens
   = full prompt or only the destination's missing tokens) over its link, whose bandwidth
   the transfers on it share (:mod:`servesim.engines.disagg.transfer`: alone it takes
   ``bytes / bandwidth``); on completion the source is released and the destination
   activated;
4. the decode rank admits the materialized request with no prefill work; its first
   decode pass emits output token 1, and it produces every output token.

SGLang hands off destination-first (spec §6): at arrival the request is placed on a decode
rank too, which reserves first; the prefill copy is queued only once the reservation
succeeded, and the transfer starts as soon as the prefill completes. A request the decode
side cannot take yet waits before its prefill, not after it.

So TTFT = prefill queueing + prefill compute + transfer + decode queueing + one decode
pass; each request's record carries the instants between them (the prefill end, the
transfer's start and end, the decode admission) for the report's TTFT breakdown. With a
state cache (required on both roles) the source also holds its working state, the
destination reserves one beside the prompt blocks, and every transfer carries
``state_bytes`` once; speculative bursts happen on the decode side only.

Every lease is released exactly once: the source at transfer completion (or at a
destination rejection), the destination when the request finishes on the decode rank (or,
destination-first, when the prefill side rejects the request).

Event order at one instant: pass completions, then transfer completions, then
arrivals; then waiting reservations are retried, then idle workers start passes. A
zero-delay transfer completes inline, at the instant its reservation succeeds.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from mypy_extensions import mypyc_attr

from servesim import backends
from servesim.backends import Backend
from servesim.engines.base import Engine, ReplayResult
from servesim.engines.disagg.ranks import DecodeRank, DestinationRejected, PrefillRank
from servesim.engines.disagg.transfer import KvLinks, transfer_bytes
from servesim.engines.kernel.host_tier import host_links
from servesim.engines.kernel.links import SharedLink, Transfer
from servesim.engines.kernel.passes import PassEnd, PassReplay, PassWorker
from servesim.engines.kernel.rank import Seq
from servesim.engines.kernel.requests import (
    RequestRecord,
    RequestSpec,
    TerminalStatus,
    Workload,
)
from servesim.engines.ranks.scheduler import RankPass, SeqState
from servesim.engines.routing.base import Router
from servesim.engines.routing.registry import make_router
from servesim.engines.routing.views import RoutedPool
from servesim.errors import ReplayError
from servesim.payload import KvTransferArgs, Payload, RoleArgs
from servesim.timing import StepTimer, make_timer
from servesim.timing.base import front_end

Sink = Callable[[RequestRecord], None]


@dataclass(frozen=True, slots=True)
class DisaggStats:
    """Run totals; per-request outcomes went to the sink."""

    end_ms: float
    passes: int  # worker passes started, both pools
    num_requests: int
    completed: int
    rejected: int
    incomplete: int
    transfers: int  # KV transfers completed
    transfer_ms: float  # sum of their durations
    prefill_busy_ms: tuple[float, ...]
    decode_busy_ms: tuple[float, ...]
    speculation: dict[str, Any] = field(default_factory=dict)  # acceptance statistics
    links: dict[str, Any] = field(default_factory=dict)  # the report's transfer figures
    host: dict[str, Any] = field(default_factory=dict)  # host (G2) tier figures, both roles

    @property
    def prefill_worker_seconds(self) -> float:
        """Provisioned prefill worker time: every worker exists from t=0 to the end."""
        return len(self.prefill_busy_ms) * self.end_ms / 1000.0

    @property
    def decode_worker_seconds(self) -> float:
        return len(self.decode_busy_ms) * self.end_ms / 1000.0


@dataclass(slots=True, eq=False, kw_only=True)
class PoolWorker(PassWorker):
    """One replica of a pool: its rank schedulers and the pass in flight."""

    pool: str  # "prefill" or "decode"
    # Zero-time cycle detection: the instant of the last zero-duration pass and the
    # worker states seen at the start of later passes at that instant.
    zero_at: float = -1.0
    seen: set[tuple[Any, ...]] = field(default_factory=set)


@dataclass(slots=True, eq=False)
class Flight:
    """One request in flight through both pools."""

    spec: RequestSpec
    record: RequestRecord  # the client-visible record, sent to the sink once
    source: SeqState  # the hidden one-token copy on the prefill rank
    prefill_worker: PoolWorker
    prefill_rank: PrefillRank
    dest: SeqState | None = None  # reserved / materialized / running on the decode rank
    decode_worker: PoolWorker | None = None
    decode_rank: DecodeRank | None = None


def _scratch(spec: RequestSpec) -> RequestRecord:
    return RequestRecord(request_id=spec.request_id, arrival_ms=spec.arrival_ms,
                         input_length=spec.input_length,
                         requested_output_length=spec.output_length, status="incomplete")


@mypyc_attr(allow_interpreted_subclasses=True)
class DisaggReplay(PassReplay[PoolWorker]):
    """One P/D run; :func:`replay_disaggregated` is the usual entry point. Keeping the
    object gives access to both pools (and their rank block pools) after :meth:`run`.
    ``bulk_decode=False`` steps every pass (see :mod:`servesim.engines.kernel.passes`)."""

    def __init__(
        self,
        prefill: RoleArgs,
        decode: RoleArgs,
        kv_transfer: KvTransferArgs | None,
        workload: Workload,
        sink: Sink,
        progress: Callable[[float], None] | None = None,
        *,
        prefill_timer: StepTimer | None = None,
        decode_timer: StepTimer | None = None,
        bulk_decode: bool = True,
        policy: Backend | None = None,
        routers: tuple[Router, Router] | None = None,
    ) -> None:
        super().__init__(workload, sink, progress, bulk_decode=bulk_decode)
        self.prefill_role = prefill
        self.decode_role = decode
        self.kv_transfer = kv_transfer
        pt = prefill_timer if prefill_timer is not None else make_timer(prefill)
        dt = decode_timer if decode_timer is not None else make_timer(decode)
        # requests enter through the prefill pool's front end
        self.front_end = front_end(pt, ("engine", "workers", prefill.worker_type, "timing"))
        pdp, ddp = prefill.attention_data, decode.attention_data
        self.prefill_workers = [
            PoolWorker(pool="prefill", index=w, key=w,
                       ranks=[PrefillRank(prefill, pt, w * pdp + r, policy)
                              for r in range(pdp)])
            for w in range(prefill.replicas)
        ]
        n = len(self.prefill_workers)
        # rank_offset (the rank's global index in its pool) seeds speculative bursts.
        self.decode_workers = [
            PoolWorker(pool="decode", index=w, key=n + w,
                       ranks=[DecodeRank(decode, dt, w * ddp + r, policy)
                              for r in range(ddp)])
            for w in range(decode.replicas)
        ]
        self.flights: dict[int, Flight] = {}
        self.retry: dict[DecodeRank, None] = {}  # decode ranks whose capacity changed
        self.dirty: dict[PoolWorker, None] = {}
        # each pool's router (the roles' routing sections' by default)
        pr, dr = routers or (make_router(prefill), make_router(decode))
        self.prefill_routing = RoutedPool(pr, self.prefill_workers, self._touch)
        self.decode_routing = RoutedPool(dr, self.decode_workers, self._touch)
        # one backend serves both pools (the payload check refuses two)
        self.destination_first = (policy or backends.policy_of(decode.backend)
                                  ).destination_first
        self.transfers = 0
        self.kv_links = KvLinks(self.events, kv_transfer)
        self._all_workers = [*self.prefill_workers, *self.decode_workers]
        self._attach_hosts(self.prefill_workers, prefill)
        self._attach_hosts(self.decode_workers, decode)

    @property
    def workers(self) -> Sequence[PoolWorker]:
        return self._all_workers

    def shared_links(self) -> list[tuple[str, SharedLink]]:
        """The KV links in use, each with what it is (read by the invariant auditor)."""
        return [*self.kv_links.labelled(), *host_links(self._all_workers)]

    def _wake(self, worker: PoolWorker) -> None:
        self.dirty[worker] = None

    # -- main loop ------------------------------------------------------------------------

    def run(self) -> DisaggStats:
        self.run_loop()
        return DisaggStats(
            **self.totals(),
            transfers=self.transfers,
            transfer_ms=sum(self.kv_links.durations),
            prefill_busy_ms=tuple(w.busy_ms for w in self.prefill_workers),
            decode_busy_ms=tuple(w.busy_ms for w in self.decode_workers),
            speculation=self.speculation_report(),
            links=self.kv_links.report(),
            host=self.host_report(),
        )

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, PassEnd):
            self._end_pass(item.worker)
        elif isinstance(item, Transfer):
            item.link.finish(item, self.now)
        else:
            self._arrive(item)

    def _settle(self) -> None:
        """After the events of an instant: retry reservations, then start idle workers."""
        while self.retry:
            retry, self.retry = self.retry, {}
            for rank in retry:
                self._reserve_pending(rank)
        if self.dirty:
            dirty, self.dirty = self.dirty, {}
            for worker in self._starters(sorted(dirty, key=lambda w: w.key)):
                self._start_pass(worker)

    # -- prefill side ---------------------------------------------------------------------

    def _arrive(self, spec: RequestSpec) -> None:
        worker = self.prefill_routing.route(spec)
        record = self._open(spec, prefill_worker=worker.index)
        rank = worker.ranks[worker.place()]
        assert isinstance(rank, PrefillRank)
        # The hidden bootstrap: the prefill worker computes the prompt and one token.
        copy = spec.evolve(output_length=1)
        source = rank.new_seq(copy, _scratch(copy))
        flight = Flight(spec=spec, record=record, source=source, prefill_worker=worker,
                        prefill_rank=rank)
        self.flights[spec.request_id] = flight
        if self.destination_first:
            self._hand_off(flight)  # the prefill is queued once the destination is reserved
        else:
            self._start_prefill(flight)

    def _start_prefill(self, flight: Flight) -> None:
        flight.prefill_rank.submit(flight.source)
        self.dirty[flight.prefill_worker] = None

    def _start_pass(self, worker: PoolWorker) -> None:
        """Start ``worker``'s next pass, or a segment of steady decode passes."""
        if self.bulk_decode and worker.pool == "decode" and not any(
                isinstance(rank, DecodeRank) and rank.handoffs for rank in worker.ranks
        ) and self._begin_segment(worker):
            # (a rank with queued handoffs retries them at every pass end)
            return
        now = self.now
        if not any(rank.has_work for rank in worker.ranks):
            worker.wave_step = 0  # the DP group drained: the prefill cadence restarts
            return  # sleeps until an arrival or a handoff marks it dirty
        if worker.zero_at == now:
            # Passes that take no time can cycle: e.g. with free prefill on the decode
            # side, a request readmitted into blocks that reservations do not hold, then
            # preempting itself for its speculative burst, forever at this instant. A
            # repeated state means only an event (a transfer completing) can change it.
            state = self._fingerprint(worker)
            if state in worker.seen:
                if self._waits_for_handoff(worker):
                    return
                raise self._pool_stuck(worker)
            worker.seen.add(state)
        results, duration, progressed = self._run_ranks(worker)
        if not progressed:
            if self._waits_for_handoff(worker):
                return  # a source release or a destination activation will wake it
            raise self._pool_stuck(worker)
        if duration == 0.0 and worker.zero_at != now:
            worker.zero_at = now
            worker.seen.clear()
        self._launch(worker, results, duration)
        for res in results:
            for seq in res.rejected:
                self._reject(self.flights[seq.spec.request_id], now)

    def _fingerprint(self, worker: PoolWorker) -> tuple[Any, ...]:
        """Everything the next pass of ``worker`` depends on (cycle detection), and the
        run's arrival, transfer and terminal counts: work the other pool hands over at the
        same instant changes the worker's state without it cycling."""
        out: list[Any] = [self.num_requests, self.transfers, self.counts["completed"],
                          self.counts["rejected"],
                          worker.wave_step % worker.ranks[0].prefill_interval]
        for rank in worker.ranks:
            out.append(tuple((s.spec.request_id, s.num_computed, s.generated, len(s.lease))
                             for s in rank.running))
            out.append(tuple((s.spec.request_id, s.num_computed, s.generated)
                             for s in rank.waiting))
            out.append((rank.pool.num_active, rank.pool.num_inactive))
            if isinstance(rank, PrefillRank):
                out.append(tuple(s.spec.request_id for s in rank.held))
            if isinstance(rank, DecodeRank):
                out.append(tuple(s.spec.request_id for s in rank.reserved))
                out.append(tuple(s.spec.request_id for s in rank.materialized))
        return tuple(out)

    def _pool_stuck(self, worker: PoolWorker) -> ReplayError:
        return self._worker_stuck(worker, f"{worker.pool} worker",
                                  ("engine", "workers", worker.pool))

    def _waits_for_handoff(self, worker: PoolWorker) -> bool:
        """Blocked on capacity that a handoff in flight will free or fill."""
        for rank in worker.ranks:
            if isinstance(rank, PrefillRank) and rank.held:
                return True
            if isinstance(rank, DecodeRank) and rank.reserved:
                return True
        return False

    def _stamp(self, seq: Seq) -> Any:
        return self.flights[seq.spec.request_id].record.token_times

    def _end_pass(self, worker: PoolWorker) -> None:
        end = self.now
        # (as RankPass: the compiled build reads the fields of its results natively)
        pending = cast(list[RankPass], self._close(worker))
        self.dirty[worker] = None
        if worker.pool == "prefill":
            # The bootstrap token is hidden; a finished copy now holds its source KV.
            for res in pending:
                for seq in res.finished:
                    flight = self.flights[seq.spec.request_id]
                    flight.record.prefill_end_ms = end
                    if self.destination_first:
                        self._start_transfer(flight)
                    else:
                        self._hand_off(flight)
            return
        # Each token list is extended by this one-entry array, in place (see the aggregated
        # engine's _end_pass).
        stamp = array("d", (end,))
        flights = self.flights
        for res in pending:
            for seq in res.emitted:  # a speculative burst: one entry per token
                times = flights[seq.spec.request_id].record.token_times
                times += stamp
        for res in pending:
            for seq in res.finished:
                self._end_flight(self.flights[seq.spec.request_id], "completed", end)
        for rank in worker.ranks:
            assert isinstance(rank, DecodeRank)
            if rank.handoffs:
                self.retry[rank] = None  # capacity may have changed

    # -- handoff --------------------------------------------------------------------------

    def _hand_off(self, flight: Flight) -> None:
        """Pick the destination and queue its reservation: when the prefill is done
        (source-first), or at arrival (destination-first)."""
        worker = self.decode_routing.route(flight.spec)
        self._touch(worker)
        rank = worker.ranks[worker.place()]
        assert isinstance(rank, DecodeRank)
        flight.decode_worker = worker
        flight.decode_rank = rank
        flight.record.decode_worker = worker.index
        flight.record.pass_ends = worker.pass_ends
        rank.handoffs.append(flight)
        self.retry[rank] = None

    def _reserve_pending(self, rank: DecodeRank) -> None:
        """Reserve queued destinations in order; the first that does not fit waits."""
        queue: list[Flight] = rank.handoffs
        done = 0
        for flight in queue:
            try:
                dest = rank.reserve_destination(flight.spec, _scratch(flight.spec))
            except DestinationRejected:
                done += 1
                self._reject(flight, self.now)
                continue
            if dest is None:
                break
            done += 1
            flight.dest = dest
            if self.destination_first:
                self._start_prefill(flight)
            else:
                self._start_transfer(flight)
        del queue[:done]

    def _start_transfer(self, flight: Flight) -> None:
        """The prefill is done and the destination reserved: move the missing KV."""
        dest, rank = flight.dest, flight.decode_rank
        assert dest is not None and rank is not None
        missing = dest.prompt_len - rank.resident_tokens(dest)
        nbytes = transfer_bytes(self.kv_transfer, dest.prompt_len, missing)
        flight.record.kv_transfer_start_ms = self.now
        assert flight.decode_worker is not None
        self.kv_links.start(self.now, flight.spec.request_id,
                            (flight.prefill_worker.index, flight.decode_worker.index), nbytes,
                            lambda: self._complete_transfer(flight))

    def _complete_transfer(self, flight: Flight) -> None:
        assert flight.dest is not None and flight.decode_rank is not None
        assert flight.decode_worker is not None
        self.transfers += 1
        flight.record.kv_transfer_end_ms = self.now
        released = flight.prefill_rank.release_source(flight.source)
        assert released, "a source was released twice"
        self.dirty[flight.prefill_worker] = None
        self._touch(flight.decode_worker)
        flight.decode_rank.activate_destination(flight.dest)
        self.dirty[flight.decode_worker] = None

    # -- terminal states ------------------------------------------------------------------

    def _reject(self, flight: Flight, time_ms: float) -> None:
        if flight.prefill_rank.release_source(flight.source):
            self.dirty[flight.prefill_worker] = None
        rank = flight.decode_rank
        if flight.dest is not None and rank is not None and flight.dest in rank.reserved:
            # destination-first: the prefill side rejected a request reserved downstream
            rank.cancel_destination(flight.dest)
            self.retry[rank] = None
            # the freed blocks may let its waiting requests run: a worker that found no
            # room sleeps until something marks it dirty
            assert flight.decode_worker is not None
            self.dirty[flight.decode_worker] = None
        self._end_flight(flight, "rejected", time_ms)

    def _end_flight(self, flight: Flight, status: TerminalStatus, time_ms: float) -> None:
        self._merge(flight)
        del self.flights[flight.spec.request_id]
        self._terminal(flight.spec, status, time_ms)

    @staticmethod
    def _merge(flight: Flight) -> None:
        """Admission figures come from the prefill side (where prompt tokens are computed
        or reused), the decode admission from the destination; preemptions from both."""
        record, src = flight.record, flight.source.record
        record.first_admit_ms = src.first_admit_ms
        record.first_admission_reused_tokens = src.first_admission_reused_tokens
        record.reused_input_tokens = src.reused_input_tokens
        record.num_preemptions = src.num_preemptions
        if flight.dest is not None:
            record.num_preemptions += flight.dest.record.num_preemptions
            record.decode_admit_ms = flight.dest.record.first_admit_ms

    def _flush_incomplete(self) -> None:
        for flight in self.flights.values():
            self._merge(flight)
        self.flights.clear()
        super()._flush_incomplete()


def replay_disaggregated(
    prefill: RoleArgs,
    decode: RoleArgs,
    kv_transfer: KvTransferArgs | None,
    workload: Workload,
    sink: Sink,
    *,
    progress: Callable[[float], None] | None = None,
    bulk_decode: bool = True,
    timers: tuple[StepTimer, StepTimer] | None = None,
    policy: Backend | None = None,
    routers: tuple[Router, Router] | None = None,
) -> DisaggStats:
    """Replay ``workload`` on a prefill pool and a decode pool; every request that arrives
    is sent to ``sink`` exactly once, when it becomes terminal (or at the end, as
    incomplete). ``progress`` (if given) receives the virtual time now and then;
    ``timers`` (prefill's, decode's), ``policy`` (the backend's) and ``routers``
    (prefill's, decode's) default to the built-ins'."""
    pt, dt = timers or (None, None)
    return DisaggReplay(prefill, decode, kv_transfer, workload, sink, progress,
                        prefill_timer=pt, decode_timer=dt, bulk_decode=bulk_decode,
                        policy=policy, routers=routers).run()


def replay_payload_roles(payload: Payload, workload: Workload, sink: Sink, *,
                         progress: Callable[[float], None] | None = None,
                         bulk_decode: bool = True,
                         engine: Engine | None = None) -> ReplayResult:
    """The built-in ``disagg`` engine's replay of a checked payload.

    The report gains ``prefill_worker_seconds`` and ``decode_worker_seconds`` (every worker
    of a pool is provisioned from t=0 to the end of the run); GPU-seconds per role are
    those times the GPUs per worker of the role, so ``gpu_hours`` =
    (prefill_worker_s * prefill GPUs/worker + decode_worker_s * decode GPUs/worker) / 3600.
    """
    prefill, decode = payload.roles["prefill"], payload.roles["decode"]
    # the engine's timing providers and backends (the built-ins without one)
    timers = (engine.timer(prefill), engine.timer(decode)) if engine is not None else None
    routers = (engine.router(prefill), engine.router(decode)) if engine is not None else None
    stats = replay_disaggregated(prefill, decode, payload.kv_transfer, workload, sink,
                                 progress=progress, bulk_decode=bulk_decode, timers=timers,
                                 routers=routers,
                                 policy=engine.backend(decode) if engine is not None else None)
    p_s, d_s = stats.prefill_worker_seconds, stats.decode_worker_seconds
    return ReplayResult(
        end_ms=stats.end_ms,
        gpu_seconds={"prefill": p_s * prefill.gpus_per_worker,
                     "decode": d_s * decode.gpus_per_worker},
        passes=stats.passes,
        extra={"prefill_worker_seconds": p_s, "decode_worker_seconds": d_s,
               **stats.links, **stats.speculation, **stats.host},
    )
