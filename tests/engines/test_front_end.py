"""The serving front end's latency (a timer's ``request_ms``): a request reaches the
scheduler that long after its arrival; its records keep the arrival, so TTFT and E2E
include the latency, and the GPU is not busy during it."""

from __future__ import annotations

import math
from array import array
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.requests import RECORD_INIT, RequestRecord, RequestSpec
from servesim.engines.vllm import AggregatedReplay
from servesim.errors import ReplayError
from servesim.payload import RoleArgs, TimingArgs
from servesim.timing import FixedTimer, make_timer

from .conftest import ListWorkload, Sim
from .strategies import fresh, longest, replayed, roles, workloads

P, D = Sim.P, Sim.D


@attrs.frozen
class FrontEndTimer:
    """A front end of ``fixed_ms + per_token_ms * prompt`` on ``passes``' pass prices
    (fixed P and D by default)."""

    fixed_ms: Any
    per_token_ms: float = 0.0
    passes: Any = FixedTimer(prefill_ms=P, decode_ms=D)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return float(self.passes.prefill_ms(batch, mean_isl, mean_prefix))

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        return float(self.passes.decode_ms(batch, active, mean_context, total))

    def request_ms(self, input_tokens: int) -> Any:
        if not self.per_token_ms:
            return self.fixed_ms  # as given, even when it is no number
        return self.fixed_ms + self.per_token_ms * input_tokens


def run(timer: Any, workload: list[RequestSpec] | ListWorkload, *, bulk: bool = True,
        role: RoleArgs | None = None) -> tuple[dict[int, RequestRecord], AggregatedReplay]:
    workload = workload if isinstance(workload, ListWorkload) else ListWorkload(workload)
    records: dict[int, RequestRecord] = {}
    replay = AggregatedReplay(role or Sim.role(), timer, workload,
                              lambda r: records.__setitem__(r.request_id, r), None,
                              bulk_decode=bulk)
    replay.run()
    return records, replay


def test_a_lone_request_waits_for_the_front_end_then_runs_as_without_it() -> None:
    spec = Sim.spec(0, 8, 3, 2.0)
    base, idle = run(FrontEndTimer(fixed_ms=0.0), [spec])
    records, replay = run(FrontEndTimer(fixed_ms=4.0, per_token_ms=0.5), [spec])
    r, front = records[0], 4.0 + 0.5 * 8
    assert r.arrival_ms == 2.0  # TTFT and E2E count from the arrival
    assert r.first_admit_ms == 2.0 + front
    assert r.token_times == array("d", [t + front for t in base[0].token_times])
    # the front end does not occupy the GPU
    assert replay.workers[0].busy_ms == idle.workers[0].busy_ms


@pytest.mark.parametrize("bulk", [True, False])
def test_a_constant_latency_shifts_an_open_loop_run_by_exactly_that_much(bulk: bool) -> None:
    # Same batching, same passes: every arrival and so every token is 16 ms later.
    specs = [Sim.spec(i, 8 + 4 * (i % 3), 5 + i % 4, arrival=3.0 * i) for i in range(12)]
    base, _ = run(FrontEndTimer(fixed_ms=0.0), specs, bulk=bulk)
    late, _ = run(FrontEndTimer(fixed_ms=16.0), specs, bulk=bulk)
    for i in range(12):
        assert late[i].arrival_ms == base[i].arrival_ms
        assert list(late[i].token_times) == [t + 16.0 for t in base[i].token_times]


def test_a_prompt_dependent_latency_reorders_admission() -> None:
    # The long prompt arrives first but is tokenised for longer: the short one is
    # admitted, prefilled and decoding before the long one reaches the scheduler.
    timer = FrontEndTimer(fixed_ms=1.0, per_token_ms=1.0)
    records, _ = run(timer, [Sim.spec(0, 64, 2, 0.0), Sim.spec(1, 4, 2, 1.0)])
    assert records[1].first_admit_ms == 1.0 + 5.0
    assert records[0].first_admit_ms == 65.0
    assert records[1].token_times[0] < records[0].first_admit_ms


def test_bulk_and_stepwise_agree_with_a_front_end() -> None:
    specs = [Sim.spec(i, 4 + 4 * (i % 5), 3 + i % 7, arrival=1.5 * i) for i in range(20)]
    timer = FrontEndTimer(fixed_ms=2.0, per_token_ms=0.25)
    bulk, _ = run(timer, specs, bulk=True)
    step, _ = run(timer, specs, bulk=False)
    assert {i: _fields(r) for i, r in bulk.items()} == {i: _fields(r) for i, r in step.items()}


def _fields(record: RequestRecord) -> dict[str, object]:
    return {name: getattr(record, name) for name in RECORD_INIT}


