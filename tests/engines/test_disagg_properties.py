"""Property tests of the P/D replay over random small pools, workloads and links."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.disagg.ranks import DecodeRank, PrefillRank
from servesim.engines.disagg.transfer import transfer_delay_ms
from servesim.engines.kernel.metrics import TTFT_PARTS, ttft_parts
from servesim.engines.kernel.requests import RequestRecord
from servesim.payload import KvTransferArgs, RoleArgs, StateCacheArgs

from .conftest import ListWorkload
from .strategies import (
    BACKENDS,
    Sink,
    check_drained,
    check_records,
    fresh,
    kv_transfers,
    longest,
    replayed,
    roles,
    sink_once,
    speculations,
    workloads,
)

Case = tuple[RoleArgs, RoleArgs, KvTransferArgs | None, ListWorkload]


@st.composite
def scenarios(draw: st.DrawFn) -> Case:
    workload = draw(workloads())
    room = longest(workload, 10 + 6)
    kv = draw(kv_transfers())
    # Both roles or neither carry a state cache; speculation is deployment-wide.
    state = draw(st.booleans())
    speculation = draw(st.one_of(st.none(), speculations()))
    backend = "vllm" if state else draw(BACKENDS)  # one backend for both pools

    def role(worker_type: str) -> RoleArgs:
        state_blocks = draw(st.integers(1, 2)) if state else 0
        return draw(roles(worker_type, room, num_gpu_blocks=st.integers(state_blocks + 1, 16),
                          state_cache=StateCacheArgs(bytes_per_request=1,
                                                     state_blocks=state_blocks,
                                                     allocated_bytes_per_request=1)
                          if state else None,
                          speculation=speculation, tensor=st.sampled_from([1, 2]),
                          backend=backend))

    return role("prefill"), role("decode"), kv, workload


def _replay(case: Case) -> Callable[[Sink], DisaggReplay]:
    prefill, decode, kv, workload = case
    return lambda sink: DisaggReplay(prefill, decode, kv, fresh(workload), sink)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_once_and_every_lease_is_released(case: Case) -> None:
    prefill, decode, kv, workload = case
    records: dict[int, RequestRecord] = {}
    replay = _replay(case)(sink_once(records))
    stats = replay.run()
    # the decode side produces every output token (the bootstrap token is hidden)
    check_records(records, workload, prefill, decode)
    assert len(records) == stats.num_requests
    assert stats.completed + stats.rejected == stats.num_requests and stats.incomplete == 0
    for r in records.values():
        if r.status == "completed" and r.token_times and kv is not None \
                and kv.timing_mode == "full_prompt":
            # TTFT covers at least the prompt's full transfer in full_prompt mode.
            assert r.first_admit_ms is not None
            delay = transfer_delay_ms(kv, r.input_length, r.input_length)
            assert r.token_times[0] >= r.first_admit_ms + delay
        if r.status == "completed":
            assert r.prefill_worker is not None and 0 <= r.prefill_worker < prefill.replicas
            assert r.decode_worker is not None and 0 <= r.decode_worker < decode.replicas
    # Exactly one transfer per request that reached a destination reservation.
    handed_off = sum(1 for r in records.values() if r.status == "completed")
    assert stats.transfers == handed_off
    assert not replay.flights
    check_drained(replay)
    for worker in replay.workers:
        assert not worker.busy
        for rank in worker.ranks:
            if isinstance(rank, PrefillRank):
                assert not rank.held
            if isinstance(rank, DecodeRank):
                assert not rank.reserved and not rank.materialized and not rank.handoffs


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_replays_are_deterministic(case: Case) -> None:
    first, _ = replayed(_replay(case))
    second, _ = replayed(_replay(case))
    assert first == second


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_handoff_instants_are_ordered_and_split_the_ttft_exactly(case: Case) -> None:
    records: dict[int, RequestRecord] = {}
    _replay(case)(sink_once(records)).run()
    for r in records.values():
        if not r.token_times:
            continue
        instants = [r.arrival_ms, r.first_admit_ms, r.prefill_end_ms, r.kv_transfer_start_ms,
                    r.kv_transfer_end_ms, r.decode_admit_ms, r.token_times[0]]
        assert None not in instants
        assert instants == sorted(instants)  # type: ignore[type-var]
        parts = ttft_parts(r)
        assert parts is not None and list(parts) == list(TTFT_PARTS)
        assert sum(parts.values()) == r.token_times[0] - r.arrival_ms
