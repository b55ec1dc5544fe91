"""Property tests: random speculative workloads, with and without a state cache, conserve
blocks (every reference the pool counts is held by exactly one lease) and tokens (every
request gets exactly the tokens its stop length allows, bursts included)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.rank import RUNNING
from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay, RankScheduler, Worker
from servesim.payload import RoleArgs, StateCacheArgs
from servesim.timing import make_timer

from .conftest import ListWorkload
from .strategies import (
    Sink,
    check_drained,
    check_records,
    fresh,
    longest,
    replayed,
    roles,
    sink_once,
    speculations,
    workloads,
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RoleArgs, ListWorkload]:
    workload = draw(workloads(max_requests=8, max_part=7, outputs=st.integers(0, 12),
                              turn_outputs=st.integers(0, 6)))
    block = draw(st.integers(2, 4))
    state_blocks = draw(st.sampled_from([0, 0, 1, 2]))
    state = None
    unit = None
    if state_blocks:
        state = StateCacheArgs(bytes_per_request=state_blocks * block,
                               state_blocks=state_blocks,
                               allocated_bytes_per_request=state_blocks * block)
    nextn = draw(st.integers(1, 3))
    speculation = draw(st.one_of(st.none(), speculations(
        nextn=nextn, seeds=st.integers(0, 5),
        rates=st.lists(st.sampled_from([0.0, 0.3, 0.7, 1.0]), min_size=nextn,
                       max_size=nextn).map(tuple))))
    if state is not None and draw(st.booleans()):
        # sub-block units only without speculation (the shared rule)
        unit = block if speculation is not None else draw(
            st.sampled_from([d for d in range(1, block + 1) if block % d == 0]))
    role = draw(roles("aggregated", longest(workload, 40), block_size=block,
                      num_gpu_blocks=st.integers(state_blocks + 1, 16),
                      max_model_len=st.one_of(st.none(), st.integers(2, 30)),
                      kv_bytes_per_token=1, state_cache=state, prefix_match_unit=unit,
                      speculation=speculation))
    return role, workload


def _check_conservation(rank: RankScheduler) -> None:
    """Every pool reference belongs to a lease of a running request, and vice versa."""
    rank.pool.check()
    held: Counter[int] = Counter()
    for seq in rank.running:
        assert seq.status == RUNNING
        # every computed token (accepted drafts included) has its KV slot
        assert seq.num_computed <= len(seq.lease) * rank.block_size
        held.update(seq.lease.blocks())
        if seq.state is not None:
            held.update(seq.state.working.blocks())
            for ck in seq.state.retained:
                if ck.held:
                    held.update(ck.blocks.blocks())
    for seq in rank.waiting:
        assert seq.lease == []
        if seq.state is not None:
            assert seq.state.working == []
            assert not any(ck.held for ck in seq.state.retained)
    assert dict(held) == rank.pool.references()
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


def _replay(role: RoleArgs, workload: ListWorkload) -> Callable[[Sink], CheckedReplay]:
    return lambda sink: CheckedReplay(role, make_timer(role), fresh(workload), sink, None)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_speculative_and_state_workloads_conserve_blocks_and_tokens(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    records: dict[int, RequestRecord] = {}
    replay = _replay(role, workload)(sink_once(records))
    replay.run()
    check_records(records, workload, role)
    check_drained(replay)


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_speculative_and_state_replays_are_deterministic(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    first, _ = replayed(_replay(*case))
    second, _ = replayed(_replay(*case))
    assert first == second


@settings(max_examples=80, deadline=None)
@given(scenarios())
def test_inlined_decode_step_matches_the_general_path(case: tuple[RoleArgs, ListWorkload]) -> None:
    fast, _ = replayed(_replay(*case))
    general, _ = replayed(_replay(*case), fast_decode=False)
    assert fast == general
