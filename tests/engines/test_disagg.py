"""Disaggregated prefill/decode: spec §9 cases 35, 36, 47, 48, the TTFT decomposition,
transfer modes, prefix reuse on the destination, placement, and resource accounting.

Fixed timing throughout: prefill workers price a prompt pass at P = 10 ms, decode workers
a decode pass at D = 1 ms (the other half of each role is priced too, to show it is not
charged where it must not be).
"""

from __future__ import annotations

from array import array
from typing import Any

import pytest

from servesim.engines.disagg.engine import DisaggReplay, DisaggStats
from servesim.engines.disagg.ranks import DecodeRank, DestinationRejected, PrefillRank
from servesim.engines.disagg.transfer import transfer_delay_ms
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.payload import (
    KvTransferArgs,
    RoleArgs,
    SpeculationArgs,
    StateCacheArgs,
    TimingArgs,
)
from servesim.timing import make_timer

from .conftest import GroupTimer, ListWorkload, Sim

P = 10.0
D = 1.0


def prefill_role(**kw: Any) -> RoleArgs:
    kw.setdefault("timing", TimingArgs(type="fixed", prefill_ms=P, decode_ms=7.0))
    return Sim.role(worker_type="prefill", **kw)


def decode_role(**kw: Any) -> RoleArgs:
    kw.setdefault("timing", TimingArgs(type="fixed", prefill_ms=5.0, decode_ms=D))
    return Sim.role(worker_type="decode", **kw)


def link(bandwidth: float | None, bytes_per_token: int = 1_000_000,
         mode: str = "full_prompt", state_bytes: int = 0) -> KvTransferArgs:
    return KvTransferArgs(bytes_per_token=bytes_per_token, bandwidth_gb_per_second=bandwidth,
                          timing_mode=mode, state_bytes=state_bytes)  # type: ignore[arg-type]


def record_for(spec: RequestSpec) -> RequestRecord:
    return RequestRecord(request_id=spec.request_id, arrival_ms=spec.arrival_ms,
                         input_length=spec.input_length,
                         requested_output_length=spec.output_length, status="incomplete")


def run_pd(
    specs: list[RequestSpec] | ListWorkload,
    *,
    prefill: RoleArgs | None = None,
    decode: RoleArgs | None = None,
    kv: KvTransferArgs | None = None,
) -> tuple[dict[int, RequestRecord], DisaggStats, DisaggReplay]:
    workload = specs if isinstance(specs, ListWorkload) else ListWorkload(list(specs))
    records: dict[int, RequestRecord] = {}

    def sink(record: RequestRecord) -> None:
        assert record.request_id not in records, "a request reached the sink twice"
        records[record.request_id] = record

    replay = DisaggReplay(prefill or prefill_role(), decode or decode_role(), kv, workload, sink)
    stats = replay.run()
    for worker in replay.workers:
        for rank in worker.ranks:
            rank.pool.check()
    return records, stats, replay


def assert_drained(replay: DisaggReplay) -> None:
    """Every lease was released: no held source, reservation, queue or active block."""
    assert not replay.flights
    for worker in replay.workers:
        assert not worker.busy
        for rank in worker.ranks:
            assert not rank.has_work
            assert rank.pool.num_active == 0
            if isinstance(rank, PrefillRank):
                assert not rank.held
            if isinstance(rank, DecodeRank):
                assert not rank.reserved and not rank.materialized and not rank.handoffs


# -- spec case 35: prefill worker holds its source ---------------------------------------


