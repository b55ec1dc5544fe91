"""Request outcomes R1-R4, placement, attention-DP lockstep, cutoff and closed loops."""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay, RankScheduler, replay_aggregated
from servesim.errors import ReplayError
from servesim.payload import TimingArgs
from servesim.timing import make_timer

from .conftest import GroupTimer


def test_r1_prompt_at_or_above_max_model_len_is_rejected(sim: Any) -> None:
    records, stats, _ = sim.run(
        sim.role(max_model_len=8),
        [sim.spec(0, 8, 2), sim.spec(1, 9, 2), sim.spec(2, 7, 5)],
    )
    assert records[0].status == records[1].status == "rejected"
    assert records[0].terminal_ms == 0.0 and len(records[0].token_times) == 0
    assert records[0].first_admit_ms is None
    # R4: 7 + 1 reaches max_model_len: one token, the requested length is kept.
    assert records[2].status == "completed" and len(records[2].token_times) == 1
    assert records[2].requested_output_length == 5
    assert (stats.completed, stats.rejected, stats.num_requests) == (1, 2, 3)


def test_r2_prompt_needing_more_blocks_than_the_pool_is_rejected(sim: Any) -> None:
    records, _, _ = sim.run(sim.role(num_gpu_blocks=3), [sim.spec(0, 13, 1), sim.spec(1, 12, 1)])
    assert records[0].status == "rejected"
    assert records[1].status == "completed" and len(records[1].token_times) == 1


def test_r4_generation_stops_at_max_model_len(sim: Any) -> None:
    records, _, _ = sim.run(sim.role(max_model_len=12), [sim.spec(0, 6, 100)])
    assert len(records[0].token_times) == 6  # 6 + 6 = 12 tokens
    assert records[0].requested_output_length == 100


def test_sequence_length_is_bounded_by_the_pool_without_max_model_len(sim: Any) -> None:
    # 2 blocks of 4 hold 8 computed tokens; the 9th token is emitted but never computed.
    records, _, _ = sim.run(sim.role(num_gpu_blocks=2), [sim.spec(0, 6, 10)])
    assert records[0].status == "completed" and len(records[0].token_times) == 3


def test_r3_unchunked_prompt_over_the_budget_fails_instead_of_hanging(sim: Any) -> None:
    role = sim.role(enable_chunked_prefill=False, max_batched_tokens=8)
    with pytest.raises(ReplayError) as err:
        sim.run(role, [sim.spec(0, 4, 2), sim.spec(7, 9, 2, arrival=1.0)])
    (diag,) = err.value.diagnostics
    assert diag.code == "request-unschedulable"
    assert "request 7 needs 9 uncached prompt tokens" in diag.message
    assert diag.where == "engine.workers.aggregated.scheduler.max_batched_tokens"
    assert diag.hint is not None and "enable_chunked_prefill" in diag.hint


def test_unchunked_prompt_waits_for_a_whole_budget(sim: Any) -> None:
    # Budget 8: while request 0 decodes it takes 1 token of the budget, so the 8-token
    # prompt (which may not be split) is blocked until request 0 finishes.
    role = sim.role(enable_chunked_prefill=False, max_batched_tokens=8)
    records, _, _ = sim.run(role, [sim.spec(0, 4, 3), sim.spec(1, 8, 1, arrival=5.0)])
    assert records[0].token_times == array("d", [11.0, 12.0, 13.0])
    assert records[1].first_admit_ms == 13.0  # admitted once the decode left the budget
    assert records[1].token_times == array("d", [24.0])


def test_max_sequences_and_head_of_line_blocking(sim: Any) -> None:
    records, _, _ = sim.run(sim.role(max_sequences=1), [sim.spec(i, 4, 2) for i in range(3)])
    # One at a time, FCFS.
    assert [records[i].first_admit_ms for i in range(3)] == [0.0, 12.0, 24.0]


def test_lockstep_attention_dp_ends_passes_at_the_slowest_rank(sim: Any) -> None:
    role = sim.role(attention_data=2)
    # Request 0 -> rank 0 (prefill + decode), request 1 arrives later -> rank 1.
    records, stats, _ = sim.run(role, [sim.spec(0, 4, 3), sim.spec(1, 4, 1, arrival=5.0)])
    # Pass 2 starts at 11: rank 0 decodes (1 ms), rank 1 prefills (11 ms): both end at 22.
    assert records[0].token_times == array("d", [11.0, 22.0, 23.0])
    assert records[1].token_times == array("d", [22.0])
    assert stats.passes == 3 and stats.worker_busy_ms == (23.0,)
    assert records[0].decode_worker == records[1].decode_worker == 0


