"""Property tests of the P/D replay over random small pools, workloads and links."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay, DisaggStats
from servesim.engines.disagg.ranks import DecodeRank, PrefillRank
from servesim.engines.disagg.transfer import transfer_delay_ms
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.payload import (
    KvTransferArgs,
    RoleArgs,
    SpeculationArgs,
    StateCacheArgs,
    TimingArgs,
)

from .conftest import ListWorkload

Case = tuple[RoleArgs, RoleArgs, KvTransferArgs | None, ListWorkload]


@st.composite
def roles(draw: st.DrawFn, worker_type: str, longest: int, state: bool,
          speculation: SpeculationArgs | None) -> RoleArgs:
    chunked = draw(st.booleans())
    state_blocks = draw(st.integers(1, 2)) if state else 0
    return RoleArgs(
        worker_type=worker_type,  # type: ignore[arg-type]
        backend="vllm", model="m", hardware="h",
        block_size=draw(st.integers(2, 4)),
        num_gpu_blocks=draw(st.integers(state_blocks + 1, 16)),
        state_cache=StateCacheArgs(bytes_per_request=1, state_blocks=state_blocks,
                                   allocated_bytes_per_request=1) if state else None,
        speculation=speculation,
        max_batched_tokens=draw(st.integers(1, 12)) if chunked else longest,
        max_sequences=draw(st.integers(1, 4)),
        enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["lifo", "fifo"])),
        prefix_caching=draw(st.booleans()),
        max_model_len=draw(st.one_of(st.none(), st.integers(2, 24))),
        attention_data=draw(st.integers(1, 2)),
        prefill_schedule_interval=draw(st.integers(1, 3)),
        replicas=draw(st.integers(1, 2)),
        tensor=draw(st.sampled_from([1, 2])),
        timing=TimingArgs(type="fixed", prefill_ms=draw(st.sampled_from([0.0, 2.0, 10.0])),
                          decode_ms=draw(st.sampled_from([0.0, 1.0, 2.5]))),
    )


@st.composite
def scenarios(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 10))
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    arrival = 0.0
    for rid in range(n):
        arrival += draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 20.0]))
        parts = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1,
                              max_size=3))
        prompt = make_prompt([Segment(k, m, repeat=False) for k, m in parts])
        out = draw(st.integers(0, 6))
        specs.append(RequestSpec(rid, arrival, prompt, prompt_length(prompt), out))
        if draw(st.integers(0, 3)) == 0:  # a session turn reusing this request's output
            follow = make_prompt([*prompt, Segment(generated_key(rid), out, repeat=False),
                                  Segment(3, draw(st.integers(1, 4)), repeat=False)])
            followups[rid] = [RequestSpec(100 + rid, draw(st.sampled_from([0.0, 1.0])), follow,
                                          prompt_length(follow), draw(st.integers(0, 3)))]
    longest = max(s.input_length for s in specs) + 10 + 6
    kv = draw(st.one_of(st.none(), st.builds(
        KvTransferArgs,
        bytes_per_token=st.sampled_from([1, 1_000_000]),
        bandwidth_gb_per_second=st.sampled_from([None, 1.0, 4.0, 250.0]),
        timing_mode=st.sampled_from(["full_prompt", "destination_missing"]),
        state_bytes=st.sampled_from([0, 500_000]),
    )))
    # Both roles or neither carry a state cache; speculation is deployment-wide.
    state = draw(st.booleans())
    speculation = draw(st.one_of(st.none(), st.builds(
        SpeculationArgs, kind=st.sampled_from(["mtp", "ngram"]), num_speculative_tokens=st.just(2),
        acceptance_rates=st.sampled_from([(1.0, 1.0), (0.7, 0.4), (0.0, 0.0)]),
        seed=st.integers(0, 3))))
    return (draw(roles("prefill", longest, state, speculation)),
            draw(roles("decode", longest, state, speculation)), kv,
            ListWorkload(specs, followups=followups))


def run(case: Case) -> tuple[dict[int, RequestRecord], DisaggStats, DisaggReplay]:
    prefill, decode, kv, workload = case
    workload = ListWorkload(workload.specs, followups=workload.followups)
    records: dict[int, RequestRecord] = {}

    def sink(record: RequestRecord) -> None:
        assert record.request_id not in records, "a request reached the sink twice"
        records[record.request_id] = record

    replay = DisaggReplay(prefill, decode, kv, workload, sink)
    return records, replay.run(), replay


def _state_blocks(role: RoleArgs) -> int:
    return role.state_cache.state_blocks if role.state_cache is not None else 0


def _cap(role: RoleArgs) -> int:
    cap = (role.num_gpu_blocks - _state_blocks(role)) * role.block_size + 1
    return cap if role.max_model_len is None else min(cap, role.max_model_len)


def _never_fits(role: RoleArgs, prompt: int) -> bool:
    too_long = role.max_model_len is not None and prompt >= role.max_model_len
    blocks = -(-prompt // role.block_size) + _state_blocks(role)
    return too_long or blocks > role.num_gpu_blocks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_once_and_every_lease_is_released(case: Case) -> None:
    prefill, decode, kv, workload = case
    records, stats, replay = run(case)
    released = sum(len(workload.followups.get(r, [])) for r in records)
    assert len(records) == len(workload.specs) + released == stats.num_requests
    assert stats.completed + stats.rejected == stats.num_requests and stats.incomplete == 0
    for r in records.values():
        assert r.status in ("completed", "rejected")
        if r.status == "rejected":
            assert _never_fits(prefill, r.input_length) or _never_fits(decode, r.input_length)
            assert len(r.token_times) == 0
            continue
        assert not _never_fits(prefill, r.input_length)
        assert not _never_fits(decode, r.input_length)
        # The decode side produces every output token (the bootstrap token is hidden).
        expected = max(0, min(r.requested_output_length, _cap(decode) - r.input_length))
        assert len(r.token_times) == expected
        assert list(r.token_times) == sorted(r.token_times)
        assert r.first_admit_ms is not None and r.arrival_ms <= r.first_admit_ms
        if r.token_times:
            assert r.token_times[-1] == r.terminal_ms
            # TTFT covers at least the prompt's full transfer in full_prompt mode.
            if kv is not None and kv.timing_mode == "full_prompt":
                delay = transfer_delay_ms(kv, r.input_length, r.input_length)
                assert r.token_times[0] >= r.first_admit_ms + delay
        assert r.reused_input_tokens <= r.input_length
        assert r.first_admission_reused_tokens <= r.reused_input_tokens
        assert r.prefill_worker is not None and 0 <= r.prefill_worker < prefill.replicas
        assert r.decode_worker is not None and 0 <= r.decode_worker < decode.replicas
    # Exactly one transfer per request that reached a destination reservation.
    handed_off = sum(1 for r in records.values() if r.status == "completed")
    assert stats.transfers == handed_off
    assert not replay.flights and not replay.handoffs
    for worker in replay.workers:
        assert not worker.busy
        for rank in worker.ranks:
            rank.pool.check()
            assert not rank.has_work and rank.pool.num_active == 0
            assert rank.pool.num_inactive + rank.pool.num_free == rank.pool.num_blocks
            if isinstance(rank, PrefillRank):
                assert not rank.held
            if isinstance(rank, DecodeRank):
                assert not rank.reserved and not rank.materialized


def _key(r: RequestRecord) -> tuple[Any, ...]:
    return (r.request_id, r.status, tuple(r.token_times), r.first_admit_ms, r.terminal_ms,
            r.reused_input_tokens, r.first_admission_reused_tokens, r.num_preemptions,
            r.prefill_worker, r.decode_worker, r.arrival_ms)


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_replays_are_deterministic(case: Case) -> None:
    first, s1, _ = run(case)
    second, s2, _ = run(case)
    assert [_key(first[k]) for k in sorted(first)] == [_key(second[k]) for k in sorted(second)]
    assert s1 == s2
