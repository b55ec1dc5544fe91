"""The host (G2) pool of identity runs and the GPU pool's eviction hook that feeds it."""

from __future__ import annotations

import random

from servesim.engines.kernel.blocks import BlockPool, Lease
from servesim.engines.kernel.events import EventQueue
from servesim.engines.kernel.host_tier import HostPool, HostTier
from servesim.engines.kernel.tokens import BlockIds
from servesim.payload import HostOffloadArgs


def ids(*runs: tuple[int, int, int]) -> BlockIds:
    """Identities as runs ``(base, first offset, count)``."""
    out = BlockIds()
    for base, off, count in runs:
        out.add(base, base + off, count)
    return out


def held(pool: HostPool) -> set[tuple[int, int]]:
    return {(base, off) for base in (100, 200, 300) for off in range(20)
            if (base, off) in pool}


def test_store_and_match_by_runs() -> None:
    pool = HostPool(10)
    pool.store(100, 0, 4)
    assert pool.match(ids((100, 0, 6)), 0, 6) == 4
    assert pool.match(ids((100, 0, 6)), 2, 6) == 2  # from a later position
    assert pool.match(ids((100, 0, 6)), 4, 6) == 0
    pool.store(100, 4, 6)  # a second run continuing the first: a match crosses it
    assert pool.match(ids((100, 0, 6)), 0, 6) == 6
    assert pool.size == 6
    assert not list(pool.problems())


def test_a_match_continues_across_identity_runs() -> None:
    pool = HostPool(10)
    pool.store(100, 0, 2)
    pool.store(200, 0, 3)
    assert pool.match(ids((100, 0, 2), (200, 0, 3)), 0, 5) == 5
    assert pool.match(ids((100, 0, 2), (300, 0, 3)), 0, 5) == 2


def test_storing_held_blocks_refreshes_them_without_duplicates() -> None:
    pool = HostPool(10)
    pool.store(100, 2, 5)
    pool.store(100, 0, 8)  # overlaps: only offsets 0-1 and 5-7 are new
    assert pool.size == 8
    assert held(pool) == {(100, k) for k in range(8)}
    assert not list(pool.problems())


def test_lru_evicts_the_oldest_run_from_its_top_down() -> None:
    pool = HostPool(6)
    pool.store(100, 0, 3)
    pool.store(200, 0, 3)
    pool.store(300, 0, 2)  # evicts the two top blocks of the oldest run, 100
    assert held(pool) == {(100, 0), (200, 0), (200, 1), (200, 2), (300, 0), (300, 1)}
    assert pool.evicted == 2
    pool.match(ids((100, 0, 1)), 0, 1)  # a match makes run 100 the most recent
    pool.store(300, 2, 4)
    assert held(pool) == {(100, 0), (200, 0), (300, 0), (300, 1), (300, 2), (300, 3)}
    assert pool.size == 6
    assert not list(pool.problems())


def test_a_run_longer_than_the_pool_keeps_its_first_blocks() -> None:
    pool = HostPool(3)
    pool.store(100, 0, 8)
    assert held(pool) == {(100, 0), (100, 1), (100, 2)}


def test_random_operations_keep_the_invariants() -> None:
    rng = random.Random(7)
    pool = HostPool(12)
    for _ in range(400):
        base = rng.choice((100, 200, 300))
        lo = rng.randrange(0, 15)
        hi = lo + rng.randrange(1, 6)
        if rng.random() < 0.6:
            pool.store(base, lo, hi)
            # what was just stored is held, whatever it evicted
            assert all((base, k) in pool for k in range(lo, hi))
        else:
            found = pool.match(ids((base, lo, hi - lo)), 0, hi - lo)
            assert all((base, k) in pool for k in range(lo, lo + found))
            assert lo + found == hi or (base, lo + found) not in pool
        assert not list(pool.problems())
        assert pool.size <= 12
    assert len(held(pool)) == pool.size


def test_the_gpu_pool_reports_evicted_identity_runs() -> None:
    gpu = BlockPool(4, 16)
    evicted: list[tuple[int, int, int]] = []
    gpu.on_evict = lambda base, lo, hi: evicted.append((base, lo, hi))
    lease = Lease()
    assert gpu.allocate(lease, 4)
    gpu.publish(lease, ids((100, 0, 3), (200, 0, 1)), 0, 4)
    gpu.release(lease)
    other = Lease()
    assert gpu.allocate(other, 2)  # evicts the leaf first: 200/0, then 100/2
    assert evicted == [(200, 0, 1), (100, 2, 3)]
    gpu.check()


def test_the_tier_writes_back_on_flush_and_stores_on_arrival() -> None:
    events: EventQueue = EventQueue()
    now = [0.0]
    woken: list[bool] = []
    tier = HostTier(HostOffloadArgs(capacity_blocks=8, bandwidth_gb_per_second=1.0),
                    1_000_000, events, lambda: now[0], lambda: woken.append(True))
    tier.evicted(100, 0, 2)
    tier.evicted(200, 0, 1)
    tier.flush()
    assert tier.pool.size == 0  # not there before the copy arrives
    t, _, transfer = events.pop()
    assert t == 3.0  # 3 blocks of 1 MB at 1 GB/s
    now[0] = t
    transfer.link.finish(transfer, t)
    assert tier.pool.size == 3 and tier.written_back_blocks == 3
    assert tier.write_back_ms == 3.0
    done: list[float] = []
    tier.load(key=1, blocks=2, done=lambda: done.append(now[0]))
    t, _, transfer = events.pop()
    now[0] = t
    transfer.link.finish(transfer, t)
    assert done == [5.0] and woken == [True]
    assert (tier.loads, tier.loaded_blocks, tier.load_ms) == (1, 2, 2.0)


def test_problems_name_a_broken_host_pool() -> None:
    pool = HostPool(4)
    pool.store(100, 0, 3)
    assert not list(pool.problems())
    pool.size = 2  # a count that disagrees with the runs
    assert [kind for kind, _ in pool.problems()] == ["host-tier"]
    pool.size = 3
    pool.capacity = 2  # more held than the capacity
    assert any("capacity is 2" in detail for _, detail in pool.problems())
    pool.capacity = 4
    pool._lru.clear()  # a run the LRU lost
    assert any("not in the LRU" in detail for _, detail in pool.problems())
