"""Run-time guards of a replay loop: an invariant auditor and a progress watchdog.

A replay loop calls :func:`guard_replay` once when it starts, :meth:`ReplayGuard.instant`
after a loop iteration (the events of an instant processed and idle workers started on
their passes: every iteration while auditing, else each later round of events at one
instant) and :meth:`ReplayGuard.finish` once after flushing incomplete requests.
Everything here only *reads* scheduler and pool state.

* The **watchdog** is always on and costs nothing while virtual time advances: after
  :data:`WATCHDOG_ITERATIONS` consecutive iterations at one instant it fingerprints the
  scheduler state of every rank and runs Brent's cycle detection on the fingerprints
  (O(1) memory). A repeated state at a frozen clock is a replay that would never end;
  it raises a ``replay-stuck`` :class:`~servesim.errors.ReplayError` naming the requests
  involved.
* The **auditor** is opt-in (``servesim replay --check-invariants``, the
  :func:`check_invariants` context manager, or ``SERVESIM_CHECK_INVARIANTS=1`` in the
  environment; the test suite turns it on). At every instant it checks, for every rank:
  block reference counts equal the leases the rank's requests hold, pool totals add up,
  no request sits in two queues or on two ranks of a pool, queue membership matches the
  request status, and every live request is somewhere; a rank's host (G2) tier holds no
  more blocks than its capacity, as disjoint runs each listed once in its LRU; for every
  link in use (a P/D run's KV links, a rank's host link,
  :mod:`servesim.engines.kernel.links`): its bytes are conserved (started = sent + those
  of its active transfers, each with between 0 and all of its bytes left, for a live
  request or a write-back), and since the last instant it moved exactly its bandwidth's worth
  while busy (never more); for the run: virtual time never goes back and every request
  reaches the sink exactly once with a consistent record.
  A violation raises a ReplayError with code ``invariant-violated`` naming the
  invariant, the rank and the request.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any

from servesim import codes
from servesim.engines.kernel.blocks import BlockPool
from servesim.engines.kernel.host_tier import WRITE_BACK_KEY
from servesim.engines.kernel.links import SharedLink
from servesim.engines.kernel.rank import FINISHED, RUNNING, WAITING
from servesim.engines.kernel.requests import RequestRecord
from servesim.errors import Diagnostic, ReplayError

ENV_VAR = "SERVESIM_CHECK_INVARIANTS"
# Iterations at one virtual instant before the watchdog starts fingerprinting.
WATCHDOG_ITERATIONS = 64

_enabled: ContextVar[bool | None] = ContextVar("servesim_check_invariants", default=None)


def invariant_checks_enabled() -> bool:
    """On inside :func:`check_invariants`, else when ``SERVESIM_CHECK_INVARIANTS`` is set
    to anything but ``""``/``"0"``."""
    value = _enabled.get()
    if value is None:
        return os.environ.get(ENV_VAR, "") not in ("", "0")
    return value


@contextlib.contextmanager
def check_invariants(on: bool = True) -> Iterator[None]:
    """Run the replays started inside the block with (or without) the auditor."""
    token = _enabled.set(on)
    try:
        yield
    finally:
        _enabled.reset(token)


def violation(invariant: str, where: str, detail: str, request: int | None = None
              ) -> ReplayError:
    """The ``invariant-violated`` error: which invariant, where, which request."""
    who = f"request {request}: " if request is not None else ""
    return ReplayError([Diagnostic(
        code=codes.INVARIANT_VIOLATED,
        message=f"invariant '{invariant}' violated on {where}: {who}{detail}",
        hint="this is a bug in servesim (or in a plugin engine), not in the input; "
             "please report it with the config and trace")])


# -- views of a pass-worker run (servesim.engines.kernel.passes) ---------------------------

RankEntry = tuple[str, Any, str, bool]  # (label, rank, pool name, audit it)


def _ranks(replay: Any, now: float | None = None) -> list[RankEntry]:
    """Every rank; ``touched`` when its worker started a pass at ``now`` (or ``now`` is
    None): a pass start is where a rank's state changes, so auditing there sees each
    change of every rank once it is used again, at O(changed ranks) per instant."""
    out: list[RankEntry] = []
    for worker in replay.workers:
        pool = getattr(worker, "pool", "aggregated")
        prefix = f"worker {worker.index}" if pool == "aggregated" \
            else f"{pool} worker {worker.index}"
        touched = now is None or (worker.busy and worker.pass_start == now)
        for r, rank in enumerate(worker.ranks):
            out.append((f"{prefix} rank {r}", rank, pool, touched))
    return out


def _queued_ids(rank: Any) -> dict[int, str]:
    return {seq.spec.request_id: queue for queue, members, _ in _queues(rank)
            for seq in members}


def _live_ids(replay: Any) -> set[int]:
    return set(replay.live)


def _in_passes(replay: Any) -> set[int]:
    """Requests finished by a pass that has not ended yet (terminal at its end)."""
    out: set[int] = set()
    for worker in replay.workers:
        for res in worker.pending:
            out.update(s.spec.request_id for s in res.finished)
    return out


def _in_handoff(replay: Any) -> set[int]:
    """Requests handed to a P/D decode rank, queued there to reserve a destination."""
    return {f.spec.request_id for worker in replay.workers for rank in worker.ranks
            for f in getattr(rank, "handoffs", ())}


def _queues(rank: Any) -> list[tuple[str, Iterable[Any], int | None]]:
    """(name, members, required status) of every queue of a rank."""
    out: list[tuple[str, Iterable[Any], int | None]] = [
        ("waiting", rank.waiting, WAITING), ("running", rank.running, RUNNING)]
    if hasattr(rank, "held"):
        out.append(("held", rank.held, FINISHED))
    if hasattr(rank, "reserved"):
        out.append(("reserved", rank.reserved, None))
        out.append(("materialized", rank.materialized, WAITING))
    if getattr(rank, "loading", None):
        out.append(("loading", rank.loading, None))
    return out


def _holdings(seq: Any) -> Iterator[tuple[str, list[int]]]:
    yield "lease", seq.lease.blocks()
    rs = seq.state
    if rs is not None:
        yield "working state", rs.working.blocks()
        for ck in rs.retained:
            if ck.held:
                yield f"checkpoint at {ck.boundary}", ck.blocks.blocks()


def audit_pool(pool: BlockPool, where: str) -> None:
    """The pool's own bookkeeping: totals, reference counts, LRU, prefix index."""
    for invariant, detail in pool.problems():
        raise violation(invariant, where, detail)


