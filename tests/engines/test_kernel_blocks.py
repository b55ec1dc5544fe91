"""Block pool: states, atomic allocation, publication and LRU eviction order (spec §5.5)."""

from __future__ import annotations

from servesim.engines.kernel.blocks import BlockPool, Lease
from servesim.engines.kernel.tokens import BlockIds, Segment, block_hashes, block_ids, make_prompt


def _hashes(*segs: tuple[int, int]) -> BlockIds:
    ids = BlockIds()
    block_ids(make_prompt([Segment(k, n, repeat=False) for k, n in segs]), 4, ids)
    return ids


def test_lru_evicts_oldest_release_batch_first_and_suffix_before_prefix() -> None:
    # Spec case 32: pool of 10 blocks of 4 tokens.
    pool = BlockPool(10, 4)
    a = _hashes((1, 17))  # A: 15 prompt + 2 generated tokens -> full blocks 0-3, 1 partial
    b = _hashes((1, 10), (2, 4))  # B: 14 tokens sharing A's first 10
    lease_a = Lease()
    assert pool.allocate(lease_a, 5)
    pool.publish(lease_a, a, 0, 4)
    assert pool.num_active == 5

    hits = pool.lookup(b, len(b))
    assert len(hits) == 2  # 8 tokens: blocks 0-1 (block 2 holds A's 10,11 vs B's own)
    lease_b = Lease()
    assert pool.allocate(lease_b, 4, reuse=hits)  # new_blocks = 2
    pool.publish(lease_b, b, 2, 3)
    assert pool.num_active == 7

    pool.release(lease_a)
    assert (pool.num_active, pool.num_inactive) == (4, 2)  # A's blocks 2 and 3
    pool.release(lease_b)
    assert (pool.num_active, pool.num_inactive) == (0, 5)
    pool.check()

    survivors_before = pool.cached_identities()
    lease_c = Lease()
    assert pool.allocate(lease_c, 9)  # 36 tokens: 5 free slots first, then 4 evictions
    evicted = survivors_before - pool.cached_identities()
    # Evicted in order: A block 3, A block 2, B's divergent block 2, shared block 1.
    assert evicted == {a[3], a[2], b[2], a[1]}
    assert pool.cached_identities() == {a[0]}
    # The eviction order itself, one block at a time:
    pool2 = _replay_case_32()
    order = []
    for _ in range(4):
        before = pool2.cached_identities()
        assert pool2.allocate(Lease(), 1)
        (gone,) = before - pool2.cached_identities()
        order.append(gone)
    assert order == [a[3], a[2], b[2], a[1]]
    pool.check()


def _replay_case_32() -> BlockPool:
    """Case 32's pool after A and B finished, with the 5 free slots already taken."""
    pool = BlockPool(10, 4)
    a = _hashes((1, 17))
    b = _hashes((1, 10), (2, 4))
    la = Lease()
    pool.allocate(la, 5)
    pool.publish(la, a, 0, 4)
    lb = Lease()
    pool.allocate(lb, 4, reuse=pool.lookup(b, 3))
    pool.publish(lb, b, 2, 3)
    pool.release(la)
    pool.release(lb)
    assert pool.allocate(Lease(), 5)
    assert pool.num_free == 0
    return pool


def _published(pool: BlockPool, ids: BlockIds, count: int) -> Lease:
    """A lease of ``count`` fresh blocks, published under ``ids``."""
    lease = Lease()
    assert pool.allocate(lease, count)
    pool.publish(lease, ids, 0, count)
    return lease


def test_release_keeps_the_parent_when_a_leaf_is_evicted() -> None:
    # Spec case 33.
    pool = BlockPool(2, 4)
    h = _hashes((1, 8))
    lease = _published(pool, h, 2)
    pool.release(lease)
    assert pool.allocate(Lease(), 1)  # an unrelated 1-block request
    assert len(pool.lookup(h, 2)) == 1  # the parent survives, the leaf is gone
    pool.check()


