"""Hybrid state cache in the vLLM engine (spec §5.8, §9 cases 41-46).

Fixed timing P = 10 ms, D = 1 ms, block 4 unless stated. ``state_blocks`` is what the
compiler derives; the engine charges exactly that many pool blocks per working state and
per snapshot.
"""

from __future__ import annotations

from typing import Any

import pytest

from servesim.engines.kernel.blocks import Lease
from servesim.engines.kernel.rank import FINISHED, RUNNING, WAITING
from servesim.engines.kernel.tokens import Segment, make_prompt
from servesim.engines.vllm import RankScheduler, SeqState
from servesim.payload import SpeculationArgs, StateCacheArgs


def state(blocks: int = 1) -> StateCacheArgs:
    return StateCacheArgs(bytes_per_request=blocks * 4, state_blocks=blocks,
                          allocated_bytes_per_request=blocks * 4)


def hybrid(sim: Any, blocks: int = 1, **kw: Any) -> Any:
    return sim.role(state_cache=state(blocks), kv_bytes_per_token=1, **kw)


def _drain(rank: RankScheduler, now: float = 0.0) -> float:
    while rank.has_work:
        now += rank.execute_pass(now).duration_ms
    rank.pool.check()
    return now


def _snapshot(rank: RankScheduler, seq: SeqState, boundary: int) -> bool:
    assert rank.state is not None
    return rank.state.has_snapshot(rank._prefix_identity(seq, boundary), boundary)


NGRAM = SpeculationArgs(kind="ngram", num_speculative_tokens=2, acceptance_rates=(0.5, 0.5))
MTP = SpeculationArgs(kind="mtp", num_speculative_tokens=2, acceptance_rates=(0.5, 0.5))


# -- the 17-token example ---------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{}, {"prefix_match_unit": 4},
                                {"prefix_match_unit": 4, "speculation": NGRAM},
                                {"speculation": NGRAM}])
def test_a_repeat_of_a_17_token_prompt_resumes_at_the_16_token_checkpoint(
        sim: Any, kw: dict[str, Any]) -> None:
    p = sim.prompt((1, 17))
    records, _, _ = sim.run(hybrid(sim, **kw),
                            [sim.spec(0, p, 3), sim.spec(1, p, 3, arrival=100.0)])
    assert records[0].reused_input_tokens == 0
    assert records[1].reused_input_tokens == 16
    assert [len(r.token_times) for r in records.values()] == [3, 3]


def test_prefill_of_17_tokens_stops_at_16_then_computes_token_17(sim: Any) -> None:
    rank = sim.rank(hybrid(sim))
    seq = sim.submit(rank, sim.spec(0, sim.prompt((1, 17)), 3))
    first = rank.execute_pass(0.0)
    assert seq.num_computed == 16 and first.emitted == []
    assert _snapshot(rank, seq, 16)  # published when the pass ends ...
    second = rank.execute_pass(first.duration_ms)
    assert second.emitted == [seq] and seq.num_computed == 17
    assert _snapshot(rank, seq, 16)  # ... and kept while the request moves on
    assert not _snapshot(rank, seq, 12) and not _snapshot(rank, seq, 8)


def test_mtp_with_a_state_cache_drops_one_block_and_does_not_rewind_further(sim: Any) -> None:
    p = sim.prompt((1, 17))
    role = hybrid(sim, speculation=MTP)
    # the repeat's MTP bound is 16 - 4 = 12: no checkpoint at 12, so nothing is reused
    records, _, _ = sim.run(role, [sim.spec(0, p, 3), sim.spec(1, p, 3, arrival=100.0)])
    assert records[1].reused_input_tokens == 0
    # a sparser checkpoint at 8 (under the bound 12) is taken as it is, not rewound to 4
    first8 = sim.prompt((1, 8))
    first16 = make_prompt([*sim.prompt((1, 16)), Segment(9, 1, repeat=False)])
    records, _, _ = sim.run(role, [sim.spec(0, first8, 0), sim.spec(1, first16, 0, arrival=50.0),
                                   sim.spec(2, p, 1, arrival=100.0)])
    assert records[1].reused_input_tokens == 8  # zero output: no MTP reduction
    assert records[2].reused_input_tokens == 8


