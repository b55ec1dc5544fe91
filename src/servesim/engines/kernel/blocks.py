"""The KV block pool of one attention-DP rank, with its prefix index and LRU.

Every physical block is in exactly one of three states:

* **free** - holds nothing reusable (never used, or released without a cache identity);
* **active** - referenced by at least one lease (``ref > 0``);
* **inactive** - released (``ref == 0``) but still addressable by its hash, so a later
  request with the same prefix can reuse it; evicted on demand in LRU order.

A full block gets a hash identity only once its tokens are computed (:meth:`publish`), so
a prefix hit never points at KV that does not exist yet. Releasing a lease walks it in
reverse, leaf first: the LRU then evicts the oldest release batch first and, inside a
batch, suffix blocks before the prefix blocks they extend (a parent outlives its leaf).
Free blocks are always consumed before any cached block is evicted.

A *lease* is the plain ``list[int]`` of block ids a holder owns, in token order. The pool
does not know who holds a lease, so the same calls serve request KV, a per-request state
cache (more leases per request) and P/D handoff (a source simply keeps its lease until
released; a destination reserves a lease before the KV arrives).

Representation: the work is per run of blocks, not per block. The fresh blocks an
allocation appends to a lease form an *extent* (a later allocation extends it while the
lease ends with the extent's last block and is its only holder). An extent keeps its
blocks' reference counts and identities in lists indexed by offset, and a lease holds its
extents' blocks in runs, so releasing and evicting a run are list-slice operations. The
LRU is a queue of *release runs* (the consecutive blocks of one extent that one release
made inactive, evicted from the top down, in release order); referencing or forgetting
one of their blocks invalidates it lazily (it leaves its run's stamp and the run counts
it stale). The prefix index (identity -> block) is the one per-block structure: a lookup
and a publication are per identity.

A block id is ``extent key * num_blocks + offset`` and is never reused: a free block has
no id (the free blocks are a count), an evicted or freed block's id is retired with it.
Every operation costs O(runs touched) plus C-level slice work (and one index entry) per
block; nothing scans the pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

Lease = list[int]
# Block ids and identities are ints held boxed in lists and dict keys. The compiled build
# unboxes an element it reads as ``int`` and boxes it anew (a new object, for ints past
# 256) to store it or look it up; read as ``Any`` the same object passes on.
_Boxed = Any


class _Extent:
    """Blocks ``base .. base + len(blocks) - 1``: fresh blocks for consecutive positions of
    a lease, in token order (see :meth:`BlockPool._take_fresh`).

    Per offset: ``ref`` (references), ``ident`` (the identity the block answers lookups
    for, or None) and ``stamp`` (the release run holding it in the LRU, or None). A block
    is active if ``ref > 0``, inactive if ``ref == 0`` with an identity (then it has a
    stamp), and retired (freed or evicted; its id is never handed out again) otherwise.
    """

    __slots__ = ("base", "blocks", "ident", "key", "live", "ref", "stamp")

    def __init__(self, key: int, base: int) -> None:
        self.key = key
        self.base = base
        self.blocks: list[int] = []
        self.ref: list[int] = []
        self.ident: list[int | None] = []
        self.stamp: list[_Released | None] = []
        self.live = 0  # active plus inactive blocks; the pool drops the extent at 0

    def grow(self, lease: Lease, count: int) -> None:
        """Append ``count`` active blocks (one reference each), to ``lease`` too."""
        blocks = self.blocks
        end = self.base + len(blocks)
        if count == 1:  # a decode step's block
            blocks.append(end)
            self.ref.append(1)
            self.ident.append(None)
            self.stamp.append(None)
        else:
            blocks += range(end, end + count)
            self.ref += [1] * count
            self.ident += [None] * count
            self.stamp += [None] * count
        self.live += count
        lease += blocks[-count:]


class _Released:
    """A release run: blocks ``lo .. hi - 1`` of ``ext`` that one release made inactive,
    evicted from ``hi - 1`` down. ``stale`` of them were referenced or forgotten since
    (their stamp no longer names this run); eviction skips those."""

    __slots__ = ("ext", "hi", "lo", "stale")

    def __init__(self, ext: _Extent, lo: int, hi: int) -> None:
        self.ext = ext
        self.lo = lo
        self.hi = hi
        self.stale = 0


class BlockPool:
    """``num_blocks`` physical blocks of ``block_size`` tokens (one rank, one TP shard)."""

    __slots__ = (
        "_extents",
        "_index",
        "_lru",
        "_next_key",
        "_num_active",
        "_num_inactive",
        "block_size",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a block pool needs num_blocks > 0 and block_size > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._extents: dict[int, _Extent] = {}  # key -> extent with live blocks
        self._next_key = 0
        self._index: dict[int, int] = {}  # identity -> the block that answers lookups
        self._lru: deque[_Released] = deque()  # oldest first
        self._num_active = 0
        self._num_inactive = 0

    # -- counters ---------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        return self._num_active

    @property
    def num_inactive(self) -> int:
        return self._num_inactive

    @property
    def num_free(self) -> int:
        return self.num_blocks - self._num_active - self._num_inactive

    @property
    def num_available(self) -> int:
        """Blocks an allocation may take: free ones plus evictable cached ones."""
        return self.num_blocks - self._num_active

    def _locate(self, block: int) -> tuple[_Extent, int] | None:
        """The extent and offset of ``block`` (None once its extent retired)."""
        ext = self._extents.get(block // self.num_blocks)
        if ext is None:
            return None
        offset = block - ext.base
        return (ext, offset) if offset < len(ext.blocks) else None

    def is_active(self, block: int) -> bool:
        where = self._locate(block)
        return where is not None and where[0].ref[where[1]] > 0

    def count_active(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` (held or cached blocks, e.g. a lookup's) are active."""
        active = 0
        for ext, lo, hi, _ in self._runs(blocks, 0, len(blocks)):
            active += hi - lo - ext.ref[lo:hi].count(0)
        return active

    def identity(self, block: int) -> int | None:
        where = self._locate(block)
        return None if where is None else where[0].ident[where[1]]

    def cached_identities(self) -> set[int]:
        """All identities that a lookup can hit (for tests and inspection; O(cache))."""
        return set(self._index)

    def references(self) -> dict[int, int]:
        """Reference count of every active block (for the auditor and tests; O(pool))."""
        return {block: r for ext in self._extents.values()
                for block, r in zip(ext.blocks, ext.ref, strict=True) if r}

    # -- prefix cache -----------------------------------------------------------------

    def lookup(self, hashes: list[int], max_blocks: int) -> list[int]:
        """Blocks answering the longest cached prefix of ``hashes[:max_blocks]``."""
        index = self._index
        names: list[_Boxed] = hashes
        out: list[_Boxed] = []
        for i in range(min(max_blocks, len(names))):
            block = index.get(names[i])
            if block is None:
                break
            out.append(block)
        return out

    def cached_prefix(self, hashes: list[int]) -> int:
        """How many leading blocks of ``hashes`` a lookup would hit (a router's query;
        changes nothing, costs one index probe per hit)."""
        index = self._index
        names: list[_Boxed] = hashes
        n = 0
        for name in names:
            if name not in index:
                break
            n += 1
        return n

    def _runs(self, lease: Sequence[int], start: int, end: int
              ) -> list[tuple[_Extent, int, int, int]]:
        """``lease[start:end]`` as runs ``(extent, lo, hi, first)``, last run first: lease
        positions ``first .. first + hi - lo - 1`` hold the extent's blocks ``lo .. hi - 1``.

        A run is found in one step when the lease holds its extent from offset 0 (or from
        position ``start``); anything else (a reused run entered past its extent's start,
        a lease holding a block twice) falls back to one-block runs.
        """
        extents, nb = self._extents, self.num_blocks
        # (a list, indexed and sliced without the generic sequence protocol)
        held: list[int] = lease if isinstance(lease, list) else list(lease)
        runs = []
        while end > start:
            block = held[end - 1]
            ext = extents[block // nb]
            hi = block - ext.base + 1
            lo = hi - end + start
            if lo < 0:
                lo = 0
            if hi - lo > 1 and held[end - hi + lo:end] != ext.blocks[lo:hi]:
                lo = hi - 1
            end -= hi - lo
            runs.append((ext, lo, hi, end))
        return runs

    def publish(self, lease: Lease, hashes: list[int], start: int, end: int) -> None:
        """Make the computed full blocks ``lease[start:end]`` visible under ``hashes``.

        If an identity is already cached by another block (two requests computed the same
        prefix independently, or the recompute rule redid a cached block), the existing
        block keeps answering lookups and this copy stays anonymous: it returns to the
        free blocks on release instead of occupying the LRU with a duplicate.
        """
        index: dict[_Boxed, _Boxed] = self._index
        names: list[_Boxed] = hashes
        runs = self._runs(lease, start, end)
        runs.reverse()  # first to last: of two blocks publishing one identity, the first wins
        for ext, lo, hi, first in runs:
            blocks: list[_Boxed] = ext.blocks
            ident = ext.ident
            for offset in range(lo, hi):
                block = blocks[offset]
                name = names[first]
                first += 1
                if index.setdefault(name, block) == block:  # new, or its own already
                    ident[offset] = name

    # -- allocation -------------------------------------------------------------------

    def allocate(self, lease: Lease, target_blocks: int, reuse: Sequence[int] = ()) -> bool:
        """Grow ``lease`` to ``target_blocks`` blocks, all or nothing.

        ``reuse`` (cached blocks from :meth:`lookup`, for an empty lease) are referenced
        first; the rest are fresh blocks, taken from the free blocks and then by evicting
        the least recently released cached blocks. Returns False and leaves the lease and
        the pool untouched when the pool cannot supply the blocks.
        """
        fresh = target_blocks - len(lease) - len(reuse)
        if fresh < 0:
            fresh = 0
        if fresh and not self.fits(fresh, reuse):
            return False
        if reuse:
            for ext, lo, hi, _ in self._runs(reuse, 0, len(reuse)):
                self._reference(ext, lo, hi)
            lease.extend(reuse)
        if fresh:
            self._take_fresh(lease, fresh)
        return True

    def _reference(self, ext: _Extent, lo: int, hi: int) -> None:
        """One more reference to each of ``ext``'s blocks ``lo .. hi - 1``; inactive ones
        leave the LRU (their release run counts them stale)."""
        ref = ext.ref
        size = hi - lo
        inactive = ref[lo:hi].count(0)
        if inactive:
            stamp = ext.stamp
            for offset in range(lo, hi):
                run = stamp[offset]
                if run is not None:
                    run.stale += 1
                    stamp[offset] = None
            self._num_inactive -= inactive
            self._num_active += inactive
        if size == 1:
            ref[lo] += 1
        else:
            ref[lo:hi] = [r + 1 for r in ref[lo:hi]]

    def _take_fresh(self, lease: Lease, count: int) -> None:
        """Append ``count`` fresh blocks to ``lease``, evicting the least recently
        released cached blocks for those the free blocks cannot supply (the caller has
        checked they exist)."""
        evict = count + self._num_active + self._num_inactive - self.num_blocks
        if evict > 0:
            self._evict(evict)
        self._num_active += count
        if lease:  # extend the extent the lease ends with, if it is the last block's only holder
            block = lease[-1]
            ext = self._extents.get(block // self.num_blocks)
            if ext is not None:
                end = block - ext.base + 1
                if end == len(ext.blocks) and ext.ref[-1] == 1 and end + count <= self.num_blocks:
                    ext.grow(lease, count)
                    return
        key = self._next_key
        self._next_key = key + 1
        ext = self._extents[key] = _Extent(key, key * self.num_blocks)
        ext.grow(lease, count)

    def _evict(self, count: int) -> None:
        """Evict ``count`` inactive blocks in LRU order, dropping their identities."""
        lru, index = self._lru, self._index
        while count:
            run = lru[0]
            ext, lo, hi = run.ext, run.lo, run.hi
            stamp = ext.stamp
            if run.stale:
                # Some were referenced or forgotten since that release: keep the blocks
                # still inactive from it, as maximal runs in the same (top-down) order.
                lru.popleft()
                kept = []
                k = hi
                while k > lo:
                    if stamp[k - 1] is not run:
                        k -= 1
                        continue
                    top = k
                    while k > lo and stamp[k - 1] is run:
                        k -= 1
                    part = _Released(ext, k, top)
                    stamp[k:top] = [part] * (top - k)
                    kept.append(part)
                lru.extendleft(reversed(kept))
                continue
            take = min(count, hi - lo)
            cut = hi - take
            ident = ext.ident
            if take == 1:  # a decode step's block: element access beats one-element slices
                del index[ident[cut]]  # type: ignore[arg-type]  # inactive: it has one
                ident[cut] = stamp[cut] = None
            else:
                for h in ident[cut:hi]:
                    del index[h]  # type: ignore[arg-type]
                ident[cut:hi] = [None] * take
                stamp[cut:hi] = [None] * take
            self._retire(ext, take)
            self._num_inactive -= take
            count -= take
            if cut == lo:
                lru.popleft()
            else:
                run.hi = cut

    def _retire(self, ext: _Extent, count: int) -> None:
        """``count`` blocks of ``ext`` stop being active or inactive (freed or evicted)."""
        ext.live -= count
        if not ext.live:
            del self._extents[ext.key]

    def fits(self, fresh: int, reuse: Sequence[int] = ()) -> bool:
        """Whether ``fresh`` new blocks can be taken after referencing ``reuse``.

        The check :meth:`allocate` makes, exposed so a caller can grow several leases
        (token KV and a state cache) all or nothing.
        """
        if fresh <= 0:
            return True
        # Free plus cached blocks are the available ones; reactivating an inactive reused
        # block removes it from them.
        inactive_reused = len(reuse) - self.count_active(reuse) if reuse else 0
        return fresh <= self.num_blocks - self._num_active - inactive_reused

    def forget(self, block: int, identity: int) -> None:
        """Withdraw ``block``'s cache identity if it still is ``identity``.

        A block that was evicted since is left alone; an inactive block leaves the LRU
        and becomes free; an active one stays with its holder, anonymous, and is freed on
        release.
        """
        where = self._locate(block)
        if where is None:
            return
        ext, offset = where
        if ext.ident[offset] != identity:
            return
        ext.ident[offset] = None
        if self._index.get(identity) == block:
            del self._index[identity]
        run = ext.stamp[offset]
        if run is not None:  # inactive
            run.stale += 1
            ext.stamp[offset] = None
            self._num_inactive -= 1
            self._retire(ext, 1)

    def release(self, lease: Lease) -> None:
        """Drop ``lease``'s references, leaf first; the lease is left empty."""
        released: list[_Released] = []  # the new release runs, leaf first
        dropped = cached = 0
        for ext, lo, hi, _ in self._runs(lease, 0, len(lease)):
            size = hi - lo
            ref, ident = ext.ref, ext.ident
            if ref[lo:hi].count(1) == size:  # the lease was the run's only holder
                top = hi
                while top > lo and ident[top - 1] is None:
                    top -= 1
                named = top
                while named > lo and ident[named - 1] is not None:
                    named -= 1
                if named == lo:  # the common shape: cached, then an anonymous tail
                    anonymous = hi - top
                    ref[lo:hi] = [0] * size
                    dropped += size
                    if top > lo:
                        run = _Released(ext, lo, top)
                        ext.stamp[lo:top] = [run] * (top - lo)
                        released.append(run)
                        cached += top - lo
                    if anonymous:
                        self._retire(ext, anonymous)
                    continue
            for offset in range(hi - 1, lo - 1, -1):  # any other run: block by block
                r = ref[offset]
                ref[offset] = r - 1
                if r > 1:
                    continue
                dropped += 1
                if ident[offset] is None:
                    self._retire(ext, 1)
                    continue
                cached += 1
                last = released[-1] if released else None
                if last is not None and last.ext is ext and last.lo == offset + 1:
                    last.lo = offset
                else:
                    last = _Released(ext, offset, offset + 1)
                    released.append(last)
                ext.stamp[offset] = last
        self._num_active -= dropped
        self._num_inactive += cached
        self._lru.extend(released)
        lease.clear()
        if len(self._lru) > 2 * self._num_inactive + 64:
            # Runs invalidated lazily would pile up while nothing is evicted.
            self._lru = deque(run for run in self._lru if run.hi - run.lo > run.stale)

    # -- invariants -------------------------------------------------------------------

    def problems(self) -> Iterator[tuple[str, str]]:
        """Broken invariants as ``(kind, detail)``, kind one of ``pool-totals``,
        ``block-refcount`` and ``prefix-index`` (the auditor reports them; O(pool))."""
        active = inactive = named = 0
        for key, ext in self._extents.items():
            size = len(ext.blocks)
            if (ext.key != key or ext.base != key * self.num_blocks or size > self.num_blocks
                    or ext.blocks != list(range(ext.base, ext.base + size))
                    or not len(ext.ref) == len(ext.ident) == len(ext.stamp) == size):
                yield "pool-totals", f"extent {key} is malformed"
            live = 0
            for block, r, h, run in zip(ext.blocks, ext.ref, ext.ident, ext.stamp,
                                        strict=True):
                if r < 0:
                    yield "block-refcount", f"block {block} has reference count {r}"
                if r > 0:
                    active += 1
                elif h is not None:
                    inactive += 1
                live += r > 0 or h is not None
                if (run is not None) != (r == 0 and h is not None):
                    yield "pool-totals", (f"block {block} is {'' if run else 'not '}in the "
                                          "LRU")
                if h is not None:
                    named += 1
                    if self._index.get(h) != block:
                        yield "prefix-index", (f"block {block} carries identity {h}, which "
                                               f"answers with block {self._index.get(h)}")
            if live != ext.live or not live:
                yield "pool-totals", (f"extent {key} counts {ext.live} live blocks but has "
                                      f"{live}")
        if named != len(self._index):
            yield "prefix-index", (f"{named} blocks carry an identity but {len(self._index)} "
                                   "identities answer lookups")
        if (active, inactive) != (self._num_active, self._num_inactive):
            yield "pool-totals", (f"{self._num_active} blocks counted active and "
                                  f"{self._num_inactive} cached, but {active} are active "
                                  f"and {inactive} cached")
        if active + inactive > self.num_blocks:
            yield "pool-totals", (f"active {active} + cached {inactive} blocks, the pool has "
                                  f"{self.num_blocks}")
        listed = 0
        for run in self._lru:
            held = run.ext.stamp[run.lo:run.hi].count(run)
            if not 0 <= run.lo < run.hi <= len(run.ext.blocks) or (
                    held != run.hi - run.lo - run.stale):
                yield "pool-totals", (f"release run {run.ext.key}:{run.lo}-{run.hi} holds "
                                      f"{held} blocks, {run.stale} counted stale")
            listed += held
        if listed != inactive:
            yield "pool-totals", f"the LRU holds {listed} blocks, {inactive} are cached"

    def check(self) -> None:
        """Assert the pool's internal invariants (tests; O(pool))."""
        broken = list(self.problems())
        assert not broken, broken