def test_allocation_is_atomic() -> None:
    pool = BlockPool(4, 4)
    held = Lease()
    assert pool.allocate(held, 3)
    lease = Lease()
    assert pool.allocate(lease, 1)
    before = list(lease)
    assert not pool.allocate(lease, 3)  # two more: none is free
    assert lease == before
    assert (pool.num_active, pool.num_free) == (4, 0)


def test_reusing_an_inactive_block_does_not_count_it_as_evictable() -> None:
    pool = BlockPool(2, 4)
    h = _hashes((1, 4))
    lease = Lease()
    pool.allocate(lease, 1)
    pool.publish(lease, h, 0, 1)
    pool.release(lease)  # 1 inactive, 1 free
    hits = pool.lookup(h, 1)
    assert not pool.allocate(lease, 3, reuse=hits)  # needs 2 fresh, only 1 free
    assert lease == [] and pool.num_inactive == 1
    assert pool.allocate(lease, 2, reuse=hits)
    assert pool.num_active == 2
    pool.check()


def test_shared_blocks_are_ref_counted_and_duplicates_stay_anonymous() -> None:
    pool = BlockPool(8, 4)
    h = _hashes((1, 8))
    a = Lease()
    pool.allocate(a, 2)
    pool.publish(a, h, 0, 2)
    b = Lease()
    pool.allocate(b, 2, reuse=pool.lookup(h, 1))  # shares block 0, recomputes block 1
    pool.publish(b, h, 1, 2)  # duplicate identity: A's block keeps answering lookups
    assert b[0] == a[0] and b[1] != a[1]
    assert pool.lookup(h, 2) == a
    pool.release(a)
    assert pool.is_active(b[0]) and pool.num_inactive == 1
    pool.release(b)
    assert pool.num_inactive == 2 and pool.num_free == 6  # B's duplicate went back free
    pool.check()


def test_a_fully_evicted_pool_reuses_every_block() -> None:
    pool = BlockPool(3, 2)
    for key in range(5):
        h = block_hashes(make_prompt([Segment(key, 6, repeat=False)]), 2)
        lease = Lease()
        assert pool.allocate(lease, 3)
        pool.publish(lease, h, 0, 3)
        pool.release(lease)
        pool.check()
    assert pool.num_inactive == 3 and pool.num_active == 0


def test_a_block_reused_over_and_over_keeps_the_lru_small() -> None:
    # Each reuse invalidates the block's release run lazily; with nothing ever evicted the
    # stale runs are dropped once they outnumber the cached blocks.
    pool = BlockPool(4, 4)
    h = _hashes((1, 4))
    lease = Lease()
    pool.allocate(lease, 1)
    pool.publish(lease, h, 0, 1)
    pool.release(lease)
    for _ in range(1000):
        assert pool.allocate(lease, 2, reuse=pool.lookup(h, 1))
        pool.release(lease)
        pool.check()
    assert len(pool._lru) <= 2 * pool.num_inactive + 64
    assert (pool.num_active, pool.num_inactive, pool.num_free) == (0, 1, 3)


def test_a_lease_grown_block_by_block_is_one_run() -> None:
    # Decode steps grow a lease one block at a time: its blocks stay one extent, so
    # publishing and releasing it work on one run, and the LRU order is still leaf first.
    pool = BlockPool(16, 4)
    h = _hashes((1, 32))
    lease = Lease()
    for n in range(1, 9):
        assert pool.allocate(lease, n)
        pool.publish(lease, h, n - 1, n)
    assert lease == list(range(lease[0], lease[0] + 8))
    assert len(lease.runs) == 1
    pool.release(lease)
    assert pool.allocate(lease, 8 + 3)  # 8 free blocks, then 3 evictions: the leaves
    assert pool.cached_identities() == set(h[:5])
    pool.check()


# -- runs of consecutive identities (a run of one segment) -------------------------------


def _run(first: int, n: int) -> list[int]:
    """Identities of ``n`` blocks inside one run: consecutive."""
    return list(range(first, first + n))


def _computed(pool: BlockPool, h: list[int]) -> Lease:
    """A lease of ``len(h)`` fresh blocks, computed and published under ``h``."""
    lease = Lease()
    assert pool.allocate(lease, len(h))
    pool.publish(lease, h, 0, len(h))
    return lease


