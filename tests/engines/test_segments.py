"""Segments of steady decode passes are per worker: other workers' events do not cut them,
an event that touches the worker does, exactly where the stepwise replay has it."""

from __future__ import annotations

from typing import Any

import pytest

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay
from servesim.payload import RoleArgs, TimingArgs
from servesim.timing import make_timer

from .conftest import ListWorkload


def _agg(role: RoleArgs, workload: ListWorkload, bulk: bool) -> tuple[Any, ...]:
    records: list[RequestRecord] = []
    replay = AggregatedReplay(role, make_timer(role), workload, records.append, None,
                              bulk_decode=bulk)
    stats = replay.run()
    rows = sorted((r.request_id, r.status, r.first_admit_ms, tuple(r.token_times))
                  for r in records)
    return rows, stats, replay.bulk_passes


def _disagg(prefill: RoleArgs, decode: RoleArgs, workload: ListWorkload,
            bulk: bool) -> tuple[Any, ...]:
    records: list[RequestRecord] = []
    replay = DisaggReplay(prefill, decode, None, workload, records.append, bulk_decode=bulk)
    stats = replay.run()
    rows = sorted((r.request_id, r.status, tuple(r.token_times)) for r in records)
    return rows, stats, replay.bulk_passes


def test_a_worker_decodes_in_bulk_across_other_workers_passes(sim: Any) -> None:
    # Two workers decoding at different speeds (polynomial timing: the batch and KV set the
    # step time), so their pass ends interleave all the time.
    role = sim.role(replicas=2, timing=TimingArgs(type="polynomial"), num_gpu_blocks=512)
    specs = [sim.spec(0, 8, 120), sim.spec(1, 8, 120), sim.spec(2, 8, 120, arrival=0.0),
             sim.spec(3, 40, 90)]  # workers: 0, 1, 0, 1
    bulk = _agg(role, ListWorkload(specs), True)
    step = _agg(role, ListWorkload(specs), False)
    assert bulk[:2] == step[:2]
    assert step[2] == 0
    # Only the passes around admissions and completions are ordinary ones (a bulk advance
    # bounded by the next event of any worker gets 13 of these 240 passes).
    assert bulk[2] >= bulk[1].passes - 10, (bulk[2], bulk[1].passes)


def test_an_arrival_cuts_the_segment_of_its_worker_only(sim: Any) -> None:
    # Fixed timing: prefill 10 ms, decode 1 ms; request 0 decodes from t=10 in 1 ms passes.
    # Request 2 arrives inside a pass (15.5 ms), request 4 exactly at a pass end (40 ms):
    # both go to worker 0 and join the pass that starts at or after their arrival.
    role = sim.role(replicas=2)
    specs = [sim.spec(0, 4, 100), sim.spec(1, 4, 100), sim.spec(2, 4, 5, arrival=15.5),
             sim.spec(3, 4, 5, arrival=15.5), sim.spec(4, 4, 5, arrival=40.0)]
    bulk = _agg(role, ListWorkload(specs), True)
    step = _agg(role, ListWorkload(specs), False)
    assert bulk[:2] == step[:2]
    admitted = {rid: admit for rid, _, admit, _ in bulk[0]}
    assert admitted[2] == 16.0  # the pass in flight at 15.5 ends at 16
    assert admitted[4] == 40.0
    assert bulk[2] > 0


def test_a_handoff_in_a_later_round_of_an_instant_sees_the_pass_started_in_the_first(
        sim: Any) -> None:
    # Prefill takes no time, so a request arriving at 2.0 ms is handed off at 2.0 ms in a
    # second round of that instant, after the decode worker ended a pass at 2.0 and started
    # the next one: the new request joins the pass after that ([3, 4]).
    prefill = sim.role(worker_type="prefill", timing=TimingArgs(
        type="fixed", prefill_ms=0.0, decode_ms=2.5))
    decode = sim.role(worker_type="decode", timing=TimingArgs(
        type="fixed", prefill_ms=10.0, decode_ms=1.0))
    specs = [sim.spec(0, 4, 20), sim.spec(1, 4, 1, arrival=2.0)]
    bulk = _disagg(prefill, decode, ListWorkload(specs), True)
    step = _disagg(prefill, decode, ListWorkload(specs), False)
    assert bulk[:2] == step[:2]
    times = {rid: t for rid, _, t in bulk[0]}
    assert times[1] == (4.0,)
    assert bulk[2] > 0


@pytest.mark.parametrize("arrival", [20.5, 21.5, 22.5])
def test_an_arrival_does_not_change_the_passes_that_started_before_it(
        sim: Any, arrival: float) -> None:
    # Attention DP with a prefill cadence: whether a pass saw a waiting request decides if
    # the next pass may admit off the cadence, so the passes of a segment must not see a
    # request that arrived while the segment was in flight.
    role = sim.role(attention_data=2, prefill_schedule_interval=3)
    specs = [sim.spec(0, 4, 60), sim.spec(1, 4, 60), sim.spec(2, 4, 9, arrival=arrival)]
    bulk = _agg(role, ListWorkload(specs), True)
    step = _agg(role, ListWorkload(specs), False)
    assert bulk[:2] == step[:2]
    assert bulk[2] > 0
