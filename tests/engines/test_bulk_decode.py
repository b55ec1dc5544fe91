"""Differential tests: the bulk advance of steady decode against the reference stepwise
replay, over many random workloads, aggregated and disaggregated, with prefix caching,
preemption, attention DP, cutoffs, speculation and state caches. Records, run totals,
reports and the final pool contents must be identical."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.vllm import AggregatedReplay
from servesim.payload import KvTransferArgs, RoleArgs, SpeculationArgs, StateCacheArgs, TimingArgs
from servesim.timing import make_timer

from .conftest import ListWorkload
from .strategies import (
    BACKENDS,
    fresh,
    kv_transfers,
    longest,
    replayed,
    roles,
    speculations,
    workloads,
)

WORKLOADS = workloads(max_requests=14, gaps=(0.0, 0.0, 0.5, 1.0, 3.0, 7.25, 20.0, 60.0),
                      max_part=9, outputs=st.sampled_from([0, 1, 2, 5, 9, 17, 30, 45]),
                      turn_outputs=st.integers(0, 20), cutoffs=(None, None, None, 40.0, 150.0))
ROOM = 80  # session turns repeat a prompt and its output


@st.composite
def bulk_roles(draw: st.DrawFn, worker_type: str, longest: int, *, state: bool | None = None,
               speculation: SpeculationArgs | None = None,
               backend: str | None = None) -> RoleArgs:
    if state is None:
        state = draw(st.integers(0, 4)) == 0
    state_blocks = draw(st.integers(1, 2)) if state else 0
    if speculation is None and worker_type != "prefill" and draw(st.integers(0, 4)) == 0:
        speculation = draw(speculations())
    return draw(roles(
        worker_type, longest, max_batched=16,
        backend=backend or ("vllm" if state else BACKENDS),
        block_size=st.integers(1, 4),
        num_gpu_blocks=st.integers(state_blocks + 1, 40),
        state_cache=StateCacheArgs(bytes_per_request=1, state_blocks=state_blocks,
                                   allocated_bytes_per_request=1) if state else None,
        speculation=speculation,
        max_sequences=st.integers(1, 6),
        max_model_len=st.one_of(st.none(), st.none(), st.integers(2, 60)),
        kv_bytes_per_token=1,
        timing=st.sampled_from([
            TimingArgs(type="fixed", prefill_ms=10.0, decode_ms=1.0),
            TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=2.5),
            TimingArgs(type="fixed", prefill_ms=2.0, decode_ms=0.0),
            TimingArgs(type="polynomial"),
        ])))


def _aggregated(role: RoleArgs, workload: ListWorkload, bulk: bool) -> tuple[Any, int]:
    result, replay = replayed(lambda sink: AggregatedReplay(
        role, make_timer(role), fresh(workload), sink, None, bulk_decode=bulk))
    return result, replay.bulk_passes


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_aggregated(data: st.DataObject) -> None:
    workload = data.draw(WORKLOADS)
    role = data.draw(bulk_roles("aggregated", longest(workload, ROOM)))
    bulk = _aggregated(role, workload, True)
    step = _aggregated(role, workload, False)
    assert bulk[0] == step[0]
    assert step[1] == 0
    event(f"bulk passes: {'none' if not bulk[1] else 'some'}")


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_with_attention_dp_balance(
    data: st.DataObject,
) -> None:
    """TensorRT-LLM's balance counts passes, steady ones included: a segment must leave
    its counters where the passes one by one would."""
    workload = data.draw(WORKLOADS)
    role = data.draw(bulk_roles("aggregated", longest(workload, ROOM), state=False,
                                backend="trtllm"))
    role = attrs.evolve(role, attention_data=2, attention_dp_balance=True)
    bulk = _aggregated(role, workload, True)
    step = _aggregated(role, workload, False)
    assert bulk[0] == step[0]
    event(f"bulk passes: {'none' if not bulk[1] else 'some'}")


def test_a_steady_segment_runs_the_balance_timeout_on(sim: Any) -> None:
    # Both ranks decode from 11 ms, one pass per ms, with nothing to prefill: the wait
    # counter counts those passes, restarting at 5 (the passes starting at 15 and 20 ms).
    # Request 2 arrives at 17.5 ms on rank 0 and waits until the pass that reaches 5.
    role = sim.role(backend="trtllm", attention_data=2, attention_dp_balance=True,
                    attention_dp_timeout_iters=5, attention_dp_batching_wait_iters=0)
    workload = ListWorkload([sim.spec(0, 4, 30), sim.spec(1, 4, 30),
                             sim.spec(2, 4, 3, arrival=17.5)])
    (bulk, passes), (step, _) = (_aggregated(role, workload, mode) for mode in (True, False))
    assert bulk == step
    assert passes > 0
    records, _, _ = sim.run(role, workload.specs)
    assert records[2].first_admit_ms == 20.0


def _disaggregated(case: tuple[RoleArgs, RoleArgs, KvTransferArgs | None, ListWorkload],
                   bulk: bool) -> tuple[Any, int]:
    prefill, decode, kv, workload = case
    result, replay = replayed(lambda sink: DisaggReplay(
        prefill, decode, kv, fresh(workload), sink, bulk_decode=bulk))
    return result, replay.bulk_passes


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_disaggregated(data: st.DataObject) -> None:
    workload = data.draw(WORKLOADS)
    room = longest(workload, ROOM)
    state = data.draw(st.integers(0, 4)) == 0  # both roles or neither
    speculation = data.draw(st.one_of(st.none(), st.none(), speculations(
        rates=st.sampled_from([(1.0, 1.0), (0.7, 0.4)]))))
    backend = "vllm" if state else data.draw(BACKENDS)  # one backend for both pools
    case = (data.draw(bulk_roles("prefill", room, state=state, speculation=speculation,
                                 backend=backend)),
            data.draw(bulk_roles("decode", room, state=state, speculation=speculation,
                                 backend=backend)),
            data.draw(kv_transfers()), workload)
    bulk = _disaggregated(case, True)
    step = _disaggregated(case, False)
    assert bulk[0] == step[0]
    event(f"bulk passes: {'none' if not bulk[1] else 'some'}")
    contended = bulk[0][3].links.get("max_concurrent_kv_transfers", 0) > 1
    event(f"transfers sharing a link: {'some' if contended else 'none'}")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_with_contended_links(
        data: st.DataObject) -> None:
    """Slow shared links (a token's KV is 1 MB: 1 ms per token at 1 GB/s): transfers
    overlap, and each start or end moves the others' completions while decode workers
    advance in bulk."""
    workload = data.draw(WORKLOADS)
    room = longest(workload, ROOM)
    backend = data.draw(BACKENDS)
    kv = KvTransferArgs(bytes_per_token=1_000_000,
                        bandwidth_gb_per_second=data.draw(st.sampled_from([1.0, 4.0])),
                        timing_mode=data.draw(st.sampled_from(["full_prompt",
                                                               "destination_missing"])),
                        sharing=data.draw(st.sampled_from(["prefill_worker", "decode_worker"])))
    case = (data.draw(bulk_roles("prefill", room, state=False, backend=backend)),
            data.draw(bulk_roles("decode", room, state=False, backend=backend)), kv, workload)
    bulk = _disaggregated(case, True)
    step = _disaggregated(case, False)
    assert bulk[0] == step[0]
    contended = bulk[0][3].links["max_concurrent_kv_transfers"] > 1
    event(f"transfers sharing a link: {'some' if contended else 'none'}")
    event(f"bulk passes: {'none' if not bulk[1] else 'some'}")


def test_the_bulk_advance_does_apply(sim: Any) -> None:
    """A long steady decode is advanced in bulk (not a vacuous differential test)."""
    role = sim.role(block_size=4, num_gpu_blocks=64, timing=TimingArgs(type="polynomial"))
    workload = ListWorkload([sim.spec(i, 6, 40, arrival=0.5 * i) for i in range(4)])
    bulk = _aggregated(role, workload, True)
    step = _aggregated(role, workload, False)
    assert bulk[0] == step[0]
    assert bulk[1] >= 30  # of 41 passes, most were advanced in bulk
