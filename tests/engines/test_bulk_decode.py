"""Differential tests: the bulk advance of steady decode against the reference stepwise
replay, over many random workloads, aggregated and disaggregated, with prefix caching,
preemption, attention DP, cutoffs, speculation and state caches. Records, run totals,
reports and the final pool contents must be identical."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.metrics import MetricsCollector, request_record_json
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.engines.vllm import AggregatedReplay
from servesim.payload import (
    KvTransferArgs,
    RoleArgs,
    SlaArgs,
    SpeculationArgs,
    StateCacheArgs,
    TimingArgs,
)
from servesim.timing import make_timer

from .conftest import ListWorkload


@st.composite
def workloads(draw: st.DrawFn) -> ListWorkload:
    n = draw(st.integers(1, 14))
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    arrival = 0.0
    for rid in range(n):
        arrival += draw(st.sampled_from([0.0, 0.0, 0.5, 1.0, 3.0, 7.25, 20.0, 60.0]))
        parts = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 9)), min_size=1,
                              max_size=3))
        prompt = make_prompt([Segment(k, m, repeat=False) for k, m in parts])
        out = draw(st.sampled_from([0, 1, 2, 5, 9, 17, 30, 45]))
        specs.append(RequestSpec(rid, arrival, prompt, prompt_length(prompt), out))
        if draw(st.integers(0, 3)) == 0:  # a session turn reusing this request's output
            follow = make_prompt([*prompt, Segment(generated_key(rid), out, repeat=False),
                                  Segment(3, draw(st.integers(1, 4)), repeat=False)])
            followups[rid] = [RequestSpec(100 + rid, draw(st.sampled_from([0.0, 1.0])), follow,
                                          prompt_length(follow), draw(st.integers(0, 20)))]
    cutoff = draw(st.sampled_from([None, None, None, 40.0, 150.0]))
    return ListWorkload(specs, followups=followups, max_time_ms=cutoff)


@st.composite
def roles(draw: st.DrawFn, worker_type: str, longest: int, *, state: bool | None = None,
          speculation: SpeculationArgs | None = None) -> RoleArgs:
    block = draw(st.integers(1, 4))
    chunked = draw(st.booleans())
    if state is None:
        state = draw(st.integers(0, 4)) == 0
    state_blocks = draw(st.integers(1, 2)) if state else 0
    timing = draw(st.sampled_from([
        TimingArgs(type="fixed", prefill_ms=10.0, decode_ms=1.0),
        TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=2.5),
        TimingArgs(type="fixed", prefill_ms=2.0, decode_ms=0.0),
        TimingArgs(type="polynomial"),
    ]))
    if speculation is None and worker_type != "prefill" and draw(st.integers(0, 4)) == 0:
        speculation = draw(st.builds(
            SpeculationArgs, kind=st.sampled_from(["mtp", "ngram"]),
            num_speculative_tokens=st.just(2),
            acceptance_rates=st.sampled_from([(1.0, 1.0), (0.7, 0.4), (0.0, 0.0)]),
            seed=st.integers(0, 3)))
    return RoleArgs(
        worker_type=worker_type,  # type: ignore[arg-type]
        backend="vllm", model="m", hardware="h",
        block_size=block,
        num_gpu_blocks=draw(st.integers(state_blocks + 1, 40)),
        state_cache=StateCacheArgs(bytes_per_request=1, state_blocks=state_blocks,
                                   allocated_bytes_per_request=1) if state else None,
        speculation=speculation,
        max_batched_tokens=draw(st.integers(1, 16)) if chunked else longest,
        max_sequences=draw(st.integers(1, 6)),
        enable_chunked_prefill=chunked,
        preemption_mode=draw(st.sampled_from(["lifo", "fifo"])),
        prefix_caching=draw(st.booleans()),
        max_model_len=draw(st.one_of(st.none(), st.none(), st.integers(2, 60))),
        attention_data=draw(st.integers(1, 2)),
        prefill_schedule_interval=draw(st.integers(1, 3)),
        replicas=draw(st.integers(1, 2)),
        kv_bytes_per_token=1,
        timing=timing,
    )


def _longest(workload: ListWorkload) -> int:
    # room for session turns that repeat a prompt and its output
    return max(s.input_length for s in workload.specs) + 80


def _report(records: list[RequestRecord]) -> str:
    collector = MetricsCollector(SlaArgs(ttft_ms=50.0, itl_ms=3.0, e2e_ms=400.0))
    for record in records:
        collector.add(record)
    report = collector.report(wall_time_ms=0.0, gpu_seconds=1.0)
    lines = [json.dumps(request_record_json(r), sort_keys=True) for r in records]
    return json.dumps(report, sort_keys=True) + "\n" + "\n".join(lines)


def _pools(replay: Any) -> list[Any]:
    out = []
    for worker in replay.workers:
        for rank in worker.ranks:
            pool = rank.pool
            out.append((pool.num_active, pool.num_inactive, pool.num_free,
                        sorted(pool.cached_identities()), rank._pass_id))
    return out


def _aggregated(role: RoleArgs, workload: ListWorkload, bulk: bool) -> tuple[Any, ...]:
    records: list[RequestRecord] = []
    replay = AggregatedReplay(role, make_timer(role),
                              ListWorkload(workload.specs, followups=workload.followups,
                                           max_time_ms=workload.max_time_ms),
                              records.append, None, bulk_decode=bulk)
    stats = replay.run()
    return _report(records), stats, _pools(replay), replay.bulk_passes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_aggregated(data: st.DataObject) -> None:
    workload = data.draw(workloads())
    role = data.draw(roles("aggregated", _longest(workload)))
    bulk = _aggregated(role, workload, True)
    step = _aggregated(role, workload, False)
    assert bulk[:3] == step[:3]
    assert step[3] == 0
    event(f"bulk passes: {'none' if not bulk[3] else 'some'}")


def _disaggregated(case: tuple[RoleArgs, RoleArgs, KvTransferArgs | None, ListWorkload],
                   bulk: bool) -> tuple[Any, ...]:
    prefill, decode, kv, workload = case
    records: list[RequestRecord] = []
    replay = DisaggReplay(prefill, decode, kv,
                          ListWorkload(workload.specs, followups=workload.followups,
                                       max_time_ms=workload.max_time_ms),
                          records.append, bulk_decode=bulk)
    stats = replay.run()
    return _report(records), stats, _pools(replay), replay.bulk_passes


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_disaggregated(data: st.DataObject) -> None:
    workload = data.draw(workloads())
    longest = _longest(workload)
    state = data.draw(st.integers(0, 4)) == 0  # both roles or neither
    speculation = data.draw(st.one_of(st.none(), st.none(), st.builds(
        SpeculationArgs, kind=st.sampled_from(["mtp", "ngram"]),
        num_speculative_tokens=st.just(2),
        acceptance_rates=st.sampled_from([(1.0, 1.0), (0.7, 0.4)]), seed=st.integers(0, 3))))
    kv = data.draw(st.one_of(st.none(), st.builds(
        KvTransferArgs, bytes_per_token=st.sampled_from([1, 1_000_000]),
        bandwidth_gb_per_second=st.sampled_from([None, 1.0, 250.0]),
        timing_mode=st.sampled_from(["full_prompt", "destination_missing"]),
        state_bytes=st.sampled_from([0, 500_000]))))
    case = (data.draw(roles("prefill", longest, state=state, speculation=speculation)),
            data.draw(roles("decode", longest, state=state, speculation=speculation)),
            kv, workload)
    bulk = _disaggregated(case, True)
    step = _disaggregated(case, False)
    assert bulk[:3] == step[:3]
    event(f"bulk passes: {'none' if not bulk[3] else 'some'}")


def test_the_bulk_advance_does_apply(sim: Any) -> None:
    """A long steady decode is advanced in bulk (not a vacuous differential test)."""
    role = sim.role(block_size=4, num_gpu_blocks=64, timing=TimingArgs(type="polynomial"))
    workload = ListWorkload([sim.spec(i, 6, 40, arrival=0.5 * i) for i in range(4)])
    bulk = _aggregated(role, workload, True)
    step = _aggregated(role, workload, False)
    assert bulk[:3] == step[:3]
    assert bulk[3] >= 30  # of 41 passes, most were advanced in bulk
