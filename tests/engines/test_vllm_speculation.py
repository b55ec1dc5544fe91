"""Speculative decoding in the vLLM engine (spec §5.4 MTP rule, §5.7, §9 cases 37-38).

Fixed timing P = 10 ms, D = 1 ms, block 4 unless stated.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from servesim.payload import SpeculationArgs


def ngram(*rates: float, seed: int = 42) -> SpeculationArgs:
    return SpeculationArgs(kind="ngram", num_speculative_tokens=len(rates),
                           acceptance_rates=tuple(rates), seed=seed)


def mtp(*rates: float, seed: int = 42) -> SpeculationArgs:
    return SpeculationArgs(kind="mtp", num_speculative_tokens=len(rates),
                           acceptance_rates=tuple(rates), seed=seed)


def _bursts(times: Any) -> list[int]:
    """Token counts per distinct timestamp, in time order."""
    counts = Counter(times)
    return [counts[t] for t in sorted(counts)]


def test_case_37_zero_output_and_three_outputs_finish_in_one_pass(sim: Any) -> None:
    rank = sim.rank(speculation=mtp(1.0, 1.0))
    zero = sim.submit(rank, sim.spec(0, 4, 0))
    three = sim.submit(rank, sim.spec(1, 4, 3))
    res = rank.execute_pass(0.0)
    assert set(res.finished) == {zero, three} and not rank.has_work
    assert res.emitted == [three, three, three]
    records, _, _ = sim.run(sim.role(speculation=mtp(1.0, 1.0)),
                            [sim.spec(0, 4, 0), sim.spec(1, 4, 3)])
    assert records[0].status == "completed" and len(records[0].token_times) == 0
    assert list(records[1].token_times) == [sim.P + sim.D] * 3


def test_case_38_speculative_reservation_preempts_in_the_prefill_pass(sim: Any) -> None:
    rank = sim.rank(speculation=mtp(1.0, 1.0), num_gpu_blocks=3)
    first = sim.submit(rank, sim.spec(0, 4, 8))
    second = sim.submit(rank, sim.spec(1, 4, 8))
    res = rank.execute_pass(0.0)
    # each needs a second block for a 3-token burst; only one is free: LIFO retracts
    # the second request, which emits nothing in this pass
    assert res.emitted == [first] * 3
    assert second.record.num_preemptions == 1 and second.status == 0  # waiting
    assert first.record.num_preemptions == 0
    rank.pool.check()


def test_case_38_with_four_blocks_the_preemption_comes_a_pass_later(sim: Any) -> None:
    rank = sim.rank(speculation=mtp(1.0, 1.0), num_gpu_blocks=4)
    first = sim.submit(rank, sim.spec(0, 4, 8))
    second = sim.submit(rank, sim.spec(1, 4, 8))
    res = rank.execute_pass(0.0)
    assert len(res.emitted) == 6 and second.record.num_preemptions == 0
    res = rank.execute_pass(res.duration_ms)
    assert res.emitted == [first] * 3
    assert second.record.num_preemptions == 1
    rank.pool.check()


@pytest.mark.parametrize(("rates", "passes"), [((0.0, 0.0), 200), ((1.0, 1.0), 67)])
def test_zero_and_full_acceptance_after_a_long_decode(sim: Any, rates: tuple[float, ...],
                                                      passes: int) -> None:
    records, stats, _ = sim.run(sim.role(speculation=ngram(*rates)), [sim.spec(0, 8, 200)])
    times = records[0].token_times
    assert records[0].status == "completed" and len(times) == 200
    bursts = _bursts(times)
    assert len(bursts) == passes == stats.passes
    if rates[0] == 1.0:
        assert bursts == [3] * 66 + [2]  # the last burst is clipped at the output length
    else:
        assert bursts == [1] * 200
    # one verification forward per pass: TPOT over the distinct timestamps stays D
    assert times[-1] - times[0] == (passes - 1) * sim.D


def test_partial_acceptance_completes_with_the_exact_token_count(sim: Any) -> None:
    role = sim.role(speculation=ngram(0.7, 0.5, 0.2), num_gpu_blocks=512)
    records, stats, _ = sim.run(role, [sim.spec(0, 8, 500), sim.spec(1, 8, 333)])
    for rid, n in ((0, 500), (1, 333)):
        times = records[rid].token_times
        assert len(times) == n and list(times) == sorted(times)
        bursts = _bursts(times)
        assert set(bursts) <= {1, 2, 3, 4} and {1, 2, 3} <= set(bursts)
    # expected 2.12 tokens per round: far fewer passes than tokens
    assert 500 / 2.12 * 0.85 < stats.passes < 500 / 2.12 * 1.15


def test_bursts_are_deterministic_per_seed(sim: Any) -> None:
    def times(seed: int) -> list[float]:
        records, _, _ = sim.run(sim.role(speculation=ngram(0.6, 0.6, seed=seed)),
                                [sim.spec(0, 8, 100)])
        return list(records[0].token_times)

    assert times(42) == times(42)
    assert times(42) != times(43)


def test_bursts_stop_at_max_model_len(sim: Any) -> None:
    role = sim.role(speculation=ngram(1.0, 1.0), max_model_len=19)
    records, _, _ = sim.run(role, [sim.spec(0, 8, 100)])
    # 8 + 11 = 19 tokens: bursts 3, 3, 3, then 2 (clipped)
    assert _bursts(records[0].token_times) == [3, 3, 3, 2]
    assert records[0].requested_output_length == 100


def test_a_lone_request_near_the_pool_limit_is_never_stuck(sim: Any) -> None:
    # 3 blocks of 4 hold sequences of at most 13 tokens; the worst-case reservation is
    # capped at the last token that ever needs KV, so the request completes
    role = sim.role(speculation=ngram(1.0, 1.0, 1.0), num_gpu_blocks=3)
    records, _, _ = sim.run(role, [sim.spec(0, 4, 50)])
    assert records[0].status == "completed" and len(records[0].token_times) == 9


def test_ranks_draw_from_offset_seeds(sim: Any) -> None:
    role = sim.role(speculation=ngram(0.5, 0.5, 0.5), attention_data=2)
    _, _, replay = sim.run(role, [])
    a, b = replay.workers[0].ranks
    assert a.sampler is not None and b.sampler is not None
    assert [a.sampler.sample() for _ in range(50)] != [b.sampler.sample() for _ in range(50)]


# -- the MTP prefix rule (spec §5.4) ---------------------------------------------------------


@pytest.mark.parametrize(("speculation", "reused"), [(None, 16), (ngram(0.5), 16),
                                                     (mtp(0.5), 12)])
def test_mtp_drops_one_more_reused_block(sim: Any, speculation: SpeculationArgs | None,
                                         reused: int) -> None:
    p = sim.prompt((1, 17))
    records, _, _ = sim.run(sim.role(speculation=speculation),
                            [sim.spec(0, p, 2), sim.spec(1, p, 2, arrival=100.0)])
    assert records[1].reused_input_tokens == reused


def test_mtp_rule_on_a_block_aligned_prompt_and_zero_output(sim: Any) -> None:
    p = sim.prompt((1, 8))
    records, _, _ = sim.run(sim.role(speculation=mtp(0.5)), [
        sim.spec(0, p, 1), sim.spec(1, p, 2, arrival=100.0), sim.spec(2, p, 0, arrival=200.0),
        sim.spec(3, sim.prompt((1, 4), (2, 1)), 1, arrival=300.0)])
    assert records[1].reused_input_tokens == 0  # recompute cap 4, minus one block
    assert records[2].reused_input_tokens == 8  # zero output: the full hit stays
    assert records[3].reused_input_tokens == 0  # a one-block hit becomes empty