def audit_rank(rank: Any, where: str, live: set[int] | None = None) -> dict[int, str]:
    """One rank: queues, statuses, holdings vs reference counts. Returns the queued
    request ids (request id -> queue name)."""
    audit_pool(rank.pool, where)
    host = getattr(rank, "host", None)
    if host is not None:
        for invariant, detail in host.pool.problems():
            raise violation(invariant, where, detail)
    located: dict[int, str] = {}
    seen: dict[int, str] = {}  # id(seq) -> queue
    expected: Counter[int] = Counter()
    holders: dict[int, int] = {}
    bs = rank.block_size
    queues = _queues(rank)
    for queue, members, _ in queues:
        for seq in members:
            rid = seq.spec.request_id
            if id(seq) in seen or rid in located:
                other = seen.get(id(seq)) or located[rid]
                raise violation("one-queue", where, f"in both the {other} and the {queue} "
                                "queue", rid)
            seen[id(seq)] = located[rid] = queue
    for queue, members, status in queues:
        for seq in members:
            rid = seq.spec.request_id
            if live is not None and rid not in live:
                raise violation("terminal-once", where, f"still in the {queue} queue but no "
                                "longer live (already terminal, or never arrived)", rid)
            if status is not None and seq.status != status:
                raise violation("queue-status", where, f"in the {queue} queue with status "
                                f"{seq.status}", rid)
            if not 0 <= seq.num_computed <= seq.prompt_len + seq.generated:
                raise violation("sequence-bounds", where, f"{seq.num_computed} tokens "
                                f"computed of a {seq.prompt_len + seq.generated}-token "
                                "sequence", rid)
            holds = queue != "waiting"
            if holds and seq.generated and seq.prompt_len + seq.generated > seq.stop_len:
                raise violation("sequence-bounds", where, f"generated past its stop length "
                                f"({seq.prompt_len + seq.generated} > {seq.stop_len})", rid)
            for what, blocks in _holdings(seq):
                if blocks and not holds:
                    raise violation("block-refcount", where, f"waiting but holds {len(blocks)} "
                                    f"blocks ({what})", rid)
                for b in blocks:
                    expected[b] += 1
                    holders.setdefault(b, rid)
            if holds and queue == "running" and seq.num_computed > len(seq.lease) * bs:
                raise violation("block-refcount", where, f"{seq.num_computed} tokens computed "
                                f"in a lease of {len(seq.lease)} blocks", rid)
    actual = rank.pool.references()
    if expected != Counter(actual):
        for b in sorted(set(expected) | set(actual)):
            if expected.get(b, 0) != actual.get(b, 0):
                rid = holders.get(b)
                raise violation("block-refcount", where, f"block {b} has {actual.get(b, 0)} "
                                f"references, the requests on the rank hold {expected.get(b, 0)}",
                                rid)
    return located