@pytest.mark.parametrize("prompt", [4, 9])
def test_case_35_prefill_worker_holds_the_source_until_released(prompt: int) -> None:
    role = prefill_role()
    rank = PrefillRank(role, make_timer(role))
    spec = Sim.spec(0, prompt, 2)
    seq = rank.new_seq(spec, record_for(spec))
    rank.submit(seq)

    first = rank.execute_pass(0.0)
    assert first.emitted == [seq] and first.finished == []  # a non-terminal token
    assert first.duration_ms == P  # decode costs nothing on a prefill worker
    second = rank.execute_pass(first.duration_ms)
    assert second.emitted == [seq] and second.finished == [seq]
    assert second.duration_ms == 0.0
    assert not rank.has_work and rank.is_held(seq)
    # Held: the blocks stay active, ceil(len / 4) of them.
    assert rank.pool.num_active == -(-(prompt + 2) // 4) == len(seq.lease)
    rank.pool.check()

    assert rank.release_source(seq) is True
    assert rank.pool.num_active == 0 and not rank.is_held(seq)
    assert rank.release_source(seq) is False  # a second release is a no-op
    assert rank.pool.num_active == 0
    rank.pool.check()


# -- spec case 36: decode destination and max_model_len -----------------------------------


@pytest.mark.parametrize("prompt", [8, 9])
def test_case_36_destination_rejects_prompts_reaching_max_model_len(prompt: int) -> None:
    role = decode_role(max_model_len=8)
    rank = DecodeRank(role, make_timer(role))
    spec = Sim.spec(0, prompt, 3)
    with pytest.raises(DestinationRejected, match="max_model_len"):
        rank.reserve_destination(spec, record_for(spec))
    assert rank.pool.num_active == 0 and not rank.reserved and not rank.has_work


@pytest.mark.parametrize("out", [1, 5])
def test_case_36_destination_reserves_activates_and_decodes_the_only_token(out: int) -> None:
    role = decode_role(max_model_len=8)
    rank = DecodeRank(role, make_timer(role))
    spec = Sim.spec(0, 7, out)
    seq = rank.reserve_destination(spec, record_for(spec))
    assert seq is not None and rank.pool.num_active == 2  # ceil(7 / 4), before any KV
    assert not rank.has_work  # reserved, not admissible until the KV arrived
    rank.activate_destination(seq)
    assert rank.has_work and seq.num_computed == 7
    res = rank.execute_pass(100.0)
    # Admitted with cached = prompt, no prefill work: one decode pass, one token, done
    # (7 + 1 reaches max_model_len 8 whatever the requested output).
    assert res.prefill_ms == 0.0 and res.decode_ms == D
    assert res.emitted == [seq] and res.finished == [seq]
    assert seq.record.first_admission_reused_tokens == 7
    assert rank.pool.num_active == 0 and not rank.has_work
    rank.pool.check()


def test_destination_with_more_blocks_than_the_pool_is_rejected() -> None:
    role = decode_role(num_gpu_blocks=2)
    rank = DecodeRank(role, make_timer(role))
    spec = Sim.spec(0, 9, 1)
    with pytest.raises(DestinationRejected, match="3 blocks"):
        rank.reserve_destination(spec, record_for(spec))
    assert rank.pool.num_active == 0


def test_destination_reuses_resident_prefix_blocks() -> None:
    role = decode_role()
    rank = DecodeRank(role, make_timer(role))
    first = Sim.spec(0, Sim.prompt((1, 8), (2, 3)), 1)
    seq = rank.reserve_destination(first, record_for(first))
    assert seq is not None and rank.resident_tokens(seq) == 0
    rank.activate_destination(seq)
    rank.execute_pass(0.0)  # decodes its token and finishes: blocks stay cached
    assert not rank.has_work and rank.pool.num_active == 0
    again = Sim.spec(1, Sim.prompt((1, 8), (3, 5)), 1)
    seq2 = rank.reserve_destination(again, record_for(again))
    assert seq2 is not None
    assert rank.resident_tokens(seq2) == 8  # the two shared full blocks
    assert rank.pool.num_active == 4  # ceil(13 / 4), two of them reused
    rank.activate_destination(seq2)
    rank.pool.check()


# -- spec case 47: transfer math -----------------------------------------------------------


def test_case_47_transfer_delay_math() -> None:
    assert transfer_delay_ms(link(1.0), 128, 0) == 128.0
    kv_full = link(1.0, bytes_per_token=1000, mode="full_prompt")
    kv_missing = link(1.0, bytes_per_token=1000, mode="destination_missing")
    assert transfer_delay_ms(kv_missing, 100, 20) == 0.02
    assert transfer_delay_ms(kv_full, 100, 20) == 0.1
    with_state = [link(1.0, 1000, mode, state_bytes=50_000)
                  for mode in ("full_prompt", "destination_missing")]
    assert transfer_delay_ms(with_state[0], 100, 20) == 0.15  # 0.1 + 0.05
    assert transfer_delay_ms(with_state[1], 100, 20) == 0.07  # 0.02 + 0.05
    # No link model, no bandwidth, a zero bandwidth or unknown bytes: no delay.
    assert transfer_delay_ms(None, 100, 100) == 0.0
    assert transfer_delay_ms(link(None), 100, 100) == 0.0
    assert transfer_delay_ms(link(0.0), 100, 100) == 0.0
    assert transfer_delay_ms(link(1.0, bytes_per_token=0), 100, 100) == 0.0


# -- TTFT decomposition and the bandwidth sweep ---------------------------------------------


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_single_request_ttft_is_prefill_plus_transfer_plus_one_decode_pass(
        backend: str) -> None:
    # (an SGLang decode rank's first token needs a decode pass too: no prompt work there)
    n = 5
    records, stats, replay = run_pd([Sim.spec(0, 128, n, arrival=3.0)], kv=link(4.0),
                                    prefill=prefill_role(backend=backend),
                                    decode=decode_role(backend=backend))
    r = records[0]
    assert r.status == "completed" and r.prefill_worker == 0 and r.decode_worker == 0
    # 10 ms prefill (its hidden token costs no decode time), 128 * 1e6 B at 4 GB/s = 32 ms,
    # then D per token on the decode worker: all n tokens come from the decode side.
    assert r.token_times == array("d", [3.0 + P + 32.0 + D * (i + 1) for i in range(n)])
    assert r.first_admit_ms == 3.0 and r.terminal_ms == r.token_times[-1]
    assert stats.transfers == 1 and stats.transfer_ms == 32.0
    assert stats.completed == 1 and stats.end_ms == r.terminal_ms
    assert stats.prefill_busy_ms == (P,) and stats.decode_busy_ms == (n * D,)
    assert_drained(replay)


@pytest.mark.parametrize("mode", ["full_prompt", "destination_missing"])
def test_bandwidth_sweep_grows_ttft_by_exactly_the_transfer_time(mode: str) -> None:
    prompt, gap = 128, 1000.0
    specs = [Sim.spec(i, prompt, 3, arrival=i * gap) for i in range(4)]  # never overlapping
    base, _, _ = run_pd(specs, kv=link(None, mode=mode))
    base_ttft = [base[i].token_times[0] - base[i].arrival_ms for i in range(4)]
    assert base_ttft == [P + D] * 4
    for bandwidth in (0.5, 1.0, 2.0, 4.0, 16.0, 64.0):
        records, stats, replay = run_pd(specs, kv=link(bandwidth, mode=mode))
        delay = prompt * 1_000_000 / bandwidth / 1e6  # exact for these powers of two
        for i in range(4):
            ttft = records[i].token_times[0] - records[i].arrival_ms
            assert ttft - base_ttft[i] == delay
            tail = [t - records[i].token_times[0] for t in records[i].token_times]
            assert tail == [0.0, D, 2 * D]  # the transfer never touches later tokens
        assert stats.transfer_ms == 4 * delay
        assert_drained(replay)


def test_ttft_includes_prefill_and_decode_queueing() -> None:
    # A prefill worker taking one sequence at a time: the second prompt waits for the
    # first prefill pass; each transfer takes 8 ms.
    prefill = prefill_role(max_sequences=1)
    specs = [Sim.spec(0, 16, 2), Sim.spec(1, 16, 2)]
    records, _, replay = run_pd(specs, prefill=prefill, kv=link(2.0, bytes_per_token=1_000_000))
    # 16 tokens * 1e6 B at 2 GB/s = 8 ms.
    assert list(records[0].token_times) == [P + 8 + D, P + 8 + 2 * D]
    # Request 1: prefill at 10-20, transfer to 28; decode worker busy 18-19 (token 1 of
    # request 0) and 19-20 (token 2, it completes): idle at 28, one pass -> 29.
    assert list(records[1].token_times) == [2 * P + 8 + D, 2 * P + 8 + 2 * D]
    assert_drained(replay)


def test_source_is_released_only_when_the_transfer_completes() -> None:
    # Prefill pool of 4 blocks: the first 16-token request holds all of them during its
    # 100 ms transfer, so the second cannot start its prefill before t = 110.
    prefill = prefill_role(num_gpu_blocks=5, max_sequences=4)
    specs = [Sim.spec(0, 16, 1), Sim.spec(1, 16, 1, arrival=1.0)]
    kv = link(0.16, bytes_per_token=1_000_000)  # 16e6 B / 0.16 GB/s = 100 ms
    records, stats, replay = run_pd(specs, prefill=prefill, kv=kv)
    assert records[0].token_times[0] == P + 100.0 + D
    assert records[1].first_admit_ms == P + 100.0
    assert records[1].token_times[0] == P + 100.0 + P + 100.0 + D
    assert stats.transfers == 2
    assert_drained(replay)


def test_destination_missing_transfers_only_non_resident_tokens() -> None:
    # Two requests sharing a 16-token prefix, one after the other on the same decode
    # worker: the second finds 16 tokens resident and moves only its 4 new ones.
    shared = [(1, 16)]
    a = Sim.spec(0, Sim.prompt(*shared, (2, 4)), 1)
    b = Sim.spec(1, Sim.prompt(*shared, (3, 4)), 1, arrival=500.0)
    kv = link(1.0, bytes_per_token=1_000_000, mode="destination_missing")
    records, _, _ = run_pd([a, b], kv=kv)
    assert records[0].token_times[0] == P + 20.0 + D
    assert records[1].token_times[0] - 500.0 == P + 4.0 + D
    assert records[1].reused_input_tokens == 16  # reused on the prefill side as well
    full, _, _ = run_pd([a, b], kv=link(1.0, bytes_per_token=1_000_000, mode="full_prompt"))
    assert full[1].token_times[0] - 500.0 == P + 20.0 + D


def test_case_48_state_bytes_add_to_every_transfer() -> None:
    # Manual P/D: 16 B/token, a 1500-byte state per request, 1e-6 GB/s (1000 B/s), full
    # prompt. The state costs 1500 ms on top of the token bytes.
    spec = [Sim.spec(0, 8, 2)]
    without, _, _ = run_pd(spec, kv=link(1e-6, bytes_per_token=16))
    with_state, _, _ = run_pd(spec, kv=link(1e-6, bytes_per_token=16, state_bytes=1500))
    ttft0 = without[0].token_times[0]
    ttft1 = with_state[0].token_times[0]
    assert ttft0 == P + 128.0 + D  # 8 tokens * 16 B at 1000 B/s
    assert ttft1 - ttft0 == 1500.0


# -- placement, rejection, zero output ----------------------------------------------------------


def test_placement_is_round_robin_per_pool() -> None:
    prefill = prefill_role(replicas=2)
    decode = decode_role(replicas=3, attention_data=2)
    specs = [Sim.spec(i, 4, 1, arrival=float(i) * 100) for i in range(7)]
    records, stats, replay = run_pd(specs, prefill=prefill, decode=decode)
    assert [records[i].prefill_worker for i in range(7)] == [0, 1, 0, 1, 0, 1, 0]
    assert [records[i].decode_worker for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert stats.completed == 7
    assert_drained(replay)


@pytest.mark.parametrize(("backend", "rejected_at"), [("vllm", P), ("sglang", 0.0)])
def test_prompt_reaching_decode_max_model_len_is_rejected_by_the_destination(
        backend: str, rejected_at: float) -> None:
    # at the handoff: after the prefill (source-first), or at arrival (destination-first)
    decode = decode_role(max_model_len=8, backend=backend)
    specs = [Sim.spec(0, 8, 2), Sim.spec(1, 7, 3, arrival=50.0)]
    records, stats, replay = run_pd(specs, decode=decode, prefill=prefill_role(backend=backend))
    assert records[0].status == "rejected" and len(records[0].token_times) == 0
    assert records[0].terminal_ms == rejected_at
    assert records[1].status == "completed"
    assert list(records[1].token_times) == [50.0 + P + D]  # 7 + 1 = max_model_len
    assert stats.rejected == 1 and stats.completed == 1 and stats.transfers == 1
    assert_drained(replay)


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_prompt_reaching_prefill_max_model_len_is_rejected_before_prefill(backend: str) -> None:
    # (destination-first, the reservation made at arrival is cancelled: drained below)
    records, stats, replay = run_pd([Sim.spec(0, 8, 2)],
                                    prefill=prefill_role(max_model_len=8, backend=backend),
                                    decode=decode_role(backend=backend))
    assert records[0].status == "rejected" and records[0].terminal_ms == 0.0
    assert stats.transfers == 0 and stats.passes == 1
    assert_drained(replay)


def test_zero_output_request_completes_on_the_decode_side_without_a_token() -> None:
    records, stats, replay = run_pd([Sim.spec(0, 8, 0)], kv=link(1.0))
    r = records[0]
    assert r.status == "completed" and len(r.token_times) == 0
    assert r.terminal_ms == P + 8.0  # prefill, transfer, a zero-time admission pass
    assert stats.decode_busy_ms == (0.0,)
    assert_drained(replay)


def test_decode_reservations_wait_for_capacity_in_order() -> None:
    # Decode pool of 4 blocks of 4 tokens. All three prompts prefill in one pass (0-10).
    # Request 0 (8 tokens, 8 outputs) reserves 2 blocks and grows to 4 while decoding;
    # request 1 (12 tokens = 3 blocks) does not fit beside it, and request 2 (1 block),
    # which would fit, queues behind request 1: reservations are retried in order at
    # every decode pass end and both go through when request 0 finishes at 18.
    decode = decode_role(num_gpu_blocks=4)
    specs = [Sim.spec(0, 8, 8), Sim.spec(1, 12, 1), Sim.spec(2, 4, 1)]
    records, stats, replay = run_pd(specs, prefill=prefill_role(max_sequences=4),
                                    decode=decode)
    assert list(records[0].token_times) == [P + D * k for k in range(1, 9)]
    assert list(records[1].token_times) == [P + 9 * D]
    assert list(records[2].token_times) == [P + 9 * D]
    assert stats.completed == 3 and stats.transfers == 3
    assert_drained(replay)


@pytest.mark.parametrize("placement", ["round_robin", "least_loaded"])
def test_handoffs_spread_over_the_decode_ranks(placement: str) -> None:
    # Both prompts prefill in one pass (0-10) and hand off together to a decode worker of
    # two ranks with one sequence each. Least-loaded placement counts the handoff placed
    # a moment before, still waiting to reserve, so the second goes to the other rank
    # and both decode at once instead of one after the other.
    decode = decode_role(attention_data=2, max_sequences=1, attention_dp_placement=placement)
    specs = [Sim.spec(i, 4, 3) for i in range(2)]
    records, stats, replay = run_pd(specs, prefill=prefill_role(max_sequences=2), decode=decode)
    for i in range(2):
        assert list(records[i].token_times) == [P + D, P + 2 * D, P + 3 * D]
    assert stats.completed == 2
    assert_drained(replay)


def test_max_sequences_bounds_destinations() -> None:
    decode = decode_role(max_sequences=1)
    specs = [Sim.spec(i, 4, 3) for i in range(3)]
    records, stats, replay = run_pd(specs, prefill=prefill_role(max_sequences=3), decode=decode)
    # One prefill pass for all three (P); then the decode worker serves them one by one.
    assert [list(records[i].token_times) for i in range(3)] == [
        [P + D, P + 2 * D, P + 3 * D],
        [P + 4 * D, P + 5 * D, P + 6 * D],
        [P + 7 * D, P + 8 * D, P + 9 * D],
    ]
    assert stats.completed == 3
    assert_drained(replay)


def test_sglang_reserves_the_destination_before_the_prefill_starts() -> None:
    # The decode worker takes one request at a time. Source-first (vLLM), the three
    # prompts prefill together and wait for the destination afterwards (see above);
    # destination-first (SGLang), a prompt is prefilled only once its destination is
    # reserved, when the request before it completes.
    specs = [Sim.spec(i, 4, 3) for i in range(3)]
    records, stats, replay = run_pd(specs, prefill=prefill_role(max_sequences=3, backend="sglang"),
                                    decode=decode_role(max_sequences=1, backend="sglang"))
    starts = [0.0, P + 3 * D, 2 * (P + 3 * D)]
    assert [records[i].first_admit_ms for i in range(3)] == starts
    assert [list(records[i].token_times) for i in range(3)] == [
        [start + P + D * k for k in (1, 2, 3)] for start in starts]
    assert stats.completed == 3
    assert_drained(replay)


def test_cutoff_leaves_in_flight_requests_incomplete() -> None:
    workload = ListWorkload([Sim.spec(0, 16, 4), Sim.spec(1, 16, 4, arrival=1.0)],
                            max_time_ms=P + 50.0)
    records, stats, _ = run_pd(workload, kv=link(0.16))  # 100 ms transfers
    assert {r.status for r in records.values()} == {"incomplete"}
    assert stats.incomplete == 2 and stats.transfers == 0


# -- state cache and speculation in P/D ----------------------------------------------------


def _state(blocks: int = 2) -> StateCacheArgs:
    return StateCacheArgs(bytes_per_request=1, state_blocks=blocks, allocated_bytes_per_request=1)


def test_prefill_source_holds_its_working_state_too() -> None:
    role = prefill_role(state_cache=_state())
    rank = PrefillRank(role, make_timer(role))
    spec = Sim.spec(0, 8, 1)
    seq = rank.new_seq(spec, record_for(spec))
    rank.submit(seq)
    res = rank.execute_pass(0.0)
    assert res.finished == [seq] and rank.is_held(seq)
    assert rank.pool.num_active == 2 + 2  # prompt blocks + working state
    assert rank.release_source(seq) and rank.pool.num_active == 0
    assert not rank.release_source(seq)
    rank.pool.check()


def test_destination_reserves_a_working_state_beside_the_prompt() -> None:
    role = decode_role(state_cache=_state(), num_gpu_blocks=5)
    rank = DecodeRank(role, make_timer(role))
    big = Sim.spec(0, 13, 1)  # 4 token blocks + 2 state blocks > 5
    with pytest.raises(DestinationRejected, match="6 blocks"):
        rank.reserve_destination(big, record_for(big))
    spec = Sim.spec(1, 8, 3)
    seq = rank.reserve_destination(spec, record_for(spec))
    assert seq is not None and rank.pool.num_active == 4
    other = Sim.spec(2, 8, 1)
    assert rank.reserve_destination(other, record_for(other)) is None  # 4 more do not fit
    rank.activate_destination(seq)
    t = 0.0
    for _ in range(3):
        res = rank.execute_pass(t)
        t += res.duration_ms
    assert res.finished == [seq] and rank.pool.num_active == 0
    rank.pool.check()


def test_pd_with_state_cache_and_speculation_completes_and_drains() -> None:
    spec_args = SpeculationArgs(kind="mtp", num_speculative_tokens=2, acceptance_rates=(1.0, 1.0))
    prefill = prefill_role(state_cache=_state(1), speculation=spec_args)
    decode = decode_role(state_cache=_state(1), speculation=spec_args)
    specs = [Sim.spec(i, Sim.prompt((1, 8), (10 + i, 5)), 7, arrival=i * 2.0) for i in range(4)]
    records, stats, replay = run_pd(specs, prefill=prefill, decode=decode,
                                    kv=link(1.0, mode="destination_missing", state_bytes=10**6))
    assert stats.completed == 4
    for r in records.values():
        # Bursts of 3 (both drafts always accepted) after the first token: 1 + 3 + 3.
        assert len(r.token_times) == 7 and len(set(r.token_times)) == 3
    assert_drained(replay)


CASE_48 = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3.5-35B-A3B"
hardware = "h200_sxm"
context_length = 8192
[engine.workers.prefill.kv_cache]
block_size = 64
bytes_per_token = 16
[engine.workers.prefill.kv_cache.capacity]
type = "fixed"
bytes = 8192
[engine.workers.prefill.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 0.0
[engine.workers.decode.kv_cache]
block_size = 64
bytes_per_token = 16
[engine.workers.decode.kv_cache.capacity]
type = "fixed"
bytes = 8192
[engine.workers.decode.timing]
type = "fixed"
prefill_ms = 0.0
decode_ms = 5.0
[engine.kv_transfer]
bandwidth_gb_per_second = 1e-6
timing_mode = "full_prompt"
[traffic.source]
type = "synthetic"
input_tokens = 128
output_tokens = 3
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
requests = 2
"""

STATE = """
[engine.workers.{role}.kv_cache.state_cache]
bytes_per_request = 1500
"""


def test_case_48_a_1500_byte_state_adds_1500_ms_to_ttft() -> None:
    from servesim.compiler import SourceText, compile_source
    from servesim.replay import replay

    def report(text: str) -> dict[str, Any]:
        payload = compile_source(SourceText(text=text, name="case48.toml"))
        return replay(payload)

    plain = report(CASE_48)
    state_text = CASE_48.replace("[engine.kv_transfer]", STATE.format(role="prefill")
                                 + STATE.format(role="decode") + "[engine.kv_transfer]")
    payload = compile_source(SourceText(text=state_text, name="case48.toml"))
    assert payload.kv_transfer is not None and payload.kv_transfer.state_bytes == 1500
    assert payload.kv_transfer.bytes_per_token == 16
    with_state = report(state_text)
    # 128 tokens * 16 B at 1000 B/s = 2048 ms; the state adds 1500 B = 1500 ms. (A
    # block-aligned prompt: a state cache cuts an unaligned one into two prefill chunks.)
    assert plain["mean_ttft_ms"] == 10.0 + 2048.0 + 5.0
    assert with_state["mean_ttft_ms"] - plain["mean_ttft_ms"] == 1500.0
    assert with_state["completed_requests"] == plain["completed_requests"] == 2
    assert with_state["mean_kv_transfer_ms"] == 3548.0


def test_zero_time_preemption_cycle_waits_for_the_transfer() -> None:
    # Free passes on the decode side (prefill_ms = decode_ms = 0): request 1, alone in
    # running, is readmitted into the 5 blocks a reservation leaves free, then preempts
    # itself because its speculative burst needs 6, at the same instant, forever - unless
    # the replay notices the repeated state and waits for the reservation's transfer.
    spec_args = SpeculationArgs(kind="mtp", num_speculative_tokens=2, acceptance_rates=(1.0, 1.0))
    free = TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=0.0)
    prefill = prefill_role(block_size=3, num_gpu_blocks=4, max_sequences=2,
                           enable_chunked_prefill=False, max_batched_tokens=22,
                           prefix_caching=False, timing=free, speculation=spec_args)
    decode = decode_role(block_size=2, num_gpu_blocks=10, max_sequences=2,
                         enable_chunked_prefill=False, max_batched_tokens=22,
                         prefix_caching=False, timing=free, speculation=spec_args)
    kv = link(1.0, bytes_per_token=1, mode="destination_missing", state_bytes=500_000)
    first = Sim.spec(0, Sim.prompt((0, 3)), 4)
    follow = Sim.spec(100, Sim.prompt((0, 3), (5, 4), (3, 2)), 0)
    workload = ListWorkload([first, Sim.spec(1, Sim.prompt((0, 6)), 6, arrival=0.5)],
                            followups={0: [follow]})
    records, stats, replay = run_pd(workload, prefill=prefill, decode=decode, kv=kv)
    assert stats.completed == 3 and len(records[1].token_times) == 6
    assert_drained(replay)


def test_prefill_ranks_prefilling_together_are_priced_with_all_their_tokens() -> None:
    # A two-rank prefill worker computes requests 0 and 1 (4 + 6 prompt tokens) in one
    # pass: each rank's prefill half is priced with the group's 10 tokens (10 + 10 ms,
    # see GroupTimer), then one decode pass (1 ms); no link, so no transfer time.
    prefill = prefill_role(attention_data=2)
    records: dict[int, RequestRecord] = {}
    replay = DisaggReplay(prefill, decode_role(), None,
                          ListWorkload([Sim.spec(0, 4, 1), Sim.spec(1, 6, 1)]),
                          lambda r: records.__setitem__(r.request_id, r),
                          prefill_timer=GroupTimer(), decode_timer=GroupTimer())
    replay.run()
    assert records[0].token_times == records[1].token_times == array("d", [21.0])


def test_work_handed_over_at_the_same_instant_is_not_taken_for_a_zero_time_cycle() -> None:
    # Free prefill on both pools: request 0's decode rank keeps preempting and
    # recomputing it at t = 2 while the prefill worker hands over follow-up turns at that
    # same instant. The decode worker's own state repeats between handovers, which is
    # not a cycle (a hypothesis case once reported it as a stuck replay).
    def turn(rid: int, *parts: tuple[int, int], out: int = 0) -> RequestSpec:
        return Sim.spec(rid, Sim.prompt((0, 1), *parts), out)

    free = TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=0.0)
    prefill = prefill_role(max_batched_tokens=1, max_sequences=1, block_size=2,
                           num_gpu_blocks=2, prefix_caching=False, timing=free)
    decode = decode_role(max_batched_tokens=1, max_sequences=3, block_size=2,
                         num_gpu_blocks=3, prefix_caching=False,
                         timing=TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=1.0))
    specs = [turn(0, out=3)] + [turn(i) for i in range(1, 6)]
    followups = {0: [turn(100, (-1, 3), (3, 1))], 1: [turn(101, (3, 2))],
                 3: [turn(103, (3, 1))], 4: [turn(104, (3, 1))]}
    records: dict[int, RequestRecord] = {}
    DisaggReplay(prefill, decode, None, ListWorkload(specs, followups=followups),
                 lambda r: records.__setitem__(r.request_id, r)).run()
    assert len(records) == 10
    # turn 100's five tokens never fit the two-block prefill pool
    assert {r.request_id for r in records.values() if r.status != "completed"} == {100}
    assert records[100].status == "rejected"
    assert len(records[0].token_times) == 3
