"""Per-request recurrent state of hybrid models, kept in the token block pool (spec §5.8).

A hybrid model (linear attention / SSM layers beside full attention) carries one state
per request. Every request that computes tokens owns a *working state* of
``state_blocks`` blocks taken from the same :class:`BlockPool` as its token KV; the
working state is a plain lease held beside the token lease.

Prefix reuse needs more than token KV: a request can resume at boundary ``L`` only if a
*snapshot* of the state after exactly ``L`` tokens exists. Snapshots are blocks with a
cache identity ``hash((tag, prefix identity at L, L, slot))``, one per state block
("slot"); a snapshot is restorable only while all its slots are cached. They are
evicted like any other cached block.

Life cycle of one request's states (one :class:`RequestState`):

* a step that ends exactly on a checkpoint boundary *publishes* the working state as the
  snapshot of that boundary (aliasing: no copy, no extra block);
* the next write to a published working state first keeps the published blocks as a
  checkpoint (held by the request) and takes ``state_blocks`` fresh blocks for the new
  working state: the transition peak. When the pool could never hold that peak for the
  request, the checkpoint is dropped instead (the working state is overwritten in
  place), so a lone request can always progress;
* a step that ends on a new boundary discards the previous checkpoint of the same kind;
  a step that ends off-boundary releases held checkpoints to the cache (inactive,
  evictable, still restorable). So a request retains at most one checkpoint per kind —
  the latest block-aligned one and, when the match unit is finer than a block, the
  latest unit-aligned one — plus its final published state.
* preemption and completion release the working state (kept as a cached snapshot if it
  is published) and every held checkpoint.

Publication happens when a pass ends (the scheduler calls :meth:`StateCache.end_step`
from its emission phase), so a checkpoint published in a pass is restorable from the
next pass only, and a request preempted during the pass never publishes.

Every operation costs O(state_blocks) plus the blocks it touches;
:meth:`StateCache.joint_hit` costs O(candidate boundaries) index probes.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from servesim.engines.kernel.blocks import BlockPool, Lease

_TAG = 0x5747A7E  # keeps snapshot identities apart from token-block identities


@attrs.define(slots=True, eq=False)
class Checkpoint:
    """A retained snapshot of one request: its blocks and the identities they carry."""

    boundary: int
    aligned: bool  # on a token-block boundary (else only on a match-unit boundary)
    blocks: Lease
    identities: list[int]  # identities[i] was given to blocks[i]; 0 = stayed anonymous
    held: bool  # the request still references the blocks


@attrs.define(slots=True, eq=False)
class RequestState:
    """State-cache holdings of one request on one rank."""

    working: Lease = attrs.field(factory=Lease)  # lease of state_blocks, or empty
    published_at: int = -1  # boundary the working state is published as, -1 if none
    published_ids: list[int] = attrs.field(factory=list)
    retained: list[Checkpoint] = attrs.field(factory=list)


class StateCache:
    """State-cache bookkeeping of one rank, on top of that rank's block pool."""

    __slots__ = ("block_size", "pool", "state_blocks", "unit")

    def __init__(self, pool: BlockPool, state_blocks: int, unit: int | None = None) -> None:
        if state_blocks < 1:
            raise ValueError("a state cache needs state_blocks >= 1")
        self.pool = pool
        self.state_blocks = state_blocks
        self.block_size = pool.block_size
        self.unit = unit or pool.block_size
        if self.block_size % self.unit:
            raise ValueError("the checkpoint unit must divide the block size")

    # -- identities ---------------------------------------------------------------------

    def snapshot_ids(self, prefix_identity: int, boundary: int) -> list[int]:
        """Identities of the ``state_blocks`` slots of the snapshot at ``boundary``."""
        return [hash((_TAG, prefix_identity, boundary, s)) for s in range(self.state_blocks)]

    def is_boundary(self, tokens: int) -> bool:
        return tokens > 0 and tokens % self.unit == 0

    def has_snapshot(self, prefix_identity: int, boundary: int) -> bool:
        """True if every slot of the snapshot at ``boundary`` is cached (active or not)."""
        ids = self.snapshot_ids(prefix_identity, boundary)
        return len(self.pool.lookup(ids, len(ids))) == len(ids)

    # -- restore ------------------------------------------------------------------------

    def joint_hit(self, hit_blocks: int, bound: int,
                  prefix_identity: Callable[[int], int]) -> int:
        """The largest boundary ``L <= bound`` a request can resume at, or 0.

        ``hit_blocks`` leading token blocks of the request are cached; ``L`` needs those
        up to ``L`` (a unit boundary inside the first missing block is covered by its
        checkpoint) and a complete snapshot at ``L``. ``prefix_identity(L)`` is the
        request's token-prefix identity at ``L``.
        """
        unit, bs = self.unit, self.block_size
        top = min(bound, hit_blocks * bs + bs - 1)
        boundary = top // unit * unit
        while boundary > 0:
            if self.has_snapshot(prefix_identity(boundary), boundary):
                return boundary
            boundary -= unit
        return 0

    # -- the working state --------------------------------------------------------------

    def write_cost(self, rs: RequestState, token_blocks: int) -> tuple[int, bool]:
        """Fresh blocks the next write to ``rs``'s working state needs, and whether the
        published checkpoint is preserved (False: it is dropped, see the module doc)."""
        if not rs.working:
            return self.state_blocks, False
        if rs.published_at < 0:
            return 0, False
        if token_blocks + 2 * self.state_blocks <= self.pool.num_blocks:
            return self.state_blocks, True
        return 0, False

    def begin_write(self, rs: RequestState, preserve: bool) -> None:
        """Make the working state writable; the caller checked the pool fits the cost."""
        pool = self.pool
        if not rs.working:
            ok = pool.allocate(rs.working, self.state_blocks)
            assert ok, "begin_write without room for a working state"
            return
        if rs.published_at < 0:
            return
        boundary = rs.published_at
        if preserve:
            rs.retained.append(Checkpoint(
                boundary=boundary, aligned=boundary % self.block_size == 0,
                blocks=rs.working, identities=rs.published_ids, held=True))
            rs.working = Lease()
            ok = pool.allocate(rs.working, self.state_blocks)
            assert ok, "begin_write without room for the state transition"
        else:
            for block, ident in zip(rs.working.blocks(), rs.published_ids, strict=True):
                if ident:
                    pool.forget(block, ident)
        rs.published_at = -1
        rs.published_ids = []

    def end_step(self, rs: RequestState, computed: int, prefix_identity: int | None) -> None:
        """A step that wrote the working state ended with ``computed`` tokens.

        ``prefix_identity`` is the token-prefix identity at ``computed`` when that is a
        checkpoint boundary and checkpoints are kept (prefix caching), else None.
        """
        pool = self.pool
        if prefix_identity is not None and rs.working:
            aligned = computed % self.block_size == 0
            keep: list[Checkpoint] = []
            for ck in rs.retained:
                if ck.aligned == aligned:
                    self._discard(ck)
                else:
                    keep.append(ck)
            rs.retained = keep
            ids = self.snapshot_ids(prefix_identity, computed)
            pool.publish(rs.working, ids, 0, len(ids))
            rs.published_ids = [i if pool.identity(b) == i else 0
                                for b, i in zip(rs.working.blocks(), ids, strict=True)]
            rs.published_at = computed if any(rs.published_ids) else -1
        for ck in rs.retained:
            if ck.held:
                pool.release(ck.blocks.copy())
                ck.held = False

    def release(self, rs: RequestState, *, done: bool) -> None:
        """Preemption (``done=False``) or completion: drop every reference ``rs`` holds.

        A published working state stays cached as a snapshot; a completed request forgets
        its checkpoints (nobody will discard them), a preempted one keeps track of them
        so its next checkpoint still replaces them.
        """
        pool = self.pool
        for ck in rs.retained:
            if ck.held:
                pool.release(ck.blocks.copy())
                ck.held = False
        if rs.working:
            if rs.published_at >= 0 and not done:
                rs.retained.append(Checkpoint(
                    boundary=rs.published_at, aligned=rs.published_at % self.block_size == 0,
                    blocks=rs.working.copy(), identities=rs.published_ids, held=False))
            pool.release(rs.working)
        rs.published_at = -1
        rs.published_ids = []
        if done:
            rs.retained = []

    def _discard(self, ck: Checkpoint) -> None:
        pool = self.pool
        for block, ident in zip(ck.blocks.blocks(), ck.identities, strict=True):
            if ident:
                pool.forget(block, ident)
        if ck.held:
            pool.release(ck.blocks.copy())
            ck.held = False

    def held_blocks(self, rs: RequestState) -> int:
        """Blocks ``rs`` references (working state and held checkpoints; tests)."""
        return len(rs.working) + sum(len(ck.blocks) for ck in rs.retained if ck.held)
