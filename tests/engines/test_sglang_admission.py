"""SGLang's admission and retraction (spec §5.10): a prompt is admitted only if its tokens
and its clipped output fit beside the ``new_token_ratio`` share of the running requests'
remaining output, a prompt within the chunk size is never split to fill a pass, and a
decode step that does not fit retracts the running request with the least output.

Fixed timing (an extend pass P = 10 ms, a decode pass D = 1 ms), blocks of 4 tokens.
"""

from __future__ import annotations

from typing import Any

import pytest

from servesim.engines.kernel.rank import FINISHED
from servesim.engines.ranks.token_ratio import NewTokenRatio
from servesim.engines.vllm import AggregatedReplay
from servesim.timing import make_timer

from .conftest import ListWorkload
from .strategies import replayed

SGLANG = {"backend": "sglang"}


@pytest.mark.parametrize(("blocks", "waits"), [(12, True), (30, False)])
def test_a_prompt_waits_for_the_running_requests_output_share(
        sim: Any, blocks: int, waits: bool) -> None:
    # Request 0 (4 + 40 tokens) decodes from 10 ms; request 1 (8 + 8) arrives at 10.5.
    # At the pass of 11 ms: 12 blocks leave 40 free tokens, less 0.7 x 38 reserved for
    # request 0's output, under the 8 + 8 request 1 needs; 30 blocks leave plenty.
    specs = [sim.spec(0, 4, 40), sim.spec(1, 8, 8, arrival=10.5)]
    records, _, _ = sim.run(sim.role(num_gpu_blocks=blocks, **SGLANG), specs)
    if waits:
        assert records[1].first_admit_ms == records[0].terminal_ms
    else:
        assert records[1].first_admit_ms == 11.0
    assert all(r.status == "completed" and r.num_preemptions == 0 for r in records.values())
    # vLLM admits at the next pass either way: the prompt's blocks fit now.
    vllm, _, _ = sim.run(sim.role(num_gpu_blocks=blocks), specs)
    assert vllm[1].first_admit_ms == 11.0


def test_a_head_admissible_after_a_decode_step_waits_for_the_next_pass(sim: Any) -> None:
    # Request 0 (4 + 1000 tokens, the whole 251-block pool) reserves 0.7 x 998 tokens
    # when request 1 (200 + 200) arrives: 996 free less that is under 400. Its reserve
    # then falls faster than its decode steps take free tokens (the ratio decays by 0.001
    # of ~1000 remaining tokens a pass), and after the decode pass of 208-209 ms request
    # 1 fits. It is admitted by the next pass, an extend pass (210-220) that request 0
    # waits out, not by the decode pass whose step made it fit.
    specs = [sim.spec(0, 4, 1000), sim.spec(1, 200, 200, arrival=10.5)]
    role = sim.role(num_gpu_blocks=251, **SGLANG)
    records, _, _ = sim.run(role, specs)
    assert records[1].first_admit_ms == 210.0
    assert records[1].token_times[0] == 220.0
    times = list(records[0].token_times)
    assert times[times.index(210.0) + 1] == 221.0


def test_decode_passes_run_in_bulk_while_a_head_waits_for_reserved_tokens(sim: Any) -> None:
    # The scenario above: every pass but the two extend passes runs in bulk segments,
    # also while request 1 waits (each segment ends before the pass that admits it),
    # and the replay is the one the single passes give.
    specs = [sim.spec(0, 4, 1000), sim.spec(1, 200, 200, arrival=10.5)]
    role = sim.role(num_gpu_blocks=251, **SGLANG)
    records, stats, replay = sim.run(role, specs)
    assert records[1].first_admit_ms == 210.0
    assert replay.bulk_passes == stats.passes - 2

    def replay_with(bulk: bool) -> Any:
        return replayed(lambda sink: AggregatedReplay(
            role, make_timer(role), ListWorkload(specs), sink, None, bulk_decode=bulk))[0]

    assert replay_with(True) == replay_with(False)


def test_a_request_admitted_in_the_pass_reserves_its_whole_output(sim: Any) -> None:
    # 16 blocks. Request 0 (4 + 40) starts on the idle rank; request 1 (8 + 16), queued
    # behind it, needs 24 tokens: 60 free less request 0's 40 leave 20, so it waits for
    # the next pass, where request 0 only reserves 0.7 x 39.
    specs = [sim.spec(0, 4, 40), sim.spec(1, 8, 16)]
    records, _, _ = sim.run(sim.role(num_gpu_blocks=16, **SGLANG), specs)
    assert records[0].first_admit_ms == 0.0
    assert records[1].first_admit_ms == sim.P


def test_a_chunked_prompt_is_admitted_only_if_all_of_it_fits(sim: Any) -> None:
    # 4 blocks of 4 tokens, a 6-token budget. Request 0 (5 + 3) holds 2 blocks when
    # request 1 (10 + 2) arrives: its first chunk would fit, its whole prompt would not.
    # Admitted on the chunk, it would be preempted at its continuation and readmitted,
    # forever, while request 0 never decodes (extend passes stall decodes). It waits for
    # request 0 to finish instead.
    specs = [sim.spec(0, 5, 3), sim.spec(1, 10, 2, arrival=0.5)]
    workload = ListWorkload(specs, max_time_ms=1000.0)  # bounds a livelock
    records, _, _ = sim.run(sim.role(num_gpu_blocks=4, max_batched_tokens=6, **SGLANG),
                            workload)
    assert [r.status for r in records.values()] == ["completed", "completed"]
    assert records[1].first_admit_ms == records[0].terminal_ms
    assert records[1].num_preemptions == 0


