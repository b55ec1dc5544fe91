"""Spec §9 scheduler/cache cases 26-34 with fixed timing (P = 10 ms, D = 1 ms), block 4."""

from __future__ import annotations

from array import array
from typing import Any


def test_case_26_identical_prompt_reuses_its_full_blocks_only(sim: Any) -> None:
    p = sim.prompt((1, 9))
    records, _, _ = sim.run(sim.role(), [sim.spec(0, p, 3), sim.spec(1, p, 3, arrival=100.0)])
    assert records[0].first_admission_reused_tokens == 0
    assert records[1].first_admission_reused_tokens == 8  # two full blocks, never the partial
    assert records[0].token_times == array("d", [11.0, 12.0, 13.0])
    # 1 uncached prompt token still costs a fixed prefill half.
    assert records[1].token_times == array("d", [111.0, 112.0, 113.0])


def test_case_27_block_aligned_prompt_recomputes_its_last_block_unless_zero_output(
    sim: Any,
) -> None:
    p = sim.prompt((1, 8))
    records, _, _ = sim.run(
        sim.role(),
        [sim.spec(0, p, 1), sim.spec(1, p, 2, arrival=100.0), sim.spec(2, p, 0, arrival=200.0)],
    )
    assert records[1].reused_input_tokens == 4
    assert records[2].reused_input_tokens == 8
    # Fully cached zero-output prompt: no prefill work, no decode -> a zero-time pass.
    assert records[2].status == "completed"
    assert records[2].terminal_ms == 200.0 and len(records[2].token_times) == 0


def test_case_28_zero_output_request_completes_in_its_first_pass(sim: Any) -> None:
    rank = sim.rank()
    seq = sim.submit(rank, sim.spec(0, 4, 0))
    res = rank.execute_pass(0.0)
    assert res.finished == [seq] and res.emitted == []
    assert res.duration_ms == sim.P  # prefill only, nothing decodes
    assert seq.record.first_admission_reused_tokens == 0
    assert rank.pool.num_active == 0 and not rank.has_work


def test_case_29_and_31_chunked_prefill_splits_the_prompt_over_two_passes(sim: Any) -> None:
    rank = sim.rank(max_batched_tokens=8)
    seq = sim.submit(rank, sim.spec(0, 16, 1))
    first = rank.execute_pass(0.0)
    assert first.emitted == [] and seq.num_computed == 8
    assert first.duration_ms == sim.P
    second = rank.execute_pass(first.duration_ms)
    assert second.emitted == [seq] and seq.num_computed == 16
    assert second.duration_ms == sim.P + sim.D

    records, _, _ = sim.run(sim.role(max_batched_tokens=8), [sim.spec(0, 16, 3)])
    ttft = records[0].token_times[0] - records[0].arrival_ms
    assert ttft == 2 * sim.P + sim.D  # case 31


def test_case_30_ttft_e2e_tpot_with_fixed_timing(sim: Any) -> None:
    n = 5
    records, stats, _ = sim.run(sim.role(), [sim.spec(0, 7, n, arrival=3.0)])
    t = records[0].token_times
    assert t[0] - 3.0 == sim.P + sim.D  # TTFT
    assert t[-1] - 3.0 == sim.P + n * sim.D  # E2E
    assert (t[-1] - t[0]) / (n - 1) == sim.D  # TPOT
    assert records[0].terminal_ms == t[-1] and stats.passes == n


def test_case_32_lru_order_through_the_scheduler(sim: Any) -> None:
    # A (15 prompt tokens) and B (14 tokens sharing A's first 10) run and finish; a new
    # 36-token request then needs 9 of the 10 blocks: it takes the never-used and
    # anonymous slots first, then evicts the oldest releases, leaves before parents.
    rank = sim.rank(num_gpu_blocks=10)
    a = sim.submit(rank, sim.spec(0, sim.prompt((1, 15)), 1))
    b = sim.submit(rank, sim.spec(1, sim.prompt((1, 10), (2, 4)), 1))
    res = rank.execute_pass(0.0)
    assert b.record.first_admission_reused_tokens == 8
    assert set(res.finished) == {a, b}
    a_hashes, b_hashes = list(a.hashes), list(b.hashes)
    c = sim.submit(rank, sim.spec(2, 36, 0))
    rank.execute_pass(20.0)
    assert c.status == 2  # finished
    cached = rank.pool.cached_identities()
    # LRU after both releases: A2 | B2, shared 1, shared 0 (A's partial block, B's partial
    # block and 4 never-used slots are free). 9 blocks = 6 free + 3 evictions.
    assert a_hashes[2] not in cached and b_hashes[2] not in cached
    assert a_hashes[1] not in cached
    assert a_hashes[0] in cached  # the shared root was released last


def test_case_33_evicting_a_leaf_keeps_its_parent(sim: Any) -> None:
    rank = sim.rank(num_gpu_blocks=2)
    x = sim.prompt((1, 8))
    sim.submit(rank, sim.spec(0, x, 0))
    rank.execute_pass(0.0)
    sim.submit(rank, sim.spec(1, 4, 0))  # unrelated, one block
    rank.execute_pass(10.0)
    parent = sim.submit(rank, sim.spec(2, sim.prompt((1, 4), (3, 4)), 0))
    rank.execute_pass(20.0)
    assert parent.record.first_admission_reused_tokens == 4
    again = sim.submit(rank, sim.spec(3, x, 0))
    rank.execute_pass(30.0)
    assert again.record.first_admission_reused_tokens == 4  # the leaf block was evicted


def test_case_34_lifo_preemption_before_the_first_token(sim: Any) -> None:
    # Pool 6 blocks of 4, budget 12. A warm-up request caches block P0; the filler
    # (8 prompt, 8 out) and the victim (P0 + 12 new tokens, 4 out) are admitted together,
    # the victim with a 4-token chunk. Next pass the filler's decode takes a block and the
    # victim's remaining 8 tokens no longer fit: LIFO preempts the victim itself.
    role = sim.role(num_gpu_blocks=6, max_batched_tokens=12)
    warm = sim.spec(0, sim.prompt((7, 4)), 0)
    filler = sim.spec(1, 8, 8, arrival=100.0)
    victim = sim.spec(2, sim.prompt((7, 4), (8, 12)), 4, arrival=100.0)
    records, _, _ = sim.run(role, [warm, filler, victim])
    v = records[2]
    assert v.status == "completed" and len(v.token_times) == 4
    assert v.num_preemptions == 1
    assert v.first_admission_reused_tokens == 4  # the first admission's hit is kept
    assert v.reused_input_tokens == 8  # readmission also hit its own computed chunk
    assert v.first_admit_ms == 100.0
    f = records[1]
    assert f.num_preemptions == 0 and len(f.token_times) == 8
    # The victim produced nothing before the filler finished and freed its blocks.
    assert v.token_times[0] > f.token_times[-1]