def _links(replay: Any) -> list[tuple[str, SharedLink]]:
    """The links in use (``shared_links()`` of a replay that has links), with labels."""
    shared = getattr(replay, "shared_links", None)
    return shared() if shared is not None else []


# The rounding a link's byte counts may carry, relative to the bytes it started; its
# event times are rounded to the clock's last place too (a few units of it at the rate).
LINK_ROUNDING = 1e-9

# A link as the auditor saw it at the last instant: (link, then, bytes moved, busy).
LinkSeen = tuple[SharedLink, float, float, bool]


def audit_link(link: SharedLink, where: str, now: float, live: set[int],
               before: LinkSeen | None) -> LinkSeen:
    """One link at ``now``: bytes conserved, every active transfer part-sent and live, and
    the bytes moved since ``before`` (the same link at the last instant) equal to the
    bandwidth's worth if it was busy then, never more. Returns what it saw."""
    in_flight = 0
    rate = link.bandwidth * 1e6  # bytes per ms
    slack = LINK_ROUNDING * max(link.started, 1) + 4 * math.ulp(now) * rate
    level = link.level_at(now)
    for t in link.active:
        left = t.tag - level
        if not -slack <= left <= t.nbytes + slack or t.entry is None:
            raise violation("link-bytes", where, f"{left} of {t.nbytes} bytes left"
                            f"{'' if t.entry is not None else ', with no completion event'}",
                            t.key)
        if t.key not in live and t.key != WRITE_BACK_KEY:
            raise violation("link-bytes", where, "a transfer for a request no longer live",
                            t.key)
        in_flight += t.nbytes
    if link.started != link.sent + in_flight:
        raise violation("link-bytes", where, f"{link.started} bytes started, {link.sent} "
                        f"sent and {in_flight} in flight")
    moved = link.moved(now)
    if before is not None:
        _, then, moved_then, busy = before
        capacity = (now - then) * rate
        delta = moved - moved_then
        if delta > capacity + slack or (busy and delta < capacity - slack):
            raise violation("link-bandwidth", where, f"{delta:.17g} bytes moved in "
                            f"{now - then:.17g} ms at {link.bandwidth:g} GB/s "
                            f"({capacity:.17g} bytes{' while busy' if busy else ' at most'})")
    return link, now, moved, bool(link.active)