def test_a_follow_up_turn_also_passes_the_front_end() -> None:
    # The second turn is released 5 ms after the first ends and then waits 3 ms.
    first, second = Sim.spec(0, 4, 2), Sim.spec(1, 4, 2, arrival=5.0)
    records, _ = run(FrontEndTimer(fixed_ms=3.0),
                     ListWorkload([first], followups={0: [second]}))
    end = records[0].terminal_ms
    assert end is not None
    assert records[1].arrival_ms == end + 5.0
    assert records[1].first_admit_ms == end + 5.0 + 3.0


def test_p_d_requests_enter_through_the_prefill_pool_front_end() -> None:
    records: dict[int, RequestRecord] = {}
    prefill = Sim.role(worker_type="prefill")
    decode = Sim.role(worker_type="decode")
    replay = DisaggReplay(prefill, decode, None, ListWorkload([Sim.spec(0, 8, 2, 1.0)]),
                          lambda r: records.__setitem__(r.request_id, r),
                          prefill_timer=FrontEndTimer(fixed_ms=6.0),
                          decode_timer=FrontEndTimer(fixed_ms=1000.0))  # not on the way in
    replay.run()
    r = records[0]
    assert r.first_admit_ms == 7.0
    assert r.token_times == array("d", [7.0 + P + D, 7.0 + P + 2 * D])


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, "5"])
def test_a_timer_with_an_invalid_front_end_latency_is_refused(bad: Any) -> None:
    timer = FrontEndTimer(fixed_ms=bad)
    role = Sim.role(timing=TimingArgs(type="fixed", prefill_ms=P, decode_ms=D))
    with pytest.raises(ReplayError) as info:
        run(timer, [Sim.spec(0, 8, 2)], role=role)
    (d,) = info.value.diagnostics
    assert d.code == "timing-invalid"
    assert d.path == ("engine", "workers", "aggregated", "timing")
    assert "front-end latency for a 8-token prompt" in d.message and "request_ms" in d.message


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_and_stepwise_agree_with_a_front_end_on_random_workloads(
        data: st.DataObject) -> None:
    workload = data.draw(workloads(max_requests=12, cutoffs=(None, None, 60.0)))
    role = data.draw(roles("aggregated", longest(workload, 60), num_gpu_blocks=st.integers(
        4, 40), timing=st.sampled_from([TimingArgs(type="fixed", prefill_ms=10.0, decode_ms=1.0),
                                        TimingArgs(type="polynomial")])))
    timer = FrontEndTimer(data.draw(st.sampled_from([0.0, 0.5, 3.0, 25.0])),
                          data.draw(st.sampled_from([0.0, 0.125, 1.0])), make_timer(role))

    def outcome(bulk: bool) -> Any:
        return replayed(lambda sink: AggregatedReplay(role, timer, fresh(workload), sink, None,
                                                      bulk_decode=bulk))[0]

    assert outcome(True) == outcome(False)


def test_a_pass_the_balance_holds_keeps_the_prefill_cadence() -> None:
    """Balance and vLLM's prefill cadence together (a config the compiler refuses, which
    the engine must still replay the same in both modes): a steady pass the balance holds
    is on the cadence, as the bulk advance counts it. Found by the random test above."""
    role = Sim.role(attention_data=2, max_sequences=2, prefill_schedule_interval=3,
                    attention_dp_balance=True, attention_dp_timeout_iters=2,
                    attention_dp_batching_wait_iters=0, enable_chunked_prefill=False,
                    block_size=2, num_gpu_blocks=5, prefix_caching=False,
                    max_batched_tokens=69)
    specs = [Sim.spec(0, 1, 4), Sim.spec(1, 9, 0), Sim.spec(2, 1, 4),
             Sim.spec(3, 1, 4, arrival=3.0), Sim.spec(4, 1, 0, arrival=3.0),
             *(Sim.spec(i, 2, 0, arrival=3.0) for i in range(5, 9))]
    followups = {0: [Sim.spec(100, 6, 0)], 3: [Sim.spec(103, 6, 0)], 4: [Sim.spec(104, 2, 0)],
                 5: [Sim.spec(105, 3, 0)], 6: [Sim.spec(106, 3, 0)]}
    timer = FrontEndTimer(0.0, 0.125, make_timer(role))

    def outcome(bulk: bool) -> Any:
        return replayed(lambda sink: AggregatedReplay(
            role, timer, ListWorkload(specs, followups=followups), sink, None,
            bulk_decode=bulk))

    (bulk, replay), (step, _) = outcome(True), outcome(False)
    assert replay.bulk_passes > 0
    assert bulk == step
