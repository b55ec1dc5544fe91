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

A *lease* is the plain ``list[int]`` of physical block ids a holder owns, in token order.
The pool does not know who holds a lease, so the same calls serve request KV, a future
per-request state cache (more leases per request) and P/D handoff (a source simply keeps
its lease until released; a destination reserves a lease before the KV arrives).

Every operation costs O(blocks touched): dicts and an ``OrderedDict`` carry the state,
nothing scans the pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

Lease = list[int]


class BlockPool:
    """``num_blocks`` physical blocks of ``block_size`` tokens (one rank, one TP shard)."""

    __slots__ = (
        "_free",
        "_hash",
        "_index",
        "_lru",
        "_next_unused",
        "_num_active",
        "_ref",
        "block_size",
        "num_blocks",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a block pool needs num_blocks > 0 and block_size > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Per-block state lives in dicts keyed by block id, so a huge pool that is never
        # filled costs nothing; never-used ids are handed out by a counter.
        self._ref: dict[int, int] = {}
        self._hash: dict[int, int] = {}  # block -> identity, only for cache-visible blocks
        self._index: dict[int, int] = {}  # identity -> the block that answers lookups
        self._lru: OrderedDict[int, None] = OrderedDict()  # inactive blocks, oldest first
        self._free: list[int] = []  # released blocks without identity
        self._next_unused = 0
        self._num_active = 0

    # -- counters ---------------------------------------------------------------------

    @property
    def num_active(self) -> int:
        return self._num_active

    @property
    def num_inactive(self) -> int:
        return len(self._lru)

    @property
    def num_free(self) -> int:
        return len(self._free) + self.num_blocks - self._next_unused

    @property
    def num_available(self) -> int:
        """Blocks an allocation may take: free ones plus evictable cached ones."""
        return self.num_blocks - self._num_active

    def is_active(self, block: int) -> bool:
        return self._ref.get(block, 0) > 0

    def count_active(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are active (only active blocks have a reference count)."""
        return sum(map(self._ref.__contains__, blocks))

    def identity(self, block: int) -> int | None:
        return self._hash.get(block)

    def cached_identities(self) -> set[int]:
        """All identities that a lookup can hit (for tests and inspection; O(cache))."""
        return set(self._index)

    # -- prefix cache -----------------------------------------------------------------

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks answering the longest cached prefix of ``hashes[:max_blocks]``."""
        index = self._index
        out: list[int] = []
        for i in range(min(max_blocks, len(hashes))):
            block = index.get(hashes[i])
            if block is None:
                break
            out.append(block)
        return out

    def publish(self, lease: Lease, hashes: Sequence[int], start: int, end: int) -> None:
        """Make the computed full blocks ``lease[start:end]`` visible under ``hashes``.

        If an identity is already cached by another block (two requests computed the same
        prefix independently, or the recompute rule redid a cached block), the existing
        block keeps answering lookups and this copy stays anonymous: it returns to the
        free list on release instead of occupying the LRU with a duplicate.
        """
        setdefault, ident = self._index.setdefault, self._hash
        for h, block in zip(hashes[start:end], lease[start:end], strict=True):
            if setdefault(h, block) == block:  # new (or already this block's) identity
                ident[block] = h

    # -- allocation -------------------------------------------------------------------

    def allocate(self, lease: Lease, target_blocks: int, reuse: Sequence[int] = ()) -> bool:
        """Grow ``lease`` to ``target_blocks`` blocks, all or nothing.

        ``reuse`` (cached blocks from :meth:`lookup`, for an empty lease) are referenced
        first; the rest are fresh blocks, taken from the free list and then by evicting
        the least recently released cached block. Returns False and leaves the lease and
        the pool untouched when the pool cannot supply the blocks.
        """
        ref = self._ref
        fresh = target_blocks - len(lease) - len(reuse)
        if fresh < 0:
            fresh = 0
        if fresh and not self.fits(fresh, reuse):
            return False
        for block in reuse:
            r = ref.get(block, 0)
            if r == 0:
                del self._lru[block]
                self._num_active += 1
            ref[block] = r + 1
            lease.append(block)
        if fresh:
            self._take_fresh_many(lease, fresh)
        return True

    def _take_fresh_many(self, lease: Lease, count: int) -> None:
        """Append ``count`` fresh blocks to ``lease``: free-list blocks first (last
        released first), then never-used ids, then by evicting the least recently released
        cached blocks (dropping their identities). The caller has checked they exist."""
        ref, free, append = self._ref, self._free, lease.append
        self._num_active += count
        while count and free:
            block = free.pop()
            ref[block] = 1
            append(block)
            count -= 1
        if count:
            unused = self._next_unused
            take = min(count, self.num_blocks - unused)
            for block in range(unused, unused + take):
                ref[block] = 1
                append(block)
            self._next_unused = unused + take
            count -= take
        if count:
            # A cached block's identity always answers lookups (``_hash`` and ``_index``
            # are inverse maps, see :meth:`check`): evicting drops both entries.
            popitem, ident_pop, index = self._lru.popitem, self._hash.pop, self._index
            for _ in range(count):
                block, _ = popitem(False)  # oldest first (positional: no keyword parsing)
                del index[ident_pop(block)]
                ref[block] = 1
                append(block)

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

        A block that was evicted (and maybe reused) since is left alone; an inactive block
        loses its place in the LRU and becomes free; an active one stays with its holder,
        anonymous, and is freed on release.
        """
        if self._hash.get(block) != identity:
            return
        del self._hash[block]
        if self._index.get(identity) == block:
            del self._index[identity]
        if block in self._lru:
            del self._lru[block]
            self._free.append(block)

    def release(self, lease: Lease) -> None:
        """Drop ``lease``'s references, leaf first; the lease is left empty."""
        ref, ident, lru, free = self._ref, self._hash, self._lru, self._free
        pop = ref.pop
        dropped = 0
        for block in reversed(lease):
            r = pop(block)
            if r > 1:
                ref[block] = r - 1
                continue
            dropped += 1
            if block in ident:
                lru[block] = None
            else:
                free.append(block)
        self._num_active -= dropped
        lease.clear()

    def check(self) -> None:
        """Assert the pool's internal invariants (tests; O(pool))."""
        assert self._num_active == len(self._ref)
        assert all(r > 0 for r in self._ref.values())
        assert self._num_active + len(self._lru) + self.num_free == self.num_blocks
        assert not (set(self._lru) & set(self._ref))
        assert not (set(self._free) & (set(self._ref) | set(self._lru)))
        for h, block in self._index.items():
            assert self._hash.get(block) == h
        assert len(self._index) == len(self._hash)  # with the above: inverse maps
        assert all(b in self._ref or b in self._lru for b in self._hash)
