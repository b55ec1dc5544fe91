"""The pass-worker layer: workers of rank schedulers running passes and steady segments.

A worker is ``attention_data`` rank schedulers (:class:`~servesim.engines.kernel.rank.Rank`)
running passes in lockstep; :class:`PassReplay` runs one pass of a worker
(:meth:`PassReplay._run_ranks`: TensorRT-LLM's attention-DP balance, group prefill
pricing), puts it in flight (:meth:`PassReplay._launch`) and closes it when its end event
fires (:meth:`PassReplay._close`); :meth:`PassWorker.place` picks the rank of a new
request (round-robin or least-loaded). The built-in engines subclass :class:`PassReplay`.

**Bulk advance of steady decode.** Between events that change a batch (an arrival, a
prefill chunk, a completion, a block allocation that could fail or preempt), the passes of
a worker are homogeneous decode steps: every request emits one token, the batch and its
KV grow by one token per request and step. When a worker's next passes are steady,
:meth:`PassReplay._begin_segment` plans them as one *segment*: step times come from the
timer at each step's closed-form KV token count, summed in the same order as the stepwise
loop would (so the floats are the same), and a single event at the last end closes the
segment, applying its passes at once (token timestamps appended as one array per request;
block allocations at crossings and publications of completed blocks in stepwise order).

Segments are per worker: passes of other workers do not touch it, so they do not cut it.
An event that reads or changes a worker's ranks (an arrival placed on it, a P/D handoff or
KV transfer to it) first calls :meth:`PassReplay._touch`, which applies the segment's
passes the stepwise loop has closed by then and turns the one in flight into an ordinary
pass. The reference mode (``bulk_decode=False``) steps every pass through the event heap;
differential tests assert both give identical records and reports.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from mypy_extensions import mypyc_attr

from servesim import codes
from servesim.engines.kernel.audit import guard_replay
from servesim.engines.kernel.core import LATER_ROUND, Guard, Sink
from servesim.engines.kernel.events import PHASE_ENGINE
from servesim.engines.kernel.host_tier import HostTier, host_report
from servesim.engines.kernel.pass_ends import PassEnds
from servesim.engines.kernel.rank import Rank, RankResult, Seq
from servesim.engines.kernel.replay import Replay
from servesim.engines.kernel.requests import Workload
from servesim.engines.kernel.speculation import acceptance_report
from servesim.errors import Diagnostic, ReplayError
from servesim.payload import RoleArgs
from servesim.timing.base import StepTimer


@dataclass(slots=True, eq=False, init=False)
class Segment:
    """Steady decode passes of one worker, planned when they start and applied when the
    last one ends (or cut short when something touches the worker). ``__init__`` is
    written out so that the compiled build runs it natively."""

    ranks: list[Rank]  # the ranks with work, each running one token per request
    ends: array  # end time of every pass, in order
    waiting: list[bool]  # per rank: a request was waiting when the segment started

    def __init__(self, ranks: list[Rank], ends: array, waiting: list[bool]) -> None:
        self.ranks = ranks
        self.ends = ends
        self.waiting = waiting


@dataclass(slots=True, eq=False, kw_only=True)
class PassWorker:
    """One replica: its rank schedulers and the pass in flight."""

    index: int  # within its pool
    key: int  # event tie-break id, unique across the run
    ranks: list[Rank]
    next_rank: int = 0
    wave_step: int = 0  # passes since the worker's DP group last drained
    # attention-DP balance (TensorRT-LLM): passes spent waiting for every rank to have
    # prompt work, and passes spent batching once they all have
    balance_wait: int = 0
    balance_batch: int = 0
    busy: bool = False
    pass_start: float = 0.0
    pending: list[RankResult] = field(default_factory=list)
    busy_ms: float = 0.0
    segment: Segment | None = None  # steady decode passes in flight instead of one pass
    # the end time of every pass closed so far, in order (RequestRecord.pass_ends)
    pass_ends: PassEnds = field(default_factory=PassEnds)
    end_entry: Any = None  # the heap entry of the end of the pass or segment in flight

    def place(self) -> int:
        """The rank a new request joins: round-robin over this worker's ranks, or under
        least-loaded placement the rank with the fewest requests (the first of them)."""
        ranks = self.ranks
        if ranks[0].least_loaded:
            best, fewest = 0, ranks[0].load
            for i in range(1, len(ranks)):
                n = ranks[i].load
                if n < fewest:
                    best, fewest = i, n
            return best
        rank = self.next_rank
        self.next_rank = (rank + 1) % len(self.ranks)
        return rank


W = TypeVar("W", bound=PassWorker)
# A rank's steady decode steps: its timer, KV capacity (tokens), batch, active KV tokens.
StepPlan = tuple[StepTimer, int, int, int]
_FIRST_STEPS = 8  # passes priced in the first chunk of a segment (then twice as many)


class PassEnd(Generic[W]):
    """The event ending a worker's pass or segment. A plain class: mypyc cannot compile a
    generic dataclass."""

    __slots__ = ("worker",)

    def __init__(self, worker: W) -> None:
        self.worker = worker


@mypyc_attr(allow_interpreted_subclasses=True)  # engines, ours and plugins', subclass it
class PassReplay(Replay, Generic[W]):
    """A run whose workers run passes of rank schedulers (see the module docstring)."""

    def __init__(self, workload: Workload, sink: Sink,
                 progress: Callable[[float], None] | None, *, bulk_decode: bool = True) -> None:
        super().__init__(workload, sink, progress)
        self.bulk_decode = bulk_decode
        self.bulk_passes = 0  # of the passes, those applied by the bulk advance

    @property
    def workers(self) -> Sequence[W]:
        raise NotImplementedError

    def _guard(self) -> Guard:
        return guard_replay(self)  # watchdog; invariant auditor when enabled

    def host_report(self) -> dict[str, Any]:
        """The run's host (G2) tier figures ({} without a host tier)."""
        return host_report(self.host_tiers())

    def host_tiers(self) -> list[HostTier]:
        """The host tiers of every rank that has one."""
        tiers = (getattr(rank, "host", None) for worker in self.workers
                 for rank in worker.ranks)
        return [tier for tier in tiers if tier is not None]

    def _attach_hosts(self, workers: Sequence[W], role: RoleArgs) -> None:
        """Give every rank of ``workers`` (with ``attach_host``) the host tier ``role``
        configures, if any."""
        if role.host_offload is None:
            return
        for worker in workers:
            for rank in worker.ranks:
                attach = getattr(rank, "attach_host", None)
                if attach is not None:
                    attach(HostTier.of_role(role, self.events, self._clock,
                                            partial(self._host_loaded, worker)))

    def _clock(self) -> float:
        return self.now

    def _host_loaded(self, worker: W) -> None:
        """A host-tier load of one of ``worker``'s ranks completed: a request rejoins a
        queue (after this call). The worker is brought to now first, so that the pass in
        flight, planned without it, cannot be re-run with it."""
        self._touch(worker)
        self._wake(worker)

    def _wake(self, worker: W) -> None:
        """``worker``'s queues changed: start it when the instant settles, if idle."""
        raise NotImplementedError

    def speculation_report(self) -> dict[str, Any]:
        """The run's speculative-decoding acceptance statistics ({} without)."""
        return acceptance_report(getattr(rank, "sampler", None)
                                 for worker in self.workers for rank in worker.ranks)

    # -- worker passes ----------------------------------------------------------------------

    def _run_ranks(self, worker: W) -> tuple[list[RankResult], float, bool]:
        """One pass of every rank with work: results, the worker's duration (its slowest
        rank), whether anything progressed."""
        now = self.now
        results: list[RankResult] = []
        ran: list[Rank] = []
        duration = 0.0
        progressed = False
        dp_size = len(worker.ranks)
        hold = worker.ranks[0].balance is not None and _hold_prompts(worker)
        for rank in worker.ranks:
            if not rank.has_work:
                continue
            res = rank.execute_pass(now, worker.wave_step, dp_size, hold)
            results.append(res)
            ran.append(rank)
            progressed = progressed or res.progressed
            d = res.duration_ms
            if d > duration:
                duration = d
        if len(results) > 1:
            duration = self._price_group_prefill(ran, results, duration)
        return results, duration, progressed

    @staticmethod
    def _price_group_prefill(ranks: list[Rank], results: list[RankResult],
                             duration: float) -> float:
        """Re-price the prefill halves of a pass in which several attention-DP ranks
        computed prompt tokens, with all of them (the timers' ``prefill_group_ms``: their
        experts see every rank's tokens); the worker's duration."""
        group = sum(res.prefill_tokens for res in results)
        if not any(0 < res.prefill_tokens < group for res in results):
            return duration  # at most one rank prefilled: its own price holds
        duration = 0.0
        for r in range(len(ranks)):  # (by index, as in _apply_segment)
            rank, res = ranks[r], results[r]
            price = getattr(rank.timer, "prefill_group_ms", None)
            if price is not None and res.prefill_args is not None:
                res.prefill_ms = price(*res.prefill_args, group)
            d = res.duration_ms
            if d > duration:
                duration = d
        return duration

    def _launch(self, worker: W, results: list[RankResult], duration: float) -> None:
        self.passes += 1
        worker.wave_step += 1
        worker.busy = True
        worker.pass_start = self.now
        worker.pending = results
        worker.end_entry = self.events.push(self.now + duration, PHASE_ENGINE, worker.key,
                                            PassEnd(worker))

    def _close(self, worker: W) -> list[RankResult]:
        """The pass of ``worker`` ended at ``self.now``: its results. A segment's passes
        are applied here (tokens stamped); its results hold only what its last pass
        finished."""
        if worker.segment is not None:
            finished = self._apply_segment(worker, len(worker.segment.ends))
            worker.busy = False
            self._raise_floor(worker.pass_ends)
            return finished
        worker.busy = False
        worker.busy_ms += self.now - worker.pass_start
        worker.pass_ends.append(self.now)
        self._raise_floor(worker.pass_ends)
        pending, worker.pending = worker.pending, []
        return pending

    def _raise_floor(self, ends: PassEnds) -> None:
        """No request in flight or to come has a token before the oldest one's arrival
        (records open in arrival order): the floor of ``ends`` (see PassEnds)."""
        for record in self.live.values():
            ends.floor = record.arrival_ms
            return
        ends.floor = self.now

    @staticmethod
    def _starters(dirty: Sequence[W]) -> list[W]:
        """Idle workers among ``dirty``, once each, in order."""
        return [w for w in dict.fromkeys(dirty) if not w.busy]

    # -- bulk advance -----------------------------------------------------------------------

    def _stamp(self, seq: Seq) -> array:
        """The token timestamps of ``seq``'s client-visible record."""
        raise NotImplementedError

    def _touch_horizon(self, worker: W) -> float:
        """A guess of when something next touches ``worker`` (+inf: no idea). Only the
        length of the segments planned depends on it, never the results."""
        return float("inf")

    def _begin_segment(self, worker: W) -> bool:
        """Start a segment of steady decode passes of ``worker`` if its next passes are
        steady (see the module docstring); False when the next pass is an ordinary one.

        Each pass ``j`` would start at the previous end, emit one token per request and
        end at ``t_j = t_{j-1} + duration_j``, its duration that of the slowest rank; the
        segment keeps the passes its ranks allow (up to the first completion, block
        crossings that cannot fail), that end by the cutoff and start before
        :meth:`_touch_horizon`. One event at the last end closes the segment
        (:meth:`_close`).
        """
        ranks: list[Rank] = []
        plans: list[StepPlan] = []
        steps = -1
        for rank in worker.ranks:
            if not rank.has_work:
                continue  # stays idle: anything that would give it work touches the worker
            plan = rank.steady_plan()
            if plan is None:
                return False
            k, n, active = plan
            ranks.append(rank)
            plans.append((rank.timer, rank.total_kv_tokens, n, active))
            steps = k if steps < 0 else min(steps, k)
        if not plans:
            return False
        horizon = self._touch_horizon(worker)
        cutoff = self.workload.max_time_ms
        if cutoff is None:
            cutoff = float("inf")
        times: list[float] = []
        t = self.now
        j, chunk, more = 0, _FIRST_STEPS, True
        while more and j < steps:  # priced a growing chunk at a time: few passes fit often
            count = min(chunk, steps - j)
            for duration in _steady_passes_ms(plans, j, count):
                if duration <= 0.0:
                    more = False
                    break
                end = t + duration
                if end > cutoff:
                    more = False
                    break
                times.append(end)
                t = end
                if end >= horizon:
                    more = False  # the pass in flight when the worker is touched
                    break
            j += count
            chunk *= 2
        k = len(times)
        for rank in ranks:
            if k:
                k = rank.steady_block_limit(k)
        if not k:
            return False
        ends = array("d", times[:k])
        worker.segment = Segment(ranks, ends, [bool(rank.waiting) for rank in ranks])
        worker.busy = True
        worker.pass_start = self.now
        worker.end_entry = self.events.push(ends[-1], PHASE_ENGINE, worker.key, PassEnd(worker))
        return True

    def _apply_segment(self, worker: W, steps: int) -> list[RankResult]:
        """Apply the first ``steps`` passes of ``worker``'s segment and drop the rest; the
        requests the last of them finished, per rank (as a pass's results)."""
        segment = worker.segment
        assert segment is not None
        worker.segment = None
        ends = segment.ends
        if steps < len(ends):
            ends = ends[:steps]
        finished: list[RankResult] = []
        if not steps:
            return finished
        dp_size = len(worker.ranks)
        # (by index: zip(..., strict=True) is a call through the builtins when compiled)
        for r in range(len(segment.ranks)):
            rank, waiting = segment.ranks[r], segment.waiting[r]
            for seq in rank.running:
                times = self._stamp(seq)
                times += ends  # in place, without a method lookup per request
            done = rank.advance_steady(steps, worker.wave_step, dp_size, waiting)
            if done is not None:
                finished.append(done)
        worker.pass_ends.extend(ends)
        busy = worker.busy_ms
        start = worker.pass_start
        end_times: list[float] = ends.tolist()  # (floats: the compiled loop adds them natively)
        for end in end_times:
            busy += end - start
            start = end
        worker.busy_ms = busy
        worker.pass_start = start
        worker.wave_step += steps
        balance = worker.ranks[0].balance
        if balance is not None:
            # Each steady pass leaves a rank without prompt work: the wait counter runs
            # on, restarting at the timeout; an idle rank (no decodes) resets it.
            timeout = balance[0]
            full = len(segment.ranks) == len(worker.ranks)
            worker.balance_wait = (worker.balance_wait + steps) % timeout if (
                full and timeout) else 0
        self.passes += steps
        self.bulk_passes += steps
        return finished

    def _touch(self, worker: W, *, reads: bool = True) -> None:
        """Bring ``worker`` to where the stepwise replay has it now, before the current
        event changes its ranks (and, with ``reads``, reads them): the passes of its
        segment that the stepwise loop closed by now are applied and the one in flight
        becomes an ordinary pass. Without ``reads`` (an arrival joining a queue) the
        segment only ends with the pass in flight, so it is not applied yet.

        A pass ending exactly now: in the first round of events at this instant, the
        stepwise loop closed it if its end event orders before the current event (and
        starts the next pass when the round settles); in a later round at the same instant
        it was closed and the next pass started in the first round.
        """
        segment = worker.segment
        if segment is None:
            return
        now, ends, order = self.now, segment.ends, self.event_order
        if order > (PHASE_ENGINE, worker.key):
            m = bisect_right(ends, now)
            if m and ends[m - 1] == now and order != LATER_ROUND:
                # the stepwise loop ended a pass of this worker in this round already, and
                # starts the next one when the round settles
                self.events.cancel(worker.end_entry)
                del ends[m:]
                self._dispatch(PassEnd(worker))
                return
        else:
            m = bisect_left(ends, now)
        if not reads:
            if m + 1 < len(ends):
                self.events.cancel(worker.end_entry)
                del ends[m + 1:]
                worker.end_entry = self.events.push(ends[m], PHASE_ENGINE, worker.key,
                                                    PassEnd(worker))
            return
        self.events.cancel(worker.end_entry)
        finished = self._apply_segment(worker, m)
        assert not finished, "a segment finished requests before its last pass"
        self.now = worker.pass_start  # the pass in flight started at the previous end
        results, duration, _ = self._run_ranks(worker)
        self._launch(worker, results, duration)
        self.now = now
        assert worker.pass_start + duration == ends[m], "a cut segment changed its timing"

    def _worker_stuck(self, worker: W, name: str, path: tuple[str, ...]) -> ReplayError:
        heads = [r.waiting[0].spec.request_id for r in worker.ranks if r.waiting]
        return self._stuck_error(f"{name} {worker.index}", heads, path)


