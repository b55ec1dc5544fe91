"""TensorRT-LLM's GUARANTEED_NO_EVICT capacity policy on the shared scheduler core
(spec §5.4 admission, R2 output clamp, §6 FreshOnly destinations): a request is admitted
only when its whole sequence fits beside what the admitted requests may still take, so a
TensorRT-LLM rank queues where vLLM admits and later preempts.

Fixed timing (prefill pass P = 10 ms, decode pass D = 1 ms), blocks of 4 tokens.
"""

from __future__ import annotations

from typing import Any

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.disagg.ranks import DecodeRank
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.timing import make_timer

from .conftest import ListWorkload, Sim
from .test_disagg import decode_role, prefill_role, record_for


def _three_requests(sim: Any) -> list[RequestSpec]:
    # Each: 8 prompt tokens (2 blocks) and 8 output tokens, 4 blocks in all.
    return [sim.spec(i, 8, 8) for i in range(3)]


def test_vllm_admits_what_fits_now_and_preempts_later(sim: Any) -> None:
    # 8 blocks: three prompts of 2 blocks fit at once; their outputs then do not.
    records, _, _ = sim.run(sim.role(num_gpu_blocks=8), _three_requests(sim))
    assert all(r.first_admit_ms == 0.0 for r in records.values())
    assert sum(r.num_preemptions for r in records.values()) > 0


def test_trtllm_admits_a_request_only_when_its_whole_sequence_fits(sim: Any) -> None:
    records, _, replay = sim.run(sim.role(num_gpu_blocks=8, backend="trtllm"),
                                 _three_requests(sim))
    assert all(r.num_preemptions == 0 for r in records.values())
    assert all(r.status == "completed" and len(r.token_times) == 8 for r in records.values())
    # Two sequences of 4 blocks fill the pool: the third waits for a completion.
    assert records[0].first_admit_ms == records[1].first_admit_ms == 0.0
    first_done = min(records[0].terminal_ms, records[1].terminal_ms)
    assert records[2].first_admit_ms == first_done
    assert replay.workers[0].ranks[0].pool.num_active == 0


def test_trtllm_reservation_counts_prefix_blocks_held_by_running_requests(sim: Any) -> None:
    # Pool of 7 blocks. A running request holds a shared 2-block prefix; a second request
    # with that prefix needs 4 - 2 = 2 more blocks for its whole sequence, beside the
    # 4 - 2 = 2 the first may still take: 2 <= 7 - 2 - 2, so both run together.
    shared = sim.prompt((5, 8))
    first = sim.spec(0, shared, 8)
    second = sim.spec(1, sim.prompt((5, 8)), 8, arrival=10.5)
    role = sim.role(num_gpu_blocks=7, backend="trtllm", prefix_caching=True)
    records, _, _ = sim.run(role, [first, second])
    assert records[1].first_admit_ms == 10.5 + 0.5  # the next pass, not after the first ends
    assert records[1].reused_input_tokens == 4  # the last prompt block is recomputed


def test_trtllm_clamps_the_output_to_the_pool(sim: Any) -> None:
    # R2: 2 blocks of 4 hold 8 tokens; a 6-token prompt keeps 2 of its 10 output tokens
    # (vLLM emits a third, whose KV is never computed).
    trt, _, _ = sim.run(sim.role(num_gpu_blocks=2, backend="trtllm"), [sim.spec(0, 6, 10)])
    vllm, _, _ = sim.run(sim.role(num_gpu_blocks=2), [sim.spec(0, 6, 10)])
    assert trt[0].status == "completed" and len(trt[0].token_times) == 2
    assert len(vllm[0].token_times) == 3
    assert trt[0].requested_output_length == 10


def test_trtllm_rejects_only_a_prompt_larger_than_the_pool(sim: Any) -> None:
    role = sim.role(num_gpu_blocks=3, backend="trtllm")
    records, _, _ = sim.run(role, [sim.spec(0, 13, 1), sim.spec(1, 12, 50)])
    assert records[0].status == "rejected"
    assert records[1].status == "completed" and len(records[1].token_times) == 0


