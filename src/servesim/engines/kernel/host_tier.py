"""The host-memory (G2) KV tier of one attention-DP rank, as vLLM's CPU offload, LMCache
and Dynamo's KVBM keep one: prefix blocks evicted from the GPU pool live on in host
memory, and a prefix found there is loaded back instead of computed.

* **Write-back** (``write_back = "on_evict"``): a cached block the GPU pool evicts (it has
  a prefix identity) is copied to host over the rank's link. The blocks a pass evicts go
  as one transfer started when the pass is scheduled; they become addressable on host when
  it completes (a hit never points at KV that is not there yet). The eviction itself does
  not wait for the copy: the GPU block is reused at once, as if the copy were staged.
* **Onboarding**: a request whose prefix lookup stops in the GPU pool continues it on host
  (:meth:`HostPool.match`); the longest run found there is allocated as fresh GPU blocks,
  sent over the link, and published under its identities when the transfer completes. The
  request waits meanwhile (out of the rank's queue, so the requests behind it go on) and
  its prompt is computed only after the load; the scheduler's side is in
  :mod:`servesim.engines.ranks.scheduler`.
* **Eviction from host** is LRU by run (a stored run, or a run a load touched), each run
  evicted from its last block down, so a prefix outlives its extensions.
* **The link** is a :class:`~servesim.engines.kernel.links.SharedLink` of the configured
  bandwidth: write-backs and loads of one rank share it by processor sharing. A block
  moves ``block_size x bytes_per_token`` bytes (one tensor-parallel shard: every GPU of
  the rank moves its own shard over its own link at once).

Representation, as in the GPU pool (:mod:`servesim.engines.kernel.blocks`): identities
are runs of a base (:class:`~servesim.engines.kernel.tokens.BlockIds`); the host pool maps
a base to the offset intervals it holds, each interval an entry of the LRU, so every
operation costs O(runs touched), never O(blocks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from servesim.engines.kernel.events import EventQueue
from servesim.engines.kernel.links import SharedLink, Transfer
from servesim.engines.kernel.tokens import BlockIds
from servesim.payload import HostOffloadArgs, RoleArgs

# The event key of write-back transfers (a load's is its request id).
WRITE_BACK_KEY = -1


class _Run:
    """Offsets ``lo .. hi - 1`` of identity run ``base`` (identities ``base + offset``)."""

    __slots__ = ("base", "hi", "lo")

    def __init__(self, base: int, lo: int, hi: int) -> None:
        self.base = base
        self.lo = lo
        self.hi = hi


class HostPool:
    """Block identities held in host memory, at most ``capacity`` blocks, LRU by run."""

    __slots__ = ("_index", "_lru", "capacity", "evicted", "size")

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("a host pool needs a positive capacity")
        self.capacity = capacity
        self.size = 0  # blocks held
        self.evicted = 0  # blocks evicted from host so far
        self._index: dict[int, list[_Run]] = {}  # base -> its runs (disjoint)
        self._lru: dict[_Run, None] = {}  # oldest first

    def __contains__(self, identity: tuple[int, int]) -> bool:
        """Whether offset ``identity[1]`` of run ``identity[0]`` is held (tests)."""
        base, off = identity
        return _covering(self._index.get(base), off) is not None

    def spans(self, base: int) -> list[tuple[int, int]]:
        """The offset intervals of run ``base`` held."""
        return [(run.lo, run.hi) for run in self._index.get(base, ())]

    def store(self, base: int, lo: int, hi: int) -> None:
        """Hold offsets ``lo .. hi - 1`` of run ``base``, the most recently used blocks:
        the part already held is refreshed, the rest stored after evicting as many of the
        least recently used blocks as it needs (of a run longer than the pool, the first
        ``capacity`` blocks)."""
        runs = self._index.get(base)
        gaps = [(lo, hi)]
        if runs:
            for run in runs:
                if run.lo < hi and lo < run.hi:
                    self._touch(run)
                    gaps = _minus(gaps, run.lo, run.hi)
        for a, b in gaps:
            b = min(b, a + self.capacity)
            self._make_room(b - a)
            runs = self._index.get(base)  # eviction may have dropped the list
            if runs is None:
                runs = self._index[base] = []
            run = _Run(base, a, b)
            runs.append(run)
            self._lru[run] = None
            self.size += b - a

    def store_held(self, base: int, lo: int, hi: int) -> None:
        """Offsets ``lo .. hi - 1`` of run ``base`` were used again: the runs holding any
        of them become the most recently used."""
        for run in self._index.get(base, ()):
            if run.lo < hi and lo < run.hi:
                self._touch(run)

    def match(self, ids: BlockIds, start: int, stop: int) -> int:
        """How many of the blocks at positions ``start .. stop - 1`` of ``ids`` are held
        consecutively from ``start``; the runs that answer become the most recently used."""
        found = 0
        index = self._index
        for base, first, lo, hi in ids.runs(start, stop):
            off = first - base
            want = hi - lo
            runs = index.get(base)
            while want:
                run = _covering(runs, off)
                if run is None:
                    return found
                take = min(want, run.hi - off)
                self._touch(run)
                found += take
                off += take
                want -= take
        return found

    def _touch(self, run: _Run) -> None:
        lru = self._lru
        del lru[run]
        lru[run] = None

    def _make_room(self, count: int) -> None:
        """Evict least recently used blocks, each run from its top down, until ``count``
        more fit."""
        over = self.size + count - self.capacity
        lru = self._lru
        while over > 0:
            run = next(iter(lru))
            take = min(over, run.hi - run.lo)
            run.hi -= take
            self.size -= take
            self.evicted += take
            over -= take
            if run.hi == run.lo:
                del lru[run]
                runs = self._index[run.base]
                runs.remove(run)
                if not runs:
                    del self._index[run.base]

    def problems(self) -> Iterator[tuple[str, str]]:
        """Broken invariants as ``(kind, detail)`` (kind ``host-tier``; O(runs))."""
        held = 0
        indexed = 0
        for base, runs in self._index.items():
            spans = sorted((run.lo, run.hi) for run in runs)
            if not runs or any(a >= b for a, b in spans) or any(
                    spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
                yield "host-tier", f"the host runs of {base} are empty or overlap"
            for run in runs:
                indexed += 1
                held += run.hi - run.lo
                if run.base != base or run not in self._lru:
                    yield "host-tier", f"a host run of {base} is not in the LRU"
        if indexed != len(self._lru):
            yield "host-tier", f"the LRU lists {len(self._lru)} runs, the index {indexed}"
        if held != self.size:
            yield "host-tier", f"the host pool counts {self.size} blocks but holds {held}"
        if held > self.capacity:
            yield "host-tier", f"the host pool holds {held} blocks, its capacity is " \
                f"{self.capacity}"


def _minus(spans: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """``spans`` without the offsets ``lo .. hi - 1``."""
    return [(a, b) for s_lo, s_hi in spans
            for a, b in ((s_lo, min(s_hi, lo)), (max(s_lo, hi), s_hi)) if a < b]


def _covering(runs: list[_Run] | None, off: int) -> _Run | None:
    """The run holding offset ``off``, if any."""
    if runs:
        for run in runs:
            if run.lo <= off < run.hi:
                return run
    return None


class HostTier:
    """One rank's host pool, its link, and what went over it (see the module docstring).

    ``clock`` reads the replay's time; ``wake`` tells the replay that the rank's queue
    changed (a load completed), before the change.
    """

    __slots__ = (
        "_pending",
        "_sending",
        "admitted_tokens",
        "block_bytes",
        "clock",
        "hit_tokens",
        "link",
        "load_ms",
        "loaded_blocks",
        "loads",
        "pool",
        "reused_tokens",
        "wake",
        "write_back_ms",
        "written_back_blocks",
    )

    def __init__(self, args: HostOffloadArgs, block_bytes: int, events: EventQueue[Any],
                 clock: Callable[[], float], wake: Callable[[], None]) -> None:
        self.pool = HostPool(args.capacity_blocks)
        self.link = SharedLink(events, args.bandwidth_gb_per_second)
        self.block_bytes = block_bytes
        self.clock = clock
        self.wake = wake
        self._pending: list[tuple[int, int, int]] = []  # evicted runs not yet sent
        self._sending: dict[int, list[tuple[int, int]]] = {}  # base -> spans being sent
        self.loads = 0
        self.loaded_blocks = 0
        self.load_ms = 0.0
        # first admissions: their prompt tokens, those reused, those from loaded blocks
        self.admitted_tokens = 0
        self.reused_tokens = 0
        self.hit_tokens = 0
        self.written_back_blocks = 0
        self.write_back_ms = 0.0

    @classmethod
    def of_role(cls, role: RoleArgs, events: EventQueue[Any], clock: Callable[[], float],
                wake: Callable[[], None]) -> HostTier | None:
        """The tier ``role`` configures (None without ``host_offload``)."""
        if role.host_offload is None:
            return None
        return cls(role.host_offload, role.block_size * role.kv_bytes_per_token, events,
                   clock, wake)

    def evicted(self, base: int, lo: int, hi: int) -> None:
        """The GPU pool evicted offsets ``lo .. hi - 1`` of run ``base`` (its hook)."""
        self._pending.append((base, lo, hi))

    def flush(self) -> None:
        """Start writing back what was evicted since the last flush, as one transfer: the
        blocks host memory lacks (those it holds become its most recently used; those
        on their way there are not sent twice)."""
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        runs: list[tuple[int, int, int]] = []
        sending = self._sending
        for base, lo, hi in pending:
            gaps = [(lo, hi)]
            for a, b in (*self.pool.spans(base), *sending.get(base, ())):
                gaps = _minus(gaps, a, b)
            self.pool.store_held(base, lo, hi)
            for a, b in gaps:
                runs.append((base, a, b))
                sending.setdefault(base, []).append((a, b))
        if not runs:
            return
        blocks = sum(hi - lo for _, lo, hi in runs)
        self.link.start(self.clock(), WRITE_BACK_KEY, blocks * self.block_bytes,
                        lambda transfer: self._stored(runs, blocks, transfer))

    def _stored(self, runs: list[tuple[int, int, int]], blocks: int,
                transfer: Transfer) -> None:
        sending = self._sending
        for base, lo, hi in runs:
            self.pool.store(base, lo, hi)
            spans = sending[base]
            spans.remove((lo, hi))
            if not spans:
                del sending[base]
        self.written_back_blocks += blocks
        self.write_back_ms += transfer.duration_ms

    def load(self, key: int, blocks: int, done: Callable[[], None]) -> None:
        """Send ``blocks`` blocks to the GPU; ``done()`` once they are there."""
        def arrived(transfer: Transfer) -> None:
            self.loads += 1
            self.loaded_blocks += blocks
            self.load_ms += transfer.duration_ms
            self.wake()
            done()

        self.link.start(self.clock(), key, blocks * self.block_bytes, arrived)


    def admitted(self, prompt_tokens: int, reused: int, loaded: int) -> None:
        """A first admission: ``reused`` of its prompt tokens were cached on the GPU,
        ``loaded`` of those because they were loaded from host for it."""
        self.admitted_tokens += prompt_tokens
        self.reused_tokens += reused
        self.hit_tokens += loaded


def host_report(tiers: list[HostTier]) -> dict[str, Any]:
    """The report keys of a run's host tiers ({} without any): first-admission prefix
    hits in GPU memory (G1) and in host memory (G2, loaded for the request), as tokens and
    as shares of the prompt tokens admitted; loads and write-backs, and their link time."""
    if not tiers:
        return {}
    loads = sum(t.loads for t in tiers)
    load_ms = sum(t.load_ms for t in tiers)
    hits = sum(t.hit_tokens for t in tiers)
    g1 = sum(t.reused_tokens for t in tiers) - hits
    prompt = sum(t.admitted_tokens for t in tiers)
    return {
        "g1_prefix_hit_tokens": g1,
        "g1_prefix_hit_ratio": g1 / prompt if prompt else 0.0,
        "g2_prefix_hit_tokens": hits,
        "g2_prefix_hit_ratio": hits / prompt if prompt else 0.0,
        "g2_onboardings": loads,
        "g2_onboarded_blocks": sum(t.loaded_blocks for t in tiers),
        "g2_onboard_ms_total": load_ms,
        "g2_onboard_ms_mean": load_ms / loads if loads else 0.0,
        "g2_written_back_blocks": sum(t.written_back_blocks for t in tiers),
        "g2_write_back_ms_total": sum(t.write_back_ms for t in tiers),
        "g2_host_evicted_blocks": sum(t.pool.evicted for t in tiers),
    }


def host_links(workers: Iterable[Any]) -> list[tuple[str, SharedLink]]:
    """The host links in use among ``workers``' ranks, labelled (for the auditor)."""
    return [(f"{getattr(worker, 'pool', 'aggregated')} worker {worker.index} rank {r} "
             "host link", rank.host.link)
            for worker in workers for r, rank in enumerate(worker.ranks)
            if getattr(rank, "host", None) is not None and rank.host.link.active]