def test_ranks_prefilling_in_one_pass_are_priced_with_all_their_tokens(sim: Any) -> None:
    # Requests 0 and 1 land on ranks 0 and 1 and prefill 4 + 6 tokens in the first pass:
    # both prefill halves cost 10 + 10 ms. Request 2 arrives at 30 and prefills alone on
    # rank 0 while rank 1 decodes request 1: its own price, 10 ms (+ 1 ms decode).
    role = sim.role(attention_data=2)
    specs = [sim.spec(0, 4, 1), sim.spec(1, 6, 40), sim.spec(2, 4, 1, arrival=30.0)]
    records: dict[int, RequestRecord] = {}
    replay = AggregatedReplay(role, GroupTimer(), sim.ListWorkload(specs),
                              lambda r: records.__setitem__(r.request_id, r), None)
    replay.run()
    assert records[0].token_times == array("d", [21.0])
    assert records[1].token_times[0] == 21.0
    assert records[2].token_times == array("d", [41.0])


def test_round_robin_over_workers_then_ranks(sim: Any) -> None:
    role = sim.role(replicas=2, attention_data=2, max_sequences=1)
    records, stats, _ = sim.run(role, [sim.spec(i, 4, 1) for i in range(5)])
    assert [records[i].decode_worker for i in range(5)] == [0, 1, 0, 1, 0]
    # Worker 0 got requests 0, 2, 4 on ranks 0, 1, 0: with one sequence per rank,
    # request 4 waits for request 0 while request 2 runs beside it on rank 1.
    assert [records[i].first_admit_ms for i in (0, 2, 4)] == [0.0, 0.0, 11.0]
    assert [records[i].first_admit_ms for i in (1, 3)] == [0.0, 0.0]
    assert stats.worker_busy_ms == (22.0, 11.0)
    assert stats.worker_seconds == pytest.approx(2 * stats.end_ms / 1000)


def test_soft_cutoff_reports_in_flight_requests_as_incomplete(sim: Any) -> None:
    workload = sim.ListWorkload(
        [sim.spec(0, 4, 5), sim.spec(1, 4, 1, arrival=12.5), sim.spec(2, 4, 1, arrival=50.0)],
        max_time_ms=12.0,
    )
    records, stats, _ = sim.run(sim.role(), workload)
    # Events at the cutoff (the pass ending at 12) are processed; later ones are not.
    assert records[0].status == "incomplete"
    assert records[0].token_times == array("d", [11.0, 12.0])
    assert records[0].terminal_ms is None
    assert set(records) == {0}  # requests arriving after the cutoff never existed
    assert stats.end_ms == 12.0 and stats.incomplete == 1


@pytest.mark.parametrize(("prompt", "out", "reused"), [(6, 6, 8), (8, 10, 16), (5, 16, 20)])
def test_closed_loop_follow_ups_reuse_generated_tokens(
        sim: Any, prompt: int, out: int, reused: int) -> None:
    from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt

    first = sim.spec(0, sim.prompt((1, prompt)), out)
    # Turn 2: turn 1's prompt + its generated tokens + 4 new ones, 2 ms after it ends.
    prompt2 = make_prompt([*first.prompt, Segment(generated_key(0), out, repeat=False),
                           Segment(2, 4, repeat=False)])
    second = sim.spec(1, prompt2, 1, arrival=2.0)
    workload = sim.ListWorkload([first], followups={0: [second]})
    records, _, _ = sim.run(sim.role(), workload)
    assert records[1].arrival_ms == records[0].terminal_ms + 2.0
    # Turn 1 computed all but its last token: its full blocks (4 tokens each, some holding
    # only generated tokens) are cached and reused.
    assert records[1].first_admission_reused_tokens == reused
    assert workload.terminals == [(0, records[0].terminal_ms), (1, records[1].terminal_ms)]