def test_trtllm_destination_takes_fresh_blocks_once_the_sequence_fits() -> None:
    role = decode_role(backend="trtllm", num_gpu_blocks=8, prefix_caching=True)
    rank = DecodeRank(role, make_timer(role))
    first = Sim.spec(0, Sim.prompt((1, 8)), 8)  # 2 prompt blocks, 4 in all
    seq = rank.reserve_destination(first, record_for(first))
    assert seq is not None and rank.pool.num_active == 2
    rank.activate_destination(seq)  # its prompt blocks become cache-visible
    # The same prompt again fits beside the 2 blocks the first may still take
    # (4 <= 8 - 2 - 2), and FreshOnly does not reuse the resident blocks.
    again = Sim.spec(1, Sim.prompt((1, 8)), 8)
    seq2 = rank.reserve_destination(again, record_for(again))
    assert seq2 is not None and rank.resident_tokens(seq2) == 0
    assert rank.pool.num_active == 4
    # Now every block is held or promised: even a 2-block sequence waits.
    short = Sim.spec(2, Sim.prompt((3, 4)), 4)
    assert rank.reserve_destination(short, record_for(short)) is None
    rank.pool.check()


def test_trtllm_disaggregated_replay_never_preempts() -> None:
    prefill = prefill_role(backend="trtllm", num_gpu_blocks=4)
    decode = decode_role(backend="trtllm", num_gpu_blocks=8)
    workload = ListWorkload([Sim.spec(i, 8, 8, arrival=float(i)) for i in range(4)])
    records: dict[int, RequestRecord] = {}
    replay = DisaggReplay(prefill, decode, None, workload,
                          lambda r: records.__setitem__(r.request_id, r))
    replay.run()
    assert len(records) == 4
    assert all(r.status == "completed" and len(r.token_times) == 8 for r in records.values())
    assert all(r.num_preemptions == 0 for r in records.values())
    # Two sequences of 4 blocks fill the decode pool: the later two start decoding only
    # after one of the first two completed.
    done = sorted(r.terminal_ms for r in records.values())
    assert min(records[2].token_times[0], records[3].token_times[0]) > done[0]


# -- attention-DP balance (TensorRT-LLM attention_dp_config.enable_balance) ---------------------
# Two ranks decode requests 0 and 1 (first token at 11 ms, then one per 1 ms pass, the
# last at 22 ms); request 2 arrives at 5 ms and is placed on rank 0.

def _balanced(sim: Any, timeout: int, wait: int, *extra: RequestSpec) -> dict[int, float | None]:
    role = sim.role(backend="trtllm", attention_data=2, attention_dp_balance=True,
                    attention_dp_timeout_iters=timeout, attention_dp_batching_wait_iters=wait)
    specs = [sim.spec(0, 4, 12), sim.spec(1, 4, 12), sim.spec(2, 4, 3, arrival=5.0), *extra]
    records, _, _ = sim.run(role, specs)
    return {rid: r.first_admit_ms for rid, r in records.items()}


def test_without_balance_a_rank_prefills_as_soon_as_it_can(sim: Any) -> None:
    role = sim.role(backend="trtllm", attention_data=2)
    records, _, _ = sim.run(role, [sim.spec(0, 4, 12), sim.spec(1, 4, 12),
                                   sim.spec(2, 4, 3, arrival=5.0)])
    assert records[2].first_admit_ms == 11.0


def test_balance_holds_a_prompt_until_every_rank_has_one(sim: Any) -> None:
    # Request 3 arrives at 15.5 ms on rank 1: the next pass (16 ms) prefills both.
    admits = _balanced(sim, 50, 0, sim.spec(3, 4, 3, arrival=15.5))
    assert admits[2] == admits[3] == 16.0


def test_balance_releases_held_prompts_after_timeout_iters(sim: Any) -> None:
    # The passes starting at 11 and 12 ms wait (counter 1, 2); the third reaches 3.
    assert _balanced(sim, 3, 0)[2] == 13.0
    assert _balanced(sim, 0, 0)[2] == 11.0  # no timeout: never held


def test_balance_never_holds_while_a_rank_has_nothing_to_decode(sim: Any) -> None:
    # Rank 1 drains when request 1 completes at 22 ms: that pass admits request 2.
    assert _balanced(sim, 50, 0)[2] == 22.0


def test_balance_batches_for_batching_wait_iters_once_every_rank_has_a_prompt(
    sim: Any,
) -> None:
    # Requests 2 and 3 both wait out the passes starting at 11 and 12 ms.
    admits = _balanced(sim, 50, 2, sim.spec(3, 4, 3, arrival=8.0))
    assert admits[2] == admits[3] == 13.0