def _hold_prompts(worker: PassWorker) -> bool:
    """TensorRT-LLM's attention-DP balance (``attention_dp_config.enable_balance``), run
    before each pass of a worker with work: whether its ranks hold their prompt work this
    pass (decodes go on). Prompts run when every rank has some and a free sequence slot,
    after ``batching_wait_iters`` passes in which they wait for more (only while every
    rank is decoding); otherwise they wait, at most ``timeout_iters`` passes, and not at
    all while some rank has nothing to decode."""
    if not any(rank.has_work for rank in worker.ranks):
        return False
    balance = worker.ranks[0].balance
    assert balance is not None
    timeout, wait = balance
    every_prompt = every_decode = every_free = True
    for rank in worker.ranks:
        prompt_work, decoding = rank.balance_load()
        every_prompt = every_prompt and prompt_work
        every_decode = every_decode and decoding > 0
        every_free = every_free and decoding < rank.max_sequences
    if every_prompt and every_free:
        worker.balance_wait = 0
        if every_decode:
            if worker.balance_batch < wait:
                worker.balance_batch += 1
                return True
            worker.balance_batch = 0
        return False
    worker.balance_wait += 1
    if worker.balance_wait >= timeout or not every_decode:
        worker.balance_wait = 0
        return False
    return True