def test_replay_aggregated_streams_records_and_reports_progress(sim: Any) -> None:
    seen: list[RequestRecord] = []
    times: list[float] = []
    stats = replay_aggregated(
        sim.role(timing=TimingArgs(type="polynomial")),
        sim.ListWorkload([sim.spec(i, 20, 3, arrival=i * 3.0) for i in range(4)]),
        seen.append,
        progress=times.append,
    )
    assert sorted(r.request_id for r in seen) == [0, 1, 2, 3]
    assert all(r.status == "completed" for r in seen)
    assert times[-1] == stats.end_ms == max(r.terminal_ms or 0 for r in seen)


def test_default_timing_is_refused_before_replaying(sim: Any) -> None:
    # "test-model" is not a catalog model: the analytical timer cannot be built.
    with pytest.raises(ReplayError, match="default timing needs the model"):
        replay_aggregated(sim.role(timing=TimingArgs()), sim.ListWorkload([]), lambda r: None)


def test_fifo_preemption_refunds_a_victim_scheduled_earlier_in_the_pass(sim: Any) -> None:
    # FIFO: the oldest running request is the victim even when it already took its
    # token this pass; its token goes back to the budget and it emits nothing.
    role = sim.role(num_gpu_blocks=4, preemption_mode="fifo", max_batched_tokens=5)
    rank = RankScheduler(role, make_timer(role))
    seqs = []
    for rid, n in ((0, 6), (1, 7)):
        spec = sim.spec(rid, n, 3)
        rec = RequestRecord(request_id=rid, arrival_ms=0.0, input_length=n,
                            requested_output_length=3, status="incomplete")
        seqs.append(rank.new_seq(spec, rec))
        rank.submit(seqs[-1])
    rank.max_batched_tokens = 16
    rank.execute_pass(0.0)
    rank.execute_pass(11.0)  # lengths now 8 and 9, all 4 blocks in use (2 + 2)
    rank.max_batched_tokens = 5
    res = rank.execute_pass(12.0)
    old, young = seqs
    # Request 0 fit its 8th token; request 1's 9th needs a third block: FIFO evicts the
    # already-scheduled request 0, refunding its token.
    assert old.record.num_preemptions == 1 and old.num_computed == 0
    assert res.emitted == [young] and res.duration_ms == sim.D
    assert rank._budget == 5 - 1
    records, _, _ = sim.run(role, [sim.spec(0, 6, 3), sim.spec(1, 7, 3)])
    assert all(r.status == "completed" and len(r.token_times) == 3 for r in records.values())


@pytest.mark.parametrize(("interval", "admit_ms"), [(1, 11.0), (2, 22.0)])
def test_prefill_schedule_interval_defers_new_prompts_on_busy_dp_ranks(
    sim: Any, interval: int, admit_ms: float
) -> None:
    role = sim.role(attention_data=2, prefill_schedule_interval=interval)
    specs = [sim.spec(0, 4, 5), sim.spec(1, 4, 1, arrival=5.0), sim.spec(2, 4, 1, arrival=5.0)]
    records, _, _ = sim.run(role, specs)
    # Rank 1 has no decode to protect, so it admits request 1 on the off-cadence pass;
    # rank 0 is decoding request 0 and admits request 2 only on an even wave step.
    assert records[1].first_admit_ms == 11.0
    assert records[2].first_admit_ms == admit_ms
    assert records[0].token_times[:2] == array("d", [11.0, 22.0])


@pytest.mark.parametrize(("placement", "admit_ms"), [("round_robin", 33.0), ("least_loaded", 20.0)])
def test_least_loaded_placement_joins_the_rank_with_the_fewest_requests(
    sim: Any, placement: str, admit_ms: float
) -> None:
    # One sequence per rank: request 0 decodes on rank 0 until 33 ms, request 1 on rank 1
    # ends at 12 ms. Request 2 (arriving at 20 ms) is round-robin's third, for rank 0;
    # least-loaded placement puts it on the idle rank 1, whose pass starts at once.
    role = sim.role(attention_data=2, max_sequences=1, attention_dp_placement=placement)
    records, _, _ = sim.run(role, [sim.spec(0, 4, 23), sim.spec(1, 4, 2),
                                   sim.spec(2, 4, 2, arrival=20.0)])
    assert records[2].first_admit_ms == admit_ms
