"""The KV block pool of one attention-DP rank, with its prefix index and LRU.

Every physical block is in exactly one of three states:

* **free** - holds nothing reusable (never used, or released without a cache identity);
* **active** - referenced by at least one lease (``ref > 0``);
* **inactive** - released (``ref == 0``) but still addressable by its identity, so a
  later request with the same prefix can reuse it; evicted on demand in LRU order.

A full block gets an identity only once its tokens are computed (:meth:`publish`), so a
prefix hit never points at KV that does not exist yet. Releasing a lease walks it in
reverse, leaf first: the LRU then evicts the oldest release batch first and, inside a
batch, suffix blocks before the prefix blocks they extend (a parent outlives its leaf).
Free blocks are always consumed before any cached block is evicted.

A :class:`Lease` holds blocks for one holder, in token order. The pool does not know who
holds a lease, so the same calls serve request KV, a per-request state cache (more leases
per request) and P/D handoff (a source keeps its lease until released; a destination
reserves a lease before the KV arrives).

Representation: every cost is per run of blocks, not per block, so a pool of one-token
blocks (SGLang's page size 1) costs what a pool of 64-token blocks does.

* The fresh blocks an allocation appends to a lease form an *extent*; a later
  allocation extends it while the lease ends with the extent's last block and is its
  only holder. An extent keeps its blocks' reference counts, pieces, release runs and
  whether they carry an identity in run maps (:mod:`~servesim.engines.kernel.runmap`):
  setting or counting a range of blocks costs the runs of equal values it touches.
* A lease is a list of runs ``(extent, lo, hi)``.
* The prefix index maps a run's *base* identity (see
  :class:`~servesim.engines.kernel.tokens.BlockIds`) to its *pieces*: consecutive blocks
  of one extent answering consecutive identities of that run. At most one block answers
  an identity.
* The LRU is a queue of *release runs* (the consecutive blocks of one extent that one
  release made inactive, evicted from the top down, in release order); referencing or
  forgetting one of their blocks invalidates it lazily (it leaves its run's stamp and
  the run counts it stale).

A block id is ``extent key * num_blocks + offset``: a free block has no id (the free
blocks are a count); an evicted or freed block's id is retired with it, and never handed
out again once the block had an identity (one that never had one, at the end of its
extent, is: a session's next turn grows the extent over its previous turn's partial last
block, see :meth:`BlockPool._settle`).
Every operation costs O(runs and pieces touched), plus a bisection per run map it
reads; nothing scans the pool or walks a run block by block.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import overload

from servesim.engines.kernel.runmap import Counts, RunMap
from servesim.engines.kernel.tokens import BlockIds


class _Extent:
    """Blocks ``base .. base + size - 1``: fresh blocks for consecutive positions of a
    lease, in token order (see :meth:`BlockPool._take_fresh`).

    Per offset, as run maps: ``ref`` (references), ``piece`` (the piece through which the
    block answers lookups, or None), ``named`` (``piece is not None``: the stretches of
    named blocks, which a session's one-block pieces would split into one run each) and
    ``stamp`` (the release run holding it in the LRU, or None). A block is active if
    ``ref > 0``, inactive if ``ref == 0`` with a piece (then it has a stamp), and retired
    (freed or evicted) otherwise; ``forgotten`` bounds the offsets of blocks that lost
    their identity while held.
    """

    __slots__ = ("base", "forgotten", "key", "live", "named", "piece", "ref", "stamp")

    def __init__(self, key: int, base: int) -> None:
        self.key = key
        self.base = base
        self.ref = Counts()
        self.piece: RunMap[_Piece | None] = RunMap()
        self.named: RunMap[bool] = RunMap()
        self.stamp: RunMap[_Released | None] = RunMap()
        self.live = 0  # active plus inactive blocks; the pool drops the extent at 0
        # No block from this offset on lost its identity while held: the blocks there
        # that a release retires never had one (an evicted block retires otherwise), and
        # at the end of the extent they may be handed out again (see BlockPool._settle).
        self.forgotten = 0

    @property
    def size(self) -> int:
        return self.ref.size

    def grow(self, lease: Lease, count: int) -> None:
        """Append ``count`` active blocks (one reference each), to ``lease`` too."""
        lo = self.ref.size
        self.ref.append(count, 1)
        self.piece.append(count, None)
        self.named.append(count, False)
        self.stamp.append(count, None)
        self.live += count
        lease.append(self, lo, lo + count)

    def set_piece(self, lo: int, hi: int, piece: _Piece | None) -> None:
        """Blocks ``lo .. hi - 1`` answer through ``piece`` (None: they answer nothing)."""
        self.piece.assign(lo, hi, piece)
        self.named.assign(lo, hi, piece is not None)

    def truncate(self, end: int) -> None:
        """Drop offsets ``end ..`` (retired blocks that never had an identity)."""
        self.ref.truncate(end)
        self.piece.truncate(end)
        self.named.truncate(end)
        self.stamp.truncate(end)

    def well_formed(self) -> bool:
        """Whether the run maps are canonical, cover the same offsets and agree on which
        blocks are named (for invariant checks; O(size))."""
        size = self.ref.size
        return (self.ref.is_canonical() and self.piece.is_canonical()
                and self.named.is_canonical() and self.stamp.is_canonical()
                and self.piece.size == self.named.size == self.stamp.size == size
                and self.named.expand() == [p is not None for p in self.piece.expand()])

    def clear(self) -> None:
        """Drop the pieces and release runs (the extent retired: they point back at it,
        freed now, not by the cycle collector; its size stays, which the LRU's stale runs
        of it are checked against)."""
        self.piece.clear()
        self.named.clear()
        self.stamp.clear()


class _Piece:
    """Blocks ``lo .. hi - 1`` of ``ext`` answer identities ``base + off`` onwards."""

    __slots__ = ("base", "ext", "hi", "lo", "off")

    def __init__(self, ext: _Extent, lo: int, hi: int, base: int, off: int) -> None:
        self.ext = ext
        self.lo = lo
        self.hi = hi
        self.base = base
        self.off = off

    def identity(self, offset: int) -> int:
        """The identity block ``offset`` of the extent answers."""
        return self.base + self.off + offset - self.lo


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


class Lease:
    """Blocks held by one holder, in token order, as runs ``(extent, lo, hi)``."""

    __slots__ = ("runs", "size")

    def __init__(self) -> None:
        self.runs: list[tuple[_Extent, int, int]] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def append(self, ext: _Extent, lo: int, hi: int) -> None:
        """Append blocks ``lo .. hi - 1`` of ``ext`` (merged into the last run when they
        continue it)."""
        runs = self.runs
        if runs:
            last, last_lo, last_hi = runs[-1]
            if last is ext and last_hi == lo:
                runs[-1] = (ext, last_lo, hi)
                self.size += hi - lo
                return
        runs.append((ext, lo, hi))
        self.size += hi - lo

    def extend(self, other: Lease) -> None:
        for ext, lo, hi in other.runs:
            self.append(ext, lo, hi)

    def copy(self) -> Lease:
        out = Lease()
        out.runs = list(self.runs)
        out.size = self.size
        return out

    def clear(self) -> None:
        self.runs.clear()
        self.size = 0

    def blocks(self) -> list[int]:
        """The block ids, in token order (for the auditor, tests and state snapshots)."""
        out: list[int] = []
        for ext, lo, hi in self.runs:
            out += range(ext.base + lo, ext.base + hi)
        return out

    def head(self, count: int) -> Lease:
        """A new lease of the first ``count`` blocks (the same blocks, not referenced)."""
        out = Lease()
        if count <= 0:
            return out
        for ext, lo, hi in self.runs:
            if out.size + hi - lo >= count:
                out.append(ext, lo, lo + count - out.size)
                break
            out.append(ext, lo, hi)
        return out

    def tail(self, start: int) -> list[tuple[_Extent, int, int, int]]:
        """Positions ``start ..`` as runs ``(extent, lo, hi, first position)``, first to
        last (the walk starts from the end: a caller asks for recent blocks)."""
        out: list[tuple[_Extent, int, int, int]] = []
        end = self.size
        for ext, lo, hi in reversed(self.runs):
            if end <= start:
                break
            first = end - (hi - lo)
            if first < start:
                lo += start - first
                first = start
            out.append((ext, lo, hi, first))
            end = first
        out.reverse()
        return out

    def __iter__(self) -> Iterator[int]:
        return iter(self.blocks())

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        return self.blocks()[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Lease):
            return self.blocks() == other.blocks()
        if isinstance(other, list):
            return self.blocks() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Lease({self.blocks()})"


NO_BLOCKS = Lease()  # an empty reuse (never grown: allocate only reads it)


def _ids(identities: BlockIds | Iterable[int]) -> BlockIds:
    return identities if isinstance(identities, BlockIds) else BlockIds.of(identities)


def _covering(pieces: list[_Piece] | None, off: int) -> _Piece | None:
    """The piece of a run answering offset ``off``, if any."""
    if pieces:
        for piece in pieces:
            if piece.off <= off < piece.off + piece.hi - piece.lo:
                return piece
    return None


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
        "on_evict",
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("a block pool needs num_blocks > 0 and block_size > 0")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._extents: dict[int, _Extent] = {}  # key -> extent with live blocks
        self._next_key = 0
        self._index: dict[int, list[_Piece]] = {}  # run base -> its cached pieces
        self._lru: deque[_Released] = deque()  # oldest first
        self._num_active = 0
        self._num_inactive = 0
        # called with (base, lo, hi) for the offsets of each identity run an eviction drops
        # (a host tier's write-back); None: nobody listens
        self.on_evict: Callable[[int, int, int], None] | None = None

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
        return (ext, offset) if offset < ext.size else None

    def is_active(self, block: int) -> bool:
        where = self._locate(block)
        return where is not None and where[0].ref.get(where[1]) > 0

    def count_active(self, lease: Lease) -> int:
        """How many of ``lease``'s blocks (held or cached blocks, e.g. a lookup's) are
        active."""
        active = 0
        for ext, lo, hi in lease.runs:
            active += hi - lo - ext.ref.count(lo, hi, 0)
        return active

    def identity(self, block: int) -> int | None:
        where = self._locate(block)
        if where is None:
            return None
        ext, offset = where
        piece = ext.piece.get(offset)
        return None if piece is None else piece.identity(offset)

    def cached_identities(self) -> set[int]:
        """All identities that a lookup can hit (for tests and inspection; O(cache))."""
        return {piece.base + piece.off + k for pieces in self._index.values()
                for piece in pieces for k in range(piece.hi - piece.lo)}

    def references(self) -> dict[int, int]:
        """Reference count of every active block (for the auditor and tests; O(pool))."""
        return {ext.base + offset: r for ext in self._extents.values()
                for lo, hi, r in ext.ref.runs(0, ext.size) if r for offset in range(lo, hi)}

    # -- prefix cache -----------------------------------------------------------------

    def lookup(self, identities: BlockIds | Iterable[int], max_blocks: int,
               known: Lease | None = None) -> Lease:
        """Blocks answering the longest cached prefix of ``identities[:max_blocks]`` (a
        lease the caller has not referenced yet: pass it to :meth:`allocate`).

        ``known`` (from :meth:`answering`): blocks that answered the first identities
        when it was taken. While all of them still carry an identity they still answer
        those (a block's identity never changes, and at most one block answers one), so
        the walk starts after them: a session's next turn looks up its new blocks only."""
        ids = _ids(identities)
        limit = min(max_blocks, len(ids))
        if known is not None and self._named(known):
            out = known.head(limit)
            lo = out.size
            r = bisect_right(ids.ends, lo)
            skip = lo - ids.ends[r - 1] if r else lo  # blocks of run r already found
        else:
            out = Lease()
            lo = r = skip = 0
        index = self._index
        bases, firsts, ends = ids.bases, ids.firsts, ids.ends
        while lo < limit:
            hi = ends[r] if ends[r] < limit else limit
            base = bases[r]
            off = firsts[r] - base + skip
            skip = 0
            want = hi - lo
            lo = hi
            r += 1
            pieces = index.get(base)
            if pieces is None:
                return out
            while want:
                piece = pieces[0] if len(pieces) == 1 else _covering(pieces, off)
                if piece is None or not piece.off <= off < piece.off + piece.hi - piece.lo:
                    return out
                start = piece.lo + off - piece.off
                take = min(want, piece.hi - start)
                out.append(piece.ext, start, start + take)
                off += take
                want -= take
        return out

    def _named(self, lease: Lease) -> bool:
        """Whether every block of ``lease`` is live and carries an identity."""
        extents = self._extents
        for ext, lo, hi in lease.runs:
            if extents.get(ext.key) is not ext or not ext.named.all(lo, hi, True):
                return False
        return True

    def answering(self, lease: Lease, count: int) -> Lease:
        """The leading blocks of ``lease[:count]`` that carry an identity, as a lease, for
        a later :meth:`lookup` of the identities ``lease`` was published or looked up
        under (``known``). For a token lease: only a state cache's blocks are forgotten
        and named anew."""
        out = Lease()
        for ext, lo, hi in lease.head(count).runs:
            stop = ext.named.first_not(lo, hi, True)
            if stop < hi:
                out.append(ext, lo, stop)
                break
            out.append(ext, lo, hi)
        return out

    def cached_prefix(self, identities: BlockIds | Iterable[int]) -> int:
        """How many leading blocks of ``identities`` a lookup would hit (a router's query;
        changes nothing)."""
        ids = _ids(identities)
        return len(self.lookup(ids, len(ids)))

    def publish(self, lease: Lease, identities: BlockIds | Iterable[int], start: int,
                end: int) -> None:
        """Make the computed full blocks ``lease[start:end]`` visible under their
        ``identities``.

        If an identity is already cached by another block (two requests computed the same
        prefix independently, or the recompute rule redid a cached block), the existing
        block keeps answering lookups and this copy stays anonymous: it returns to the
        free blocks on release instead of occupying the LRU with a duplicate.
        """
        ids = _ids(identities)
        if self._grow_last_piece(lease, ids, start, end):
            return
        blocks = lease.tail(start)
        names = ids.runs(start, end)
        b = n = 0
        while b < len(blocks) and n < len(names):
            ext, lo, hi, at = blocks[b]
            base, first, id_lo, id_hi = names[n]
            pos = max(at, id_lo)
            stop = min(min(at + hi - lo, id_hi), end)  # (two arguments: compiled natively)
            if pos < stop:
                self._name(ext, lo + pos - at, stop - pos, base, first + pos - id_lo - base)
            if at + hi - lo <= stop:
                b += 1
            if id_hi <= stop:
                n += 1

    def _grow_last_piece(self, lease: Lease, ids: BlockIds, start: int, end: int) -> bool:
        """The common publication of a decode step: blocks of the lease's last run that
        continue the only piece of the identities' last run. Made in O(1); False (nothing
        done) for any other."""
        ends = ids.ends
        run_start = ends[-2] if len(ends) > 1 else 0
        if not ends or ends[-1] < end or run_start > start or not lease.runs:
            return False
        ext, lo, hi = lease.runs[-1]
        first = hi - (lease.size - start)
        top = first + end - start
        if first <= lo or top > hi:
            return False
        piece = ext.piece.get(first - 1)
        base = ids.bases[-1]
        if (piece is None or piece.hi != first or piece.base != base
                or piece.identity(first - 1) + 1 != ids.firsts[-1] + start - run_start
                or len(self._index[base]) != 1
                or not ext.named.all(first, top, False)):
            return False
        piece.hi = top
        ext.set_piece(first, top, piece)
        return True

    def _name(self, ext: _Extent, lo: int, count: int, base: int, off: int) -> None:
        """Blocks ``lo ..`` of ``ext`` answer offsets ``off .. off + count - 1`` of run
        ``base``, except offsets another block answers (or the block already does)."""
        pieces = self._index.get(base)
        if pieces is None:  # a run nothing answers yet: the blocks are one new piece
            if ext.named.all(lo, lo + count, False):
                piece = _Piece(ext, lo, lo + count, base, off)
                self._index[base] = [piece]
                ext.set_piece(lo, lo + count, piece)
            return
        end = off + count
        free = [(off, end)]
        for piece in pieces:  # offsets other pieces answer stay with them
            p_lo, p_hi = piece.off, piece.off + piece.hi - piece.lo
            if p_lo < end and off < p_hi:
                free = [(a, b) for lo_, hi_ in free
                        for a, b in ((lo_, min(hi_, p_lo)), (max(lo_, p_hi), hi_)) if a < b]
        for a, b in free:
            first = lo + a - off
            if not ext.named.all(first, first + b - a, False):
                continue  # named already (under another identity: a colliding run)
            grown = self._extendable(pieces, ext, first, a)
            if grown is None:
                piece = _Piece(ext, first, first + b - a, base, a)
                pieces.append(piece)
            else:
                piece = grown
                piece.hi = first + b - a
            ext.set_piece(first, first + b - a, piece)

    @staticmethod
    def _extendable(pieces: list[_Piece], ext: _Extent, lo: int, off: int) -> _Piece | None:
        """A piece that ends right before block ``lo`` of ``ext`` and offset ``off``."""
        for piece in pieces:
            if piece.ext is ext and piece.hi == lo and piece.off + lo - piece.lo == off:
                return piece
        return None

    def _unname(self, ext: _Extent, lo: int, hi: int) -> None:
        """Blocks ``lo .. hi - 1`` of ``ext`` stop answering lookups (their pieces shrink
        or split)."""
        if lo >= hi:
            return
        top = ext.piece.get(hi - 1)
        if top is not None and top.lo <= lo:  # one piece (an eviction's few blocks)
            self._cut(top, lo, hi)
        else:
            for a, b, piece in reversed(ext.piece.runs(lo, hi)):
                if piece is not None:
                    self._cut(piece, a, b)
        ext.set_piece(lo, hi, None)

    def _cut(self, piece: _Piece, lo: int, hi: int) -> None:
        """Remove blocks ``lo .. hi - 1`` from ``piece``."""
        if piece.lo < lo and hi < piece.hi:  # from the middle: the top becomes a piece
            top = _Piece(piece.ext, hi, piece.hi, piece.base, piece.off + hi - piece.lo)
            piece.ext.piece.assign(hi, piece.hi, top)
            self._index[piece.base].append(top)
            piece.hi = lo
        elif piece.lo < lo:
            piece.hi = lo
        elif hi < piece.hi:
            piece.off += hi - piece.lo
            piece.lo = hi
        else:
            pieces = self._index[piece.base]
            pieces.remove(piece)
            if not pieces:
                del self._index[piece.base]

    # -- allocation -------------------------------------------------------------------

    def allocate(self, lease: Lease, target_blocks: int, reuse: Lease | None = None) -> bool:
        """Grow ``lease`` to ``target_blocks`` blocks, all or nothing.

        ``reuse`` (cached blocks from :meth:`lookup`, for an empty lease) are referenced
        first; the rest are fresh blocks, taken from the free blocks and then by evicting
        the least recently released cached blocks. Returns False and leaves the lease and
        the pool untouched when the pool cannot supply the blocks.
        """
        reused = len(reuse) if reuse is not None else 0
        fresh = target_blocks - len(lease) - reused
        if fresh < 0:
            fresh = 0
        if fresh and not self.fits(fresh, reuse):
            return False
        if reuse:
            for ext, lo, hi in reuse.runs:
                self._reference(ext, lo, hi)
            lease.extend(reuse)
        if fresh:
            self._take_fresh(lease, fresh)
        return True

    def _reference(self, ext: _Extent, lo: int, hi: int) -> None:
        """One more reference to each of ``ext``'s blocks ``lo .. hi - 1``; inactive ones
        leave the LRU (their release run counts them stale)."""
        inactive = ext.ref.count(lo, hi, 0)
        if inactive:
            self._unstamp(ext, lo, hi, inactive)
        ext.ref.shift(lo, hi, 1)

    def _unstamp(self, ext: _Extent, lo: int, hi: int, inactive: int) -> None:
        """``inactive`` of blocks ``lo .. hi - 1`` become active: they leave their
        release runs."""
        for a, b, run in ext.stamp.runs(lo, hi):
            if run is not None:
                run.stale += b - a
        ext.stamp.assign(lo, hi, None)
        self._num_inactive -= inactive
        self._num_active += inactive

    def _take_fresh(self, lease: Lease, count: int) -> None:
        """Append ``count`` fresh blocks to ``lease``, evicting the least recently
        released cached blocks for those the free blocks cannot supply (the caller has
        checked they exist)."""
        evict = count + self._num_active + self._num_inactive - self.num_blocks
        if evict > 0:
            self._evict(evict)
        self._num_active += count
        if lease.runs:  # extend the extent the lease ends with, if it is its only holder
            ext, _, end = lease.runs[-1]
            if (self._extents.get(ext.key) is ext and end == ext.size and ext.ref.last() == 1
                    and end + count <= self.num_blocks):
                ext.grow(lease, count)
                return
        key = self._next_key
        self._next_key = key + 1
        ext = self._extents[key] = _Extent(key, key * self.num_blocks)
        ext.grow(lease, count)

    def _evict(self, count: int) -> None:
        """Evict ``count`` inactive blocks in LRU order, dropping their identities."""
        lru = self._lru
        while count:
            run = lru[0]
            ext, lo, hi = run.ext, run.lo, run.hi
            if run.stale:
                # Some were referenced or forgotten since that release: keep the blocks
                # still inactive from it, as maximal runs in the same (top-down) order.
                lru.popleft()
                lru.extendleft(self._split(run))
                continue
            take = min(count, hi - lo)
            cut = hi - take
            if self.on_evict is not None:
                self._report_evicted(ext, cut, hi, self.on_evict)
            self._unname(ext, cut, hi)
            ext.stamp.assign(cut, hi, None)
            self._retire(ext, take)
            self._num_inactive -= take
            count -= take
            if cut == lo:
                lru.popleft()
            else:
                run.hi = cut

    @staticmethod
    def _report_evicted(ext: _Extent, lo: int, hi: int,
                        hook: Callable[[int, int, int], None]) -> None:
        """Hand ``hook`` the identities of inactive blocks ``lo .. hi - 1`` of ``ext`` (all
        named), a piece at a time, top down."""
        for a, b, piece in reversed(ext.piece.runs(lo, hi)):
            assert piece is not None, "an inactive block without an identity"
            hook(piece.base, piece.off + a - piece.lo, piece.off + b - piece.lo)

    @staticmethod
    def _split(run: _Released) -> list[_Released]:
        """The blocks still stamped ``run``, as new release runs, bottom first."""
        ext = run.ext
        parts: list[_Released] = []
        for lo, hi, held in ext.stamp.runs(run.lo, run.hi):
            if held is run:
                part = _Released(ext, lo, hi)
                ext.stamp.assign(lo, hi, part)
                parts.append(part)
        return parts

    def _retire(self, ext: _Extent, count: int) -> None:
        """``count`` blocks of ``ext`` stop being active or inactive (freed or evicted)."""
        ext.live -= count
        if not ext.live:
            del self._extents[ext.key]
            ext.clear()

    def fits(self, fresh: int, reuse: Lease | None = None) -> bool:
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
        piece = ext.piece.get(offset)
        if piece is None or piece.identity(offset) != identity:
            return
        self._unname(ext, offset, offset + 1)
        run = ext.stamp.get(offset)
        if run is None:  # active
            ext.forgotten = max(ext.forgotten, offset + 1)
        else:  # inactive
            run.stale += 1
            ext.stamp.assign(offset, offset + 1, None)
            self._num_inactive -= 1
            self._retire(ext, 1)

    def release(self, lease: Lease) -> None:
        """Drop ``lease``'s references, leaf first; the lease is left empty."""
        released: list[_Released] = []  # the new release runs, leaf first
        dropped = cached = 0
        for ext, lo, hi in reversed(lease.runs):
            held = ext.ref.runs(lo, hi)
            ext.ref.shift(lo, hi, -1)
            for a, b, r in reversed(held):  # by stretches, top down
                if r == 1:  # the last reference
                    dropped += b - a
                    cached += self._settle(ext, a, b, released)
        self._num_active -= dropped
        self._num_inactive += cached
        self._lru.extend(released)
        lease.clear()
        if len(self._lru) > 2 * self._num_inactive + 64:
            # Runs invalidated lazily would pile up while nothing is evicted.
            self._lru = deque(run for run in self._lru if run.hi - run.lo > run.stale)

    def _settle(self, ext: _Extent, lo: int, hi: int, released: list[_Released]) -> int:
        """Blocks ``lo .. hi - 1`` of ``ext`` lost their last reference: named ones become
        inactive (a release run per stretch, top down, appended to ``released``),
        anonymous ones retire. Returns how many became inactive.

        Retired blocks at the end of the extent that never had an identity (none was
        forgotten while held: an evicted block retires elsewhere) are dropped from it:
        their offsets, and ids, are handed out again (nobody holds an identity of them),
        so the lease that reuses the blocks below them next (a session's next turn
        recomputing this turn's partial last block) grows the extent instead of starting
        one, and stays one run. Not with a host tier listening, whose runs follow
        the pieces an eviction reports, which would merge across such a seam."""
        cached = retired = 0
        for bottom, top, named in reversed(ext.named.runs(lo, hi)):
            if not named:
                retired += top - bottom
                if (top == ext.size and bottom >= ext.forgotten
                        and self.on_evict is None):
                    ext.truncate(bottom)
                continue
            cached += top - bottom
            last = released[-1] if released else None
            if last is not None and last.ext is ext and last.lo == top:
                last.lo = bottom
            else:
                last = _Released(ext, bottom, top)
                released.append(last)
            ext.stamp.assign(bottom, top, last)
        if retired:
            self._retire(ext, retired)
        return cached

    # -- invariants -------------------------------------------------------------------

    def problems(self) -> Iterator[tuple[str, str]]:
        """Broken invariants as ``(kind, detail)``, kind one of ``pool-totals``,
        ``block-refcount`` and ``prefix-index`` (the auditor reports them; O(pool))."""
        active = inactive = named = 0
        for key, ext in self._extents.items():
            size = ext.size
            if (ext.key != key or ext.base != key * self.num_blocks or size > self.num_blocks
                    or not ext.well_formed()):
                yield "pool-totals", f"extent {key} is malformed"
            live = 0
            for offset, (r, piece, run) in enumerate(zip(ext.ref.expand(), ext.piece.expand(),
                                                         ext.stamp.expand(), strict=True)):
                block = ext.base + offset
                if r < 0:
                    yield "block-refcount", f"block {block} has reference count {r}"
                if r > 0:
                    active += 1
                elif piece is not None:
                    inactive += 1
                live += r > 0 or piece is not None
                if (run is not None) != (r == 0 and piece is not None):
                    yield "pool-totals", (f"block {block} is {'' if run else 'not '}in the "
                                          "LRU")
                if piece is not None:
                    named += 1
                    if not (piece.ext is ext and piece.lo <= offset < piece.hi
                            and piece in self._index.get(piece.base, ())):
                        yield "prefix-index", (f"block {block} carries identity "
                                               f"{piece.identity(offset)}, which the index "
                                               "does not answer with it")
            if live != ext.live or not live:
                yield "pool-totals", (f"extent {key} counts {ext.live} live blocks but has "
                                      f"{live}")
        yield from self._index_problems(named)
        if (active, inactive) != (self._num_active, self._num_inactive):
            yield "pool-totals", (f"{self._num_active} blocks counted active and "
                                  f"{self._num_inactive} cached, but {active} are active "
                                  f"and {inactive} cached")
        if active + inactive > self.num_blocks:
            yield "pool-totals", (f"active {active} + cached {inactive} blocks, the pool has "
                                  f"{self.num_blocks}")
        listed = 0
        for run in self._lru:
            held = run.ext.stamp.count(run.lo, run.hi, run)
            if not 0 <= run.lo < run.hi <= run.ext.size or (
                    held != run.hi - run.lo - run.stale):
                yield "pool-totals", (f"release run {run.ext.key}:{run.lo}-{run.hi} holds "
                                      f"{held} blocks, {run.stale} counted stale")
            listed += held
        if listed != inactive:
            yield "pool-totals", f"the LRU holds {listed} blocks, {inactive} are cached"

    def _index_problems(self, named: int) -> Iterator[tuple[str, str]]:
        """Pieces that overlap, are empty, or miss their blocks; ``named`` blocks carry an
        identity."""
        indexed = 0
        for base, pieces in self._index.items():
            spans = sorted((piece.off, piece.off + piece.hi - piece.lo) for piece in pieces)
            if not pieces or any(a >= b for a, b in spans) or any(
                    spans[i][1] > spans[i + 1][0] for i in range(len(spans) - 1)):
                yield "prefix-index", f"the pieces of run {base} are empty or overlap"
            for piece in pieces:
                indexed += piece.hi - piece.lo
                if piece.ext.piece.count(piece.lo, piece.hi, piece) != piece.hi - piece.lo:
                    yield "prefix-index", (f"a piece of run {base} lists blocks that do not "
                                           "answer through it")
        if named != indexed:
            yield "prefix-index", (f"{named} blocks carry an identity but {indexed} "
                                   "identities answer lookups")

    def check(self) -> None:
        """Assert the pool's internal invariants (tests; O(pool))."""
        broken = list(self.problems())
        assert not broken, broken