def _steady_passes_ms(plans: list[StepPlan], first: int, count: int) -> list[float]:
    """Durations of passes ``first .. first + count - 1`` of a steady segment planned as
    ``plans`` (per rank: timer, KV capacity, batch, active KV tokens at the start): each
    its slowest rank's decode step (no prefill half)."""
    if len(plans) == 1:
        return _rank_passes_ms(plans[0], first, count)
    out = [0.0] * count
    for plan in plans:
        for i, d in enumerate(_rank_passes_ms(plan, first, count)):
            if d > out[i]:
                out[i] = d
    return out


def _rank_passes_ms(plan: StepPlan, first: int, count: int) -> list[float]:
    """One rank's decode steps of passes ``first .. first + count - 1`` of its steady
    segment: from the timer's ``decode_steps_ms`` in one call where it has one, else a
    ``decode_ms`` call per pass (``StepTimer``). A series that is not a list of ``count``
    durations is the timer's error."""
    timer, total, n, active = plan
    start = active + n * first
    series = getattr(timer, "decode_steps_ms", None)
    if series is not None:
        steps = series(n, start, total, count)
        if not isinstance(steps, list) or len(steps) != count:
            got = f"{len(steps)} values" if isinstance(steps, list) else repr(steps)[:60]
            raise ReplayError([Diagnostic(
                code=codes.TIMING_INVALID,
                message=f"the timer's decode_steps_ms({n}, {start}, {total}, {count}) "
                        f"returned {got}; it must return a list of {count} durations, one "
                        "per pass")])
        return [0.0 + d for d in steps]
    out: list[float] = []
    for j in range(count):
        a = start + n * j
        out.append(0.0 + timer.decode_ms(n, a, a // n, total))
    return out