def test_a_duplicate_run_stays_anonymous_and_the_first_copy_answers() -> None:
    pool = BlockPool(32, 4)
    h = _run(1000, 8)
    a = _computed(pool, h)
    b = Lease()
    assert pool.allocate(b, 12)  # computed independently: the same run, then 4 more
    longer = _run(1000, 12)
    pool.publish(b, longer, 0, 6)
    pool.publish(b, longer, 6, 12)  # the chunk boundary falls inside the run
    assert [pool.identity(x) for x in b] == [None] * 8 + longer[8:]
    assert pool.lookup(longer, 12) == [*a, *b[8:]]  # a's blocks, then b's own
    pool.release(b)
    assert pool.num_inactive == 4 and pool.num_free == 32 - 8 - 4
    pool.check()


def test_a_lookup_may_enter_a_run_anywhere() -> None:
    pool = BlockPool(16, 4)
    h = _run(500, 8)
    a = _computed(pool, h)
    assert pool.lookup(h[3:], 8) == a[3:]
    assert pool.lookup([7, *h[3:]], 8) == []
    assert pool.lookup([*h[:3], 7, *h[4:]], 8) == a[:3]
    pool.check()


def test_forgetting_a_block_inside_a_run_keeps_the_blocks_above_findable() -> None:
    pool = BlockPool(16, 4)
    h = _run(700, 8)
    a = _computed(pool, h)
    pool.forget(a[3], h[3])
    assert pool.lookup(h, 8) == a[:3]
    assert pool.lookup(h[4:], 4) == a[4:]
    assert pool.cached_identities() == set(h) - {h[3]}
    pool.check()
    blocks = list(a)
    pool.release(a)  # the anonymous block is freed, the others cached
    assert (pool.num_inactive, pool.num_free) == (7, 9)
    a2 = Lease()
    assert pool.allocate(a2, 1)
    pool.publish(a2, h[3:4], 0, 1)  # another block answers h[3]: the run is whole again
    assert pool.lookup(h, 8) == [*blocks[:3], *a2, *blocks[4:]]
    pool.check()


def test_evicting_the_bottom_of_a_run_keeps_its_top() -> None:
    pool = BlockPool(8, 4)
    h = _run(900, 8)
    a = _computed(pool, h)
    b = Lease()
    assert pool.allocate(b, 4, reuse=pool.lookup(h[4:], 4))  # holds the top half
    pool.release(a)  # the bottom half becomes evictable
    assert pool.allocate(Lease(), 4)  # evicts it
    assert pool.cached_identities() == set(h[4:])
    assert pool.lookup(h, 8) == []
    assert pool.lookup(h[4:], 4) == b
    pool.check()
    held = list(b)
    pool.release(b)
    assert pool.allocate(Lease(), 2)  # evicts the top of what is left: h[7], h[6]
    assert pool.lookup(h[4:], 4) == held[:2]
    pool.check()


def test_evicting_inside_a_released_run_splits_it() -> None:
    # Two leases share the first blocks of a run; the second's own blocks continue it in
    # another extent. Evicting from the top keeps the rest findable at each step.
    pool = BlockPool(12, 4)
    h = _run(300, 10)
    a = _computed(pool, h[:6])
    b = Lease()
    assert pool.allocate(b, 10, reuse=pool.lookup(h, 4))
    pool.publish(b, h, 4, 10)  # h[4], h[5] are a's: b's copies stay anonymous
    answering = [*a, *b[6:]]
    assert pool.lookup(h, 10) == answering
    pool.release(b)
    pool.release(a)
    for left in range(10, 0, -1):
        assert pool.lookup(h, 10) == answering[:left]
        pool.check()
        assert pool.allocate(Lease(), pool.num_free + 1)
    assert pool.lookup(h, 10) == []


