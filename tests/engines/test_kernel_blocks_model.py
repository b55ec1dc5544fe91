"""The block pool against a plain model of its rules, over random operation sequences.

The model keeps the same state in the most direct form (one loop per block, ids reused
from a free list) and is the definition the pool's run-based operations must match
exactly: same leases (block for block, up to the ids the pool gives its blocks), same
counters, same cached identities and lookups, same LRU order.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.blocks import BlockPool, Lease
from servesim.engines.kernel.tokens import BlockIds


class ModelPool:
    """Free list (last released first), never-used ids, LRU of released cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.ref: dict[int, int] = {}
        self.ident: dict[int, int] = {}
        self.index: dict[int, int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.free: list[int] = []
        self.unused = 0

    def available(self, reuse: Sequence[int]) -> int:
        inactive_reused = sum(1 for b in reuse if self.ref.get(b, 0) == 0)
        return len(self.free) + self.num_blocks - self.unused + len(self.lru) - inactive_reused

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        out = []
        for h in hashes[:max_blocks]:
            if h not in self.index:
                break
            out.append(self.index[h])
        return out

    def publish(self, lease: list[int], hashes: Sequence[int], start: int, end: int) -> None:
        for i in range(start, end):
            if hashes[i] not in self.index:
                self.index[hashes[i]] = lease[i]
                self.ident[lease[i]] = hashes[i]

    def allocate(self, lease: list[int], target: int, reuse: Sequence[int] = ()) -> bool:
        fresh = max(target - len(lease) - len(reuse), 0)
        if fresh and fresh > self.available(reuse):
            return False
        for b in reuse:
            if self.ref.get(b, 0) == 0:
                del self.lru[b]
            self.ref[b] = self.ref.get(b, 0) + 1
            lease.append(b)
        for _ in range(fresh):
            if self.free:
                b = self.free.pop()
            elif self.unused < self.num_blocks:
                b = self.unused
                self.unused += 1
            else:
                b, _ = self.lru.popitem(last=False)
                h = self.ident.pop(b)
                if self.index.get(h) == b:
                    del self.index[h]
            self.ref[b] = 1
            lease.append(b)
        return True

    def release(self, lease: list[int]) -> None:
        for b in reversed(lease):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                del self.ref[b]
                if b in self.ident:
                    self.lru[b] = None
                else:
                    self.free.append(b)
        lease.clear()

    def forget(self, block: int, identity: int) -> None:
        if self.ident.get(block) != identity:
            return
        del self.ident[block]
        if self.index.get(identity) == block:
            del self.index[identity]
        if block in self.lru:
            del self.lru[block]
            self.free.append(block)


# An operation: (kind, holder, size, prefix family); holders of one family share prefix
# identities (family 2: identities collide inside a prompt too).
OPS = st.lists(st.tuples(st.sampled_from(["alloc", "alloc", "grow", "publish", "release",
                                          "forget"]),
                         st.integers(0, 3), st.integers(0, 9), st.integers(0, 2)),
               min_size=20, max_size=80)


def _identities(family: int, holder: int, n: int) -> BlockIds:
    """Runs as prompts give them: a family's first blocks are one run common to its
    holders, then each holder's own run; family 2 has colliding identities (two blocks of
    a prompt share each one, each its own run)."""
    if family == 2:
        return BlockIds.of(2000 + i // 2 for i in range(n))
    ids = BlockIds()
    shared = 3 + family
    ids.add(family * 1000, family * 1000, shared)
    own = family * 1000 + 100 * (holder + 1) + shared
    ids.add(own, own, n - shared)
    return ids


@settings(max_examples=400, deadline=None)
@given(st.integers(1, 16), OPS)
def test_the_pool_follows_the_model(num_blocks: int, ops: list[tuple[str, int, int, int]]) -> None:
    pool, model = BlockPool(num_blocks, 4), ModelPool(num_blocks)
    leases: dict[int, tuple[Lease, list[int], BlockIds]] = {}  # pool, model, hashes
    named: dict[int, int] = {}  # pool block -> the model block at the same place
    known: dict[int, Lease] = {}  # holder -> what answered its identities at its release
    for kind, holder, size, family in ops:
        if holder not in leases:
            leases[holder] = (Lease(), [], _identities(family, holder, 12))
        lp, lm, hashes = leases[holder]
        held = len(lp)
        if kind == "alloc" and not lp:
            hits = pool.lookup(hashes, size)
            model_hits = model.lookup(hashes, size)
            assert [named[b] for b in hits] == model_hits
            # resuming after the blocks that answered at the holder's last release (since
            # evicted, forgotten or not) finds the same blocks
            assert pool.lookup(hashes, size, known.get(holder)) == hits
            assert pool.allocate(lp, size, reuse=hits) == model.allocate(lm, size,
                                                                         reuse=model_hits)
        elif kind == "grow" and lp:
            target = min(len(lp) + size % 4, len(hashes))
            assert pool.allocate(lp, target) == model.allocate(lm, target)
        elif kind == "publish" and lp:
            end = min(len(lp), size + 1)
            pool.publish(lp, hashes, 0, end)
            model.publish(lm, hashes.as_list(), 0, end)
        elif kind == "release":
            known[holder] = pool.answering(lp, len(lp))
            pool.release(lp)
            model.release(lm)
        elif kind == "forget" and lp:
            i = size % len(lp)
            pool.forget(lp[i], hashes[i])
            model.forget(lm[i], hashes[i])
        named.update(zip(lp[held:], lm[held:], strict=True))  # fresh blocks got their ids
        assert [named[b] for b in lp] == lm
        assert pool.num_active == len(model.ref)
        assert pool.num_inactive == len(model.lru)
        assert pool.num_free == len(model.free) + num_blocks - model.unused
        assert pool.cached_identities() == set(model.index)
        for lp, lm, _ in leases.values():
            for block, model_block in zip(lp, lm, strict=True):
                assert pool.identity(block) == model.ident.get(model_block)
                assert pool.is_active(block)
        assert pool.count_active(pool.lookup(hashes, 12)) == sum(
            b in model.ref for b in model.lookup(hashes, 12))
        pool.check()
    # the LRU order: evicting one block at a time drops the model's identities in order
    while pool.num_free < pool.num_available:
        before = pool.cached_identities()
        assert pool.allocate(Lease(), pool.num_free + 1)
        assert model.allocate([], len(model.free) + num_blocks - model.unused + 1)
        gone = before - pool.cached_identities()
        assert len(gone) == 1 and gone == before - set(model.index)
        pool.check()
