"""Property tests over random small workloads and pools."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.vllm import AggregatedReplay
from servesim.payload import RoleArgs
from servesim.timing import make_timer

from .conftest import ListWorkload, Sim
from .strategies import (
    Sink,
    check_drained,
    check_records,
    fresh,
    longest,
    replayed,
    roles,
    workloads,
)


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RoleArgs, ListWorkload]:
    workload = draw(workloads())
    return draw(roles("aggregated", longest(workload, 10 + 6))), workload


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_every_request_ends_once_and_the_pools_drain(case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    records, stats, replay = Sim.run(role, workload)  # Sim.run asserts "exactly once"
    check_records(records, workload, role)
    assert len(records) == stats.num_requests
    check_drained(replay)


def _replay(role: RoleArgs, workload: ListWorkload) -> Callable[[Sink], AggregatedReplay]:
    return lambda sink: AggregatedReplay(role, make_timer(role), fresh(workload), sink, None)


@settings(max_examples=100, deadline=None)
@given(scenarios())
def test_replays_are_deterministic(case: tuple[RoleArgs, ListWorkload]) -> None:
    first, _ = replayed(_replay(*case))
    second, _ = replayed(_replay(*case))
    assert first == second


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_inlined_decode_step_matches_the_general_path(case: tuple[RoleArgs, ListWorkload]) -> None:
    fast, _ = replayed(_replay(*case))
    general, _ = replayed(_replay(*case), fast_decode=False)
    assert fast == general
