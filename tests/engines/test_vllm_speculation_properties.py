"""Property tests: random speculative workloads, with and without a state cache, conserve
blocks (every reference the pool counts is held by exactly one lease) and tokens (every
request gets exactly the tokens its stop length allows, bursts included)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.engines.vllm import AggregatedReplay, RankScheduler, Worker
from servesim.engines.vllm.scheduler import RUNNING
from servesim.payload import RoleArgs, SpeculationArgs, StateCacheArgs, TimingArgs
from servesim.timing import make_timer

from .conftest import ListWorkload


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RoleArgs, ListWorkload]:
    block = draw(st.integers(2, 4))
    chunked = draw(st.booleans())
    n = draw(st.integers(1, 8))
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    arrival = 0.0
    for rid in range(n):
        arrival += draw(st.sampled_from([0.0, 0.0, 0.5, 3.0, 20.0]))
        parts = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 7)), min_size=1,
                              max_size=3))
        prompt = make_prompt([Segment(k, m, repeat=False) for k, m in parts])
        out = draw(st.integers(0, 12))
        specs.append(RequestSpec(rid, arrival, prompt, prompt_length(prompt), out))
        if draw(st.integers(0, 3)) == 0:  # a session turn reusing this request's output
            follow = make_prompt([*prompt, Segment(generated_key(rid), out, repeat=False),
                                  Segment(3, draw(st.integers(1, 4)), repeat=False)])
            followups[rid] = [RequestSpec(100 + rid, draw(st.sampled_from([0.0, 1.0])), follow,
                                          prompt_length(follow), draw(st.integers(0, 6)))]
    state_blocks = draw(st.sampled_from([0, 0, 1, 2]))
    state = None
    unit = None
    if state_blocks:
        state = StateCacheArgs(bytes_per_request=state_blocks * block,
                               state_blocks=state_blocks,
                               allocated_bytes_per_request=state_blocks * block)
    nextn = draw(st.integers(1, 3))
    speculation = draw(st.one_of(st.none(), st.builds(
        SpeculationArgs, kind=st.sampled_from(["mtp", "ngram"]),
        num_speculative_tokens=st.just(nextn),
        acceptance_rates=st.lists(st.sampled_from([0.0, 0.3, 0.7, 1.0]), min_size=nextn,
                                  max_size=nextn).map(tuple),
        seed=st.integers(0, 5))))
    if state is not None and draw(st.booleans()):
        # sub-block units only without speculation (the shared rule)
        unit = block if speculation is not None else draw(
            st.sampled_from([d for d in range(1, block + 1) if block % d == 0]))
    longest = max(s.input_length for s in specs) + 40
    role = RoleArgs(
        worker_type="aggregated", backend="vllm", model="m", hardware="h",
        block_size=block,
        num_gpu_blocks=draw(st.integers(state_blocks + 1, 16)),
        max_batched_tokens=draw(st.integers(1, 12)) if chunked else longest,
        max_sequences=draw(st.integers(1, 4)),
        enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["lifo", "fifo"])),
        prefix_caching=draw(st.booleans()),
        max_model_len=draw(st.one_of(st.none(), st.integers(2, 30))),
        attention_data=draw(st.integers(1, 2)),
        replicas=draw(st.integers(1, 2)),
        kv_bytes_per_token=1,
        state_cache=state,
        prefix_match_unit=unit,
        speculation=speculation,
        timing=TimingArgs(type="fixed", prefill_ms=draw(st.sampled_from([0.0, 2.0, 10.0])),
                          decode_ms=draw(st.sampled_from([0.0, 1.0, 2.5]))),
    )
    return role, ListWorkload(specs, followups=followups)


def _check_conservation(rank: RankScheduler) -> None:
    """Every pool reference belongs to a lease of a running request, and vice versa."""
    rank.pool.check()
    held: Counter[int] = Counter()
    for seq in rank.running:
        assert seq.status == RUNNING
        # every computed token (accepted drafts included) has its KV slot
        assert seq.num_computed <= len(seq.lease) * rank.block_size
        held.update(seq.lease)
        if seq.state is not None:
            held.update(seq.state.working)
            for ck in seq.state.retained:
                if ck.held:
                    held.update(ck.blocks)
    for seq in rank.waiting:
        assert seq.lease == []
        if seq.state is not None:
            assert seq.state.working == []
            assert not any(ck.held for ck in seq.state.retained)
    assert dict(held) == rank.pool._ref
    if rank.state is not None:
        for seq in rank.running:
            assert seq.state is not None
            assert len(seq.state.working) in (0, rank.state_blocks)


class CheckedReplay(AggregatedReplay):
    def _end_pass(self, worker: Worker) -> None:
        super()._end_pass(worker)
        assert self.passes < 5000, "the replay does not converge"
        for rank in worker.ranks:
            _check_conservation(rank)


def _run(role: RoleArgs, workload: ListWorkload) -> tuple[dict[int, RequestRecord], Any]:
    records: dict[int, RequestRecord] = {}

    def sink(record: RequestRecord) -> None:
        assert record.request_id not in records, "a request reached the sink twice"
        records[record.request_id] = record

    replay = CheckedReplay(role, make_timer(role),
                           ListWorkload(workload.specs, followups=workload.followups), sink, None)
    replay.run()
    return records, replay


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_speculative_and_state_workloads_conserve_blocks_and_tokens(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    records, replay = _run(role, workload)
    released = sum(len(workload.followups.get(r, [])) for r in records)
    assert len(records) == len(workload.specs) + released
    state_blocks = role.state_cache.state_blocks if role.state_cache else 0
    cap = (role.num_gpu_blocks - state_blocks) * role.block_size + 1
    if role.max_model_len is not None:
        cap = min(cap, role.max_model_len)
    for r in records.values():
        assert r.status in ("completed", "rejected")
        if r.status == "rejected":
            too_long = role.max_model_len is not None and r.input_length >= role.max_model_len
            blocks = -(-r.input_length // role.block_size) + state_blocks
            assert too_long or blocks > role.num_gpu_blocks
            assert len(r.token_times) == 0
            continue
        assert len(r.token_times) == max(0, min(r.requested_output_length, cap - r.input_length))
        assert list(r.token_times) == sorted(r.token_times)
        if r.token_times:
            assert r.token_times[-1] == r.terminal_ms
        assert r.reused_input_tokens <= r.input_length
    for worker in replay.workers:
        for rank in worker.ranks:
            assert not rank.has_work
            assert rank.pool.num_active == 0
            assert rank.pool.num_inactive + rank.pool.num_free == role.num_gpu_blocks


def _key(r: RequestRecord) -> tuple[Any, ...]:
    return (r.request_id, r.status, tuple(r.token_times), r.terminal_ms, r.reused_input_tokens,
            r.num_preemptions)


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_speculative_and_state_replays_are_deterministic(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    first, _ = _run(role, workload)
    second, _ = _run(role, workload)
    assert [_key(first[k]) for k in sorted(first)] == [_key(second[k]) for k in sorted(second)]


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_inlined_decode_step_matches_the_general_path(case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    results = []
    for fast in (True, False):
        records: list[RequestRecord] = []
        replay = CheckedReplay(role, make_timer(role),
                               ListWorkload(workload.specs, followups=workload.followups),
                               records.append, None)
        for worker in replay.workers:
            for rank in worker.ranks:
                rank.fast_decode = fast
        stats = replay.run()
        results.append((sorted(_key(r) for r in records), stats))
    assert results[0] == results[1]