def test_a_prompt_within_the_chunk_size_is_not_split_to_fill_a_pass(sim: Any) -> None:
    # An 8-token budget: request 0 takes 6; request 1 (6 tokens) waits for the next pass
    # under SGLang, where vLLM starts it with a 2-token chunk.
    specs = [sim.spec(0, 6, 2), sim.spec(1, 6, 2)]
    sglang, _, _ = sim.run(sim.role(max_batched_tokens=8, **SGLANG), specs)
    vllm, _, _ = sim.run(sim.role(max_batched_tokens=8), specs)
    assert sglang[1].first_admit_ms == sim.P
    assert vllm[1].first_admit_ms == 0.0


def test_an_idle_rank_admits_a_request_whose_output_exceeds_the_pool(sim: Any) -> None:
    # 8 blocks hold 32 tokens; 8 prompt + 40 output tokens never fit SGLang's condition,
    # but nothing else runs: the request starts (its output is clamped to the pool).
    records, _, _ = sim.run(sim.role(num_gpu_blocks=8, **SGLANG), [sim.spec(0, 8, 40)])
    assert records[0].status == "completed"
    assert records[0].first_admit_ms == 0.0


def test_a_decode_step_that_does_not_fit_retracts_the_request_with_the_least_output(
        sim: Any) -> None:
    # A 12-block pool, the ratio decayed to its floor. Request 0 (8 + 30 tokens) starts
    # alone; requests 1 (8 + 12) and 2 (4 + 12) are admitted together in the next extend
    # pass, beside 0.098 of request 0's remaining output; request 3 (4 + 200) waits. The
    # three need 19 blocks, so a decode pass retracts. All three have the same output
    # (the extend pass stalled request 0), so the longest prompts go first and, of
    # those, the latest admitted: request 1 (not request 2, the latest of all). It goes
    # to the back of the waiting queue.
    rank = sim.rank(num_gpu_blocks=12, **SGLANG)
    assert rank.ratio is not None
    rank.ratio.base = rank.ratio.minimum
    first = sim.submit(rank, sim.spec(0, 8, 30))
    rank.execute_pass(0.0)
    seqs = [first] + [sim.submit(rank, sim.spec(i, n, out, arrival=0.5))
                      for i, n, out in ((1, 8, 12), (2, 4, 12), (3, 4, 200))]
    now = sim.P
    for _ in range(40):
        before = [seq.generated for seq in seqs]
        rank.execute_pass(now)
        now += sim.D
        if any(seq.record.num_preemptions for seq in seqs):
            break
    assert [seq.record.num_preemptions for seq in seqs] == [0, 1, 0, 0]
    assert before[0] == before[1] == before[2]  # the extend pass stalled request 0
    assert list(rank.waiting) == [seqs[3], seqs[1]] and seqs[1].lease == []
    # The ratio is re-estimated from the requests still running.
    decoded = seqs[0].generated + seqs[2].generated
    max_new = 30 + 12
    assert rank.ratio.value == min(1.0, (decoded + 20 * 2) / (max_new + 1))
    rank.pool.check()


def test_the_ratio_decays_per_decode_pass_and_restarts_when_the_rank_goes_idle(
        sim: Any) -> None:
    rank = sim.rank(**SGLANG)
    assert rank.ratio is not None
    seq = sim.submit(rank, sim.spec(0, 4, 5))
    rank.execute_pass(0.0)  # extend: no decay
    assert rank.ratio.value == 0.7
    for step in range(1, 4):
        rank.execute_pass(float(step))
        assert rank.ratio.passes == step
    assert rank.ratio.value < 0.7
    rank.execute_pass(4.0)  # the last token: the rank goes idle
    assert seq.status == FINISHED and not rank.running
    assert rank.ratio.value == 0.7


def test_a_bulk_advance_decays_the_ratio_as_its_passes_would(sim: Any) -> None:
    # Request 0 (4 + 600 tokens, exactly the 151-block pool) decodes alone, in bulk, until
    # request 1 (20 + 20) arrives at 510.5. At the pass of 511 ms, 501 decode passes have
    # taken the ratio from 0.7 to 0.197: 96 free tokens less 0.197 x 98 reserved leave
    # room for request 1's 40, which 0.7 x 98 would not.
    specs = [sim.spec(0, 4, 600), sim.spec(1, 20, 20, arrival=510.5)]
    role = sim.role(num_gpu_blocks=151, **SGLANG)
    records, _, replay = sim.run(role, specs)
    assert replay.bulk_passes > 0
    assert records[1].first_admit_ms == 511.0

    def replay_with(bulk: bool) -> Any:
        return replayed(lambda sink: AggregatedReplay(
            role, make_timer(role), ListWorkload(specs), sink, None, bulk_decode=bulk))[0]

    assert replay_with(True) == replay_with(False)


def test_the_ratio_follows_the_spec_constants() -> None:
    ratio = NewTokenRatio.for_rank(attention_data=1)
    assert ratio.value == 0.7
    ratio.decoded(600)
    assert ratio.value == pytest.approx(0.7 * 0.14)
    ratio.decoded(1000)
    assert ratio.value == ratio.minimum
    assert NewTokenRatio.for_rank(attention_data=2).value == pytest.approx(0.7 * 0.3)