# -- spec §9 cases 41-46 -----------------------------------------------------------------------


def test_case_41_state_blocks_come_from_the_token_pool(sim: Any) -> None:
    rank = sim.rank(hybrid(sim, blocks=2, block_size=64, num_gpu_blocks=8, prefix_caching=False))
    a, b, c = (sim.submit(rank, sim.spec(i, 120, 3)) for i in range(3))
    now = rank.execute_pass(0.0).duration_ms
    assert a.status == b.status == RUNNING
    assert rank.pool.num_active == 8  # 2 token + 2 state blocks each
    assert c.status == WAITING and c.lease == [] and c.state is not None
    assert c.state.working == []
    while a.status != FINISHED:
        now += rank.execute_pass(now).duration_ms
    assert c.status == WAITING  # released at the end of the pass that finished a and b
    rank.execute_pass(now)
    assert c.status == RUNNING and len(c.lease) == 2 and len(c.state.working) == 2
    _drain(rank, now)


def _seed_pool(rank: RankScheduler, seq: SeqState, token_blocks: int,
               snapshots: dict[int, int]) -> None:
    """Cache ``seq``'s first token blocks and snapshots {boundary: slots present}."""
    pool, state_cache = rank.pool, rank.state
    assert state_cache is not None
    rank._ensure_hashes(seq, token_blocks)
    lease = Lease()
    assert pool.allocate(lease, token_blocks)
    pool.publish(lease, seq.hashes, 0, token_blocks)
    pool.release(lease)
    for boundary, slots in snapshots.items():
        ids = state_cache.snapshot_ids(rank._prefix_identity(seq, boundary), boundary)[:slots]
        holder = Lease()
        assert pool.allocate(holder, len(ids))
        pool.publish(holder, ids, 0, len(ids))
        pool.release(holder)