class ReplayGuard:
    """Watchdog (always) and auditor (when enabled) of one replay loop object."""

    def __init__(self, replay: Any, audit: bool) -> None:
        self.replay = replay
        self.audit = audit
        self.every_instant = audit
        self.last_now = float("-inf")
        self.same = 0  # consecutive iterations at last_now
        self._saved: tuple[Any, ...] | None = None
        self._power = 1
        self._lam = 0
        self.terminal: set[int] = set()
        self.links: dict[int, LinkSeen] = {}  # the links in use at the last instant, by id
        if audit:
            inner: Callable[[RequestRecord], None] = replay.sink
            replay.sink = lambda record: self._sink(inner, record)

    # -- hooks called by the loop --------------------------------------------------------

    def instant(self, now: float) -> None:
        if now < self.last_now:
            raise violation("monotonic-time", "the event loop",
                            f"virtual time went back from {self.last_now} to {now} ms")
        if now == self.last_now:
            self.same += 1
            if self.same >= WATCHDOG_ITERATIONS:
                self._watch(now)
        else:
            self.last_now, self.same = now, 0
            self._saved, self._power, self._lam = None, 1, 0
        if self.audit:
            self.check(now)

    def finish(self) -> None:
        if not self.audit:
            return
        # After a cutoff the requests in flight were flushed as incomplete but stay queued
        # on their ranks: only the pools' bookkeeping and the sink count are checked here.
        for where, rank, _, _ in _ranks(self.replay):
            audit_rank(rank, where)
        replay = self.replay
        if _live_ids(replay):
            raise violation("terminal-once", "the event loop", "requests still live after the "
                            f"run: {sorted(_live_ids(replay))[:10]}")
        if len(self.terminal) != replay.num_requests:
            raise violation("terminal-once", "the event loop", f"{replay.num_requests} requests "
                            f"arrived, {len(self.terminal)} reached the sink")

    # -- auditor -------------------------------------------------------------------------

    def check(self, now: float | None = None) -> None:
        """Audit the ranks of every worker that started a pass at ``now`` (all workers
        when ``now`` is None), and where every live request is."""
        replay = self.replay
        live = _live_ids(replay)
        located: dict[str, dict[int, str]] = {}
        ranks = _ranks(replay, now)
        for where, rank, pool, _ in ranks:
            seen = located.setdefault(pool, {})
            for rid in _queued_ids(rank):
                if rid in seen:
                    raise violation("one-rank", where, f"also queued on {seen[rid]}", rid)
                seen[rid] = where
        for where, rank, _, touched in ranks:
            if touched:
                audit_rank(rank, where, live)
        if now is not None:
            self._check_links(now, live)
        somewhere = {rid for ids in located.values() for rid in ids}
        somewhere |= _in_passes(replay) | _in_handoff(replay)
        lost = live - somewhere
        if lost:
            rid = min(lost)
            raise violation("request-located", "the event loop", "live but in no queue, pass "
                            "or handoff", rid)

    def _check_links(self, now: float, live: set[int]) -> None:
        seen: dict[int, LinkSeen] = {}
        for where, link in _links(self.replay):
            if not link.active:
                raise violation("link-bytes", where, "in use with no active transfer")
            seen[id(link)] = audit_link(link, where, now, live, self.links.get(id(link)))
        self.links = seen

    def _sink(self, inner: Callable[[RequestRecord], None], record: RequestRecord) -> None:
        rid = record.request_id
        where = "the sink"
        if rid in self.terminal:
            raise violation("terminal-once", where, "reached the sink twice", rid)
        self.terminal.add(rid)
        if record.status not in ("completed", "rejected", "incomplete"):
            raise violation("terminal-once", where, f"status {record.status!r}", rid)
        times = record.token_times
        if any(b < a for a, b in itertools.pairwise(times)):
            raise violation("monotonic-time", where, "token times go back", rid)
        if times and times[0] < record.arrival_ms:
            raise violation("monotonic-time", where, f"a token at {times[0]} ms before the "
                            f"arrival at {record.arrival_ms} ms", rid)
        end = record.terminal_ms
        if (end is None) != (record.status == "incomplete"):
            raise violation("terminal-once", where, f"{record.status} with terminal time "
                            f"{end}", rid)
        if end is not None and (end < record.arrival_ms or (times and end < times[-1])):
            raise violation("monotonic-time", where, f"terminal at {end} ms before its "
                            "arrival or its last token", rid)
        if len(times) > record.requested_output_length:
            raise violation("token-count", where, f"{len(times)} tokens for "
                            f"{record.requested_output_length} requested", rid)
        inner(record)

    # -- watchdog ------------------------------------------------------------------------

    def _watch(self, now: float) -> None:
        """Brent's cycle detection over the scheduler state at a frozen virtual time."""
        state = self._fingerprint()
        if state == self._saved:
            raise self._stuck(now)
        self._lam += 1
        if self._lam == self._power:
            self._saved, self._power, self._lam = state, self._power * 2, 0

    def _fingerprint(self) -> tuple[Any, ...]:
        replay = self.replay
        out: list[Any] = [len(replay.events), replay.num_requests]
        for worker in replay.workers:
            out.append((worker.busy, worker.wave_step % worker.ranks[0].prefill_interval,
                        worker.balance_wait, worker.balance_batch))
            for rank in worker.ranks:
                for _, members, _ in _queues(rank):
                    out.append(tuple((s.spec.request_id, s.num_computed, s.generated,
                                      len(s.lease)) for s in members))
                pool = rank.pool
                out.append((pool.num_active, pool.num_inactive))
        out.append(tuple(sorted(_in_handoff(replay))))
        return tuple(out)

    def _stuck(self, now: float) -> ReplayError:
        stuck = sorted(_live_ids(self.replay))
        shown = ", ".join(map(str, stuck[:10])) + (", ..." if len(stuck) > 10 else "")
        return ReplayError([Diagnostic(
            code=codes.REPLAY_STUCK,
            message=f"the replay repeats the same state at virtual time {now} ms without "
                    f"emitting a token or finishing a request; stuck requests: {shown}",
            hint="passes that take no time can cycle (e.g. zero step times with "
                 "speculation or a full pool); give prefill_ms/decode_ms a positive value")])


def guard_replay(replay: Any) -> ReplayGuard:
    """The guard a replay loop creates when it starts (auditor per the current setting)."""
    return ReplayGuard(replay, invariant_checks_enabled())
