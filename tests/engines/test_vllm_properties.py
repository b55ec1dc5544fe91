"""Property tests over random small workloads and pools."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.payload import RoleArgs, TimingArgs

from .conftest import ListWorkload, Sim


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RoleArgs, ListWorkload]:
    block = draw(st.integers(2, 4))
    chunked = draw(st.booleans())
    n = draw(st.integers(1, 10))
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    arrival = 0.0
    for rid in range(n):
        arrival += draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 20.0]))
        # Prompts from a few shared keys, so prefixes (and whole blocks) collide.
        parts = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 6)), min_size=1,
                              max_size=3))
        prompt = make_prompt([Segment(k, m, repeat=False) for k, m in parts])
        out = draw(st.integers(0, 6))
        spec = RequestSpec(rid, arrival, prompt, prompt_length(prompt), out)
        if draw(st.integers(0, 3)) == 0:  # a session turn reusing this request's output
            follow = make_prompt([*prompt, Segment(generated_key(rid), out, repeat=False),
                                  Segment(3, draw(st.integers(1, 4)), repeat=False)])
            turn = RequestSpec(100 + rid, draw(st.sampled_from([0.0, 1.0])), follow,
                               prompt_length(follow), draw(st.integers(0, 3)))
            followups[rid] = [turn]
        specs.append(spec)
    longest = max(s.input_length for s in specs) + 10 + 6
    role = RoleArgs(
        worker_type="aggregated", backend="vllm", model="m", hardware="h",
        block_size=block,
        num_gpu_blocks=draw(st.integers(1, 16)),
        max_batched_tokens=draw(st.integers(1, 12)) if chunked else longest,
        max_sequences=draw(st.integers(1, 4)),
        enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["lifo", "fifo"])),
        prefix_caching=draw(st.booleans()),
        max_model_len=draw(st.one_of(st.none(), st.integers(2, 24))),
        attention_data=draw(st.integers(1, 2)),
        prefill_schedule_interval=draw(st.integers(1, 3)),
        replicas=draw(st.integers(1, 2)),
        timing=TimingArgs(type="fixed", prefill_ms=draw(st.sampled_from([0.0, 2.0, 10.0])),
                          decode_ms=draw(st.sampled_from([0.0, 1.0, 2.5]))),
    )
    return role, ListWorkload(specs, followups=followups)


def _key(r: RequestRecord) -> tuple[Any, ...]:
    return (r.request_id, r.status, tuple(r.token_times), r.first_admit_ms, r.terminal_ms,
            r.reused_input_tokens, r.first_admission_reused_tokens, r.num_preemptions,
            r.decode_worker, r.arrival_ms)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_once_and_the_pools_drain(case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    records, stats, replay = Sim.run(role, workload)  # Sim.run asserts "exactly once"
    released = sum(len(workload.followups.get(r, [])) for r in records)
    assert len(records) == len(workload.specs) + released == stats.num_requests
    cap = role.num_gpu_blocks * role.block_size + 1
    if role.max_model_len is not None:
        cap = min(cap, role.max_model_len)
    for r in records.values():
        assert r.status in ("completed", "rejected")
        if r.status == "rejected":
            too_long = role.max_model_len is not None and r.input_length >= role.max_model_len
            too_big = -(-r.input_length // role.block_size) > role.num_gpu_blocks
            assert too_long or too_big
            assert len(r.token_times) == 0
            continue
        expected = max(0, min(r.requested_output_length, cap - r.input_length))
        assert len(r.token_times) == expected
        assert list(r.token_times) == sorted(r.token_times)
        if r.token_times:
            assert r.arrival_ms <= r.token_times[0] <= r.token_times[-1] == r.terminal_ms
        assert r.first_admit_ms is not None and r.arrival_ms <= r.first_admit_ms
        assert r.reused_input_tokens <= r.input_length
        assert r.first_admission_reused_tokens <= r.reused_input_tokens
    for worker in replay.workers:
        for rank in worker.ranks:
            assert not rank.has_work
            assert rank.pool.num_active == 0  # every block is free or inactive cached
            assert rank.pool.num_inactive + rank.pool.num_free == role.num_gpu_blocks


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_replays_are_deterministic(case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    first, s1, _ = Sim.run(role, workload)
    again = ListWorkload(workload.specs, followups=workload.followups)
    second, s2, _ = Sim.run(role, again)
    assert [_key(first[k]) for k in sorted(first)] == [_key(second[k]) for k in sorted(second)]
    assert s1 == s2


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_inlined_decode_step_matches_the_general_path(case: tuple[RoleArgs, ListWorkload]) -> None:
    from servesim.engines.vllm import AggregatedReplay
    from servesim.timing import make_timer

    role, workload = case
    results = []
    for fast in (True, False):
        records: list[RequestRecord] = []
        replay = AggregatedReplay(role, make_timer(role),
                                  ListWorkload(workload.specs, followups=workload.followups),
                                  records.append, None)
        for worker in replay.workers:
            for rank in worker.ranks:
                rank.fast_decode = fast
        stats = replay.run()
        results.append((sorted(_key(r) for r in records), stats))
    assert results[0] == results[1]