def test_arbitrary_identities_such_as_state_ones_answer_one_by_one() -> None:
    pool = BlockPool(8, 4)
    ids = [hash(("state", 17, s)) for s in range(4)]
    ids[2] = ids[1] + 1  # a chance neighbour is no run
    lease = Lease()
    assert pool.allocate(lease, 4)
    pool.publish(lease, ids, 0, 4)
    assert pool.lookup(ids, 4) == lease
    pool.forget(lease[1], ids[1])
    assert pool.lookup(ids, 4) == lease[:1]
    assert pool.lookup(ids[2:], 2) == lease[2:]
    pool.check()


def test_one_token_blocks_cost_per_run_not_per_block() -> None:
    # SGLang's page size of one token: a 3-run prompt of 3,000 blocks is three pieces, a
    # second request reusing its first 2,500 blocks shares them, and releasing both keeps
    # every block findable, leaf first.
    pool = BlockPool(8_000, 1)
    prompt = make_prompt([Segment(1, 1_000), Segment(2, 1_000), Segment(3, 1_000)])
    ids = BlockIds()
    block_ids(prompt, 1, ids)
    assert len(ids) == 3_000 and len(ids.ends) == 3
    a = Lease()
    assert pool.allocate(a, 3_000)
    pool.publish(a, ids, 0, 3_000)
    assert len(a.runs) == 1 and sum(len(p) for p in pool._index.values()) == 3
    hits = pool.lookup(ids, 2_500)
    assert len(hits) == 2_500 and len(hits.runs) == 1
    b = Lease()
    assert pool.allocate(b, 2_600, reuse=hits)
    assert pool.num_active == 3_100
    pool.release(a)  # blocks 2,500 .. 2,999 lose their last reference
    assert (pool.num_active, pool.num_inactive) == (2_600, 500)
    pool.release(b)  # its 100 own blocks were never published: they are freed
    assert (pool.num_active, pool.num_inactive) == (0, 3_000)
    assert pool.lookup(ids, 3_000) == list(range(3_000))
    assert pool.allocate(Lease(), 8_000 - 3_000 + 10)  # evicts the last 10 blocks
    assert len(pool.lookup(ids, 3_000)) == 2_990
    pool.check()


def test_a_partial_last_block_is_regrown_by_the_lease_reusing_the_blocks_below_it() -> None:
    """A released lease's last block never had an identity: the next lease reusing the
    blocks below it takes its place (the same id), so that lease is one run; a block that
    once had one (here forgotten while held) never gives its id away."""
    pool = BlockPool(8, 4)
    ids = _hashes((1, 12))
    first = Lease()
    assert pool.allocate(first, 3)
    pool.publish(first, ids, 0, 2)  # the third block stays partial, anonymous
    blocks = first.blocks()
    known = pool.answering(first, 3)
    assert known.blocks() == blocks[:2]
    pool.release(first)
    hits = pool.lookup(ids, 3, known)
    assert hits == blocks[:2] == pool.lookup(ids, 3)
    second = Lease()
    assert pool.allocate(second, 3, reuse=hits)
    assert second.blocks() == blocks and len(second.runs) == 1
    pool.publish(second, ids, 2, 3)
    pool.forget(blocks[2], ids[2])  # anonymous again, but it had an identity
    pool.release(second)
    pool.check()
    third = Lease()
    assert pool.allocate(third, 3, reuse=pool.lookup(ids, 3))
    assert third.blocks()[:2] == blocks[:2] and third.blocks()[2] != blocks[2]
    assert len(third.runs) == 2
    pool.check()


def test_a_lookup_resumes_after_known_blocks_only_while_all_still_answer() -> None:
    pool = BlockPool(4, 4)
    ids = _hashes((1, 16))
    lease = _published(pool, ids, 4)
    known = pool.answering(lease, 4)
    pool.release(lease)
    assert pool.lookup(ids, 4, known) == known.blocks()
    assert pool.lookup(ids, 2, known) == known.blocks()[:2]
    other = Lease()
    assert pool.allocate(other, 1)  # evicts the leaf block
    assert pool.lookup(ids, 4, known) == pool.lookup(ids, 4) == known.blocks()[:3]
    pool.release(other)
    pool.forget(known.blocks()[0], ids[0])  # the first block no longer answers
    assert len(pool.lookup(ids, 4, known)) == 0
    pool.check()