def test_case_42_joint_hit_is_the_largest_boundary_with_both(sim: Any) -> None:
    rank = sim.rank(hybrid(sim, blocks=2))
    seq = sim.submit(rank, sim.spec(0, 20, 1))
    p = sim.prompt((5, 20))
    seq = sim.submit(rank, sim.spec(1, p, 0))
    _seed_pool(rank, seq, 4, {8: 2, 20: 2})
    cached, reuse = rank._prefix_cost(seq, 20)
    assert cached == 8 and len(reuse) == 2
    assert 20 - cached == 12 and -(-20 // 4) - len(reuse) == 3  # new tokens, new blocks


def test_case_43_token_hits_alone_or_a_partial_snapshot_are_no_hit(sim: Any) -> None:
    p = sim.prompt((5, 20))
    for snapshots, expected in (({}, 0), ({20: 1}, 0), ({20: 2}, 20)):
        rank = sim.rank(hybrid(sim, blocks=2))
        seq = sim.submit(rank, sim.spec(0, p, 0))  # zero output: no logits cap
        _seed_pool(rank, seq, 5, snapshots)
        assert rank._prefix_cost(seq, 20)[0] == expected


def test_case_44_states_are_never_fabricated_at_earlier_boundaries(sim: Any) -> None:
    rank = sim.rank(hybrid(sim))
    p = sim.prompt((1, 12))
    a = sim.submit(rank, sim.spec(0, p, 0))
    rank.execute_pass(0.0)
    assert a.status == FINISHED
    assert _snapshot(rank, a, 12) and not _snapshot(rank, a, 8)
    assert not _snapshot(rank, a, 4)
    needs_token = sim.submit(rank, sim.spec(1, p, 1))  # logits cap 11 -> boundary 8: no state
    _drain(rank, 10.0)
    assert needs_token.record.reused_input_tokens == 0
    fork = sim.submit(rank, sim.spec(2, sim.prompt((1, 8)), 0))
    _drain(rank, 100.0)
    assert fork.record.reused_input_tokens == 0
    again = sim.submit(rank, sim.spec(3, p, 0))
    _drain(rank, 200.0)
    assert again.record.reused_input_tokens == 12


def test_case_45_a_checkpoint_is_restorable_from_the_next_pass(sim: Any) -> None:
    p = sim.prompt((1, 8))
    longer = sim.prompt((1, 8), (2, 4))
    rank = sim.rank(hybrid(sim))
    sim.submit(rank, sim.spec(0, p, 3))
    same_pass = sim.submit(rank, sim.spec(1, longer, 1))
    now = rank.execute_pass(0.0).duration_ms
    # the token blocks were visible at once, the state at 8 was not
    assert same_pass.record.reused_input_tokens == 0
    next_pass = sim.submit(rank, sim.spec(2, longer, 1))
    rank.execute_pass(now)
    assert next_pass.record.reused_input_tokens == 8


CASE_46 = {"block_size": 1536, "prefix_match_unit": 128, "num_gpu_blocks": 512,
           "max_batched_tokens": 8192, "max_model_len": 32768}


def _case_46_prompts(shared: int) -> tuple[Any, Any]:
    return (make_prompt([Segment(1, shared, False), Segment(2, 24300 - shared, False)]),
            make_prompt([Segment(1, shared, False), Segment(3, 24300 - shared, False)]))


def test_case_46_aligned_chunks_and_retained_snapshots(sim: Any) -> None:
    rank = sim.rank(hybrid(sim, **CASE_46))
    p1, _ = _case_46_prompts(24192)
    seq = sim.submit(rank, sim.spec(0, p1, 2))
    ends, now = [], 0.0
    while rank.has_work:
        now += rank.execute_pass(now).duration_ms
        ends.append(seq.num_computed)
    assert ends[:5] == [7680, 15360, 23040, 24192, 24300]
    # retained: the last block boundary and the last unit boundary, nothing earlier
    assert [b for b in (7680, 15360, 23040, 24192) if _snapshot(rank, seq, b)] == [23040, 24192]
    rank.pool.check()


@pytest.mark.parametrize(("shared", "reused"), [(24192, 24192), (24191, 23040), (0, 0)])
def test_case_46_aligned_replay(sim: Any, shared: int, reused: int) -> None:
    p1, p2 = _case_46_prompts(shared)
    records, _, _ = sim.run(hybrid(sim, **CASE_46),
                            [sim.spec(0, p1, 2), sim.spec(1, p2, 2, arrival=2000.0)])
    assert [r.status for r in records.values()] == ["completed", "completed"]
    assert sum(r.input_length for r in records.values()) == 48600
    assert sum(len(r.token_times) for r in records.values()) == 4
    assert records[0].reused_input_tokens == 0
    assert records[1].reused_input_tokens == reused  # committed prefill = 48600 - reused


# -- eviction, preemption, decode ------------------------------------------------------------


def test_evicting_a_snapshot_removes_the_hit_while_token_kv_survives(sim: Any) -> None:
    p = sim.prompt((1, 17))
    rank = sim.rank(hybrid(sim, blocks=2, num_gpu_blocks=12))
    a = sim.submit(rank, sim.spec(0, p, 1))
    _drain(rank)
    pool = rank.pool
    # LRU: the 16-token checkpoint (released when the step off the boundary began), then
    # a's token blocks leaf first; one block more than the free ones evicts a snapshot slot
    filler_blocks = pool.num_free + 1 - 2  # its working state takes 2 blocks too
    sim.submit(rank, sim.spec(1, filler_blocks * 4, 0))
    _drain(rank, 100.0)
    assert not _snapshot(rank, a, 16)
    assert len(pool.lookup(a.hashes, 4)) == 4  # every token block is still cached
    again = sim.submit(rank, sim.spec(2, p, 1))
    _drain(rank, 200.0)
    assert again.record.reused_input_tokens == 0


def test_preemption_releases_the_working_state_and_keeps_earlier_checkpoints(sim: Any) -> None:
    rank = sim.rank(hybrid(sim, blocks=2))
    a = sim.submit(rank, sim.spec(0, sim.prompt((1, 17)), 3))
    now = rank.execute_pass(0.0).duration_ms  # computes 16: checkpoint published at the end
    assert a.state is not None and a.state.published_at == 16
    active = rank.pool.num_active
    rank._preempt(a)
    assert a.state.working == [] and a.lease == []
    assert rank.pool.num_active == active - 4 - 2
    assert _snapshot(rank, a, 16)
    _drain(rank, now)
    assert a.record.num_preemptions == 1 and a.record.reused_input_tokens == 16
    assert a.record.first_admission_reused_tokens == 0
    assert a.generated == 3 and a.status == FINISHED


def test_same_pass_preemption_retracts_the_checkpoint(sim: Any) -> None:
    # r decodes with 3-token bursts; a is admitted behind it with a chunk ending on the
    # boundary 8, then retracted (LIFO) by r's burst reservation in the same pass
    rank = sim.rank(hybrid(sim, num_gpu_blocks=6,
                        speculation=SpeculationArgs("ngram", 2, (1.0, 1.0))))
    r = sim.submit(rank, sim.spec(0, 4, 10))
    now = rank.execute_pass(0.0).duration_ms
    a = sim.submit(rank, sim.spec(1, sim.prompt((1, 8)), 1))
    rank.execute_pass(now)
    assert a.record.num_preemptions == 1 and a.status == WAITING
    assert not _snapshot(rank, a, 8)
    assert len(rank.pool.lookup(a.hashes, 2)) == 2  # its token blocks were published
    _drain(rank, 100.0)
    assert a.record.reused_input_tokens == 0 and r.generated == 10 and a.generated == 1


def test_a_long_decode_keeps_one_working_state_and_one_latest_checkpoint(sim: Any) -> None:
    rank = sim.rank(hybrid(sim, blocks=2, num_gpu_blocks=64))
    seq = sim.submit(rank, sim.spec(0, 6, 40))
    now = 0.0
    while rank.has_work:
        now += rank.execute_pass(now).duration_ms
        assert seq.state is not None
        assert rank.state is not None and rank.state.held_blocks(seq.state) <= 2
        snapshot_slots = len(rank.pool.cached_identities()) - len(
            set(seq.hashes) & rank.pool.cached_identities())
        assert snapshot_slots <= 2 * 2  # latest checkpoint + the published working state
    rank.pool.check()
    assert seq.generated == 40


def test_a_transition_that_can_never_fit_drops_the_checkpoint(sim: Any) -> None:
    # 6 blocks, 2-block state: holding 3 token blocks, the working state and a preserved
    # checkpoint would need 7; the request still completes (no deadlock)
    role = hybrid(sim, blocks=2, num_gpu_blocks=6)
    records, _, _ = sim.run(role, [sim.spec(0, 8, 8)])
    assert records[0].status == "completed" and len(records[0].token_times) == 8
    records, _, _ = sim.run(role, [sim.spec(0, 8, 50)])
    # the working state caps the sequence at (6 - 2) * 4 + 1 tokens
    assert len(records[0].token_times) == 17 - 8


def test_requests_that_cannot_hold_tokens_and_a_state_are_rejected(sim: Any) -> None:
    records, _, _ = sim.run(hybrid(sim, blocks=2, num_gpu_blocks=6), [sim.spec(0, 17, 1)])
    assert records[0].status == "rejected"  # 5 token blocks + 2 state blocks > 6
