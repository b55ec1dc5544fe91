"""The replay base class (servesim.engines.kernel.replay.Replay) on a minimal engine: each
request emits one token per ms, stamped when it arrives, and completes at its last one."""

from __future__ import annotations

from typing import Any

import pytest

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.events import PHASE_ENGINE
from servesim.engines.kernel.replay import Replay
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, Workload
from servesim.engines.vllm import AggregatedReplay
from servesim.errors import ReplayError
from servesim.timing import make_timer

from .conftest import ListWorkload, Sim


class Ticker(Replay):
    def __init__(self, workload: Workload, sink: Any) -> None:
        super().__init__(workload, sink, None)
        self.settled: list[float] = []

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, RequestSpec):
            record = self._open(item, decode_worker=0)
            record.token_times.extend(self.now + k + 1.0 for k in range(item.output_length))
            self.passes += item.output_length
            self.events.push(self.now + item.output_length, PHASE_ENGINE, item.request_id,
                             ("done", item))
        else:
            self._terminal(item[1], "completed", self.now)

    def _settle(self) -> None:
        self.settled.append(self.now)


def _run(workload: ListWorkload) -> tuple[list[RequestRecord], Ticker]:
    records: list[RequestRecord] = []
    run = Ticker(workload, records.append)
    run.run_loop()
    return records, run


def test_records_come_from_the_specs_and_follow_ups_are_released(sim: type[Sim]) -> None:
    first, follow = sim.spec(0, 8, 3, arrival=1.0), sim.spec(1, 8, 2, arrival=0.5)
    records, run = _run(ListWorkload([first], followups={0: [follow]}))
    assert [(r.request_id, r.status, r.terminal_ms, list(r.token_times)) for r in records] == [
        (0, "completed", 4.0, [2.0, 3.0, 4.0]), (1, "completed", 6.5, [5.5, 6.5])]
    assert (records[0].arrival_ms, records[0].input_length, records[0].decode_worker,
            records[0].requested_output_length) == (1.0, 8, 0, 3)
    assert run.settled == [1.0, 4.0, 4.5, 6.5]  # once per instant, after its events
    assert run.totals() == {"end_ms": 6.5, "passes": 5, "num_requests": 2, "completed": 2,
                            "rejected": 0, "incomplete": 0}
    result = run.result({"aggregated": 1.0}, {"x": 1})
    assert (result.end_ms, result.passes, result.extra) == (6.5, 5, {"x": 1})
    assert not run.live


def test_at_the_cutoff_live_requests_end_incomplete_without_later_tokens(
        sim: type[Sim]) -> None:
    specs = [sim.spec(2, 8, 10, arrival=0.0), sim.spec(1, 8, 10, arrival=3.0)]
    records, run = _run(ListWorkload(specs, max_time_ms=5.0))
    # the last instant processed is the arrival at 3 ms: the tokens after it are dropped
    assert [(r.request_id, r.status, r.terminal_ms, list(r.token_times)) for r in records] == [
        (1, "incomplete", None, []), (2, "incomplete", None, [1.0, 2.0, 3.0])]
    assert run.counts == {"completed": 0, "rejected": 0, "incomplete": 2}


def _spaced(sim: type[Sim], n: int) -> ListWorkload:
    """``n`` requests a ms apart, each ending 2 ms after it arrives: about n instants."""
    return ListWorkload([sim.spec(i, 8, 2, arrival=float(i)) for i in range(n)])


def test_progress_gets_the_virtual_time_now_and_then_and_at_the_end(sim: type[Sim]) -> None:
    times: list[float] = []
    run = Ticker(_spaced(sim, 200), lambda record: None)
    run.progress = times.append
    run.run_loop()
    assert len(times) >= 2 and times == sorted(times)
    assert times[0] < 200.0 and times[-1] == run.now == 201.0


def test_an_interrupt_reports_the_virtual_time_it_stopped_at(sim: type[Sim]) -> None:
    """Ctrl-C in the middle of an instant: ``progress`` gets that instant's time before
    the interrupt goes on, later than its last periodic call."""
    times: list[float] = []

    def sink(record: RequestRecord) -> None:
        if record.request_id == 150:  # ends at 152 ms
            raise KeyboardInterrupt

    run = Ticker(_spaced(sim, 200), sink)
    run.progress = times.append
    with pytest.raises(KeyboardInterrupt):
        run.run_loop()
    assert times[-1] == run.now == 152.0
    assert all(t < 152.0 for t in times[:-1]) and len(times) >= 2


def test_an_interrupt_raised_by_the_progress_callback_is_reported_too(
        sim: type[Sim]) -> None:
    times: list[float] = []

    def progress(now: float) -> None:
        times.append(now)
        if len(times) == 1:
            raise KeyboardInterrupt

    run = Ticker(_spaced(sim, 200), lambda record: None)
    run.progress = progress
    with pytest.raises(KeyboardInterrupt):
        run.run_loop()
    assert len(times) == 2 and 0.0 < times[0] == times[1] == run.now < 200.0


def test_an_id_in_flight_twice_is_an_error(sim: type[Sim]) -> None:
    with pytest.raises(ReplayError) as info:
        _run(ListWorkload([sim.spec(0, 8, 4, arrival=0.0), sim.spec(0, 8, 4, arrival=1.0)]))
    assert info.value.diagnostics[0].code == "workload-duplicate-id"


def test_the_stuck_error_names_the_worker_and_the_waiting_heads() -> None:
    error = Ticker(ListWorkload([]), print)._stuck_error("decode worker 3", [7, 9],
                                                         ("engine", "workers", "decode"))
    d = error.diagnostics[0]
    assert (d.code, d.path) == ("replay-stuck", ("engine", "workers", "decode"))
    assert d.message == ("decode worker 3 has work but cannot schedule any of it (waiting "
                         "heads: [7, 9]); this is a scheduler invariant violation")


def _never_progress(results: list[Any], duration: float,
                    progressed: bool) -> tuple[list[Any], float, bool]:
    for res in results:
        res.progressed = False
    return results, duration, False


class _StuckAggregated(AggregatedReplay):
    def _run_ranks(self, worker: Any) -> tuple[list[Any], float, bool]:
        return _never_progress(*super()._run_ranks(worker))


class _StuckDisagg(DisaggReplay):
    def _run_ranks(self, worker: Any) -> tuple[list[Any], float, bool]:
        return [], 0.0, False  # (a pass that ran would hold its sources: a handoff waits)


def test_the_built_in_engines_name_a_stuck_worker(sim: type[Sim]) -> None:
    specs = [sim.spec(5, 8, 2), sim.spec(6, 8, 2)]
    role = sim.role()
    aggregated = _StuckAggregated(role, make_timer(role), ListWorkload(specs), print, None)
    prefill, decode = sim.role(worker_type="prefill"), sim.role(worker_type="decode")
    disagg = _StuckDisagg(prefill, decode, None, ListWorkload(specs), print)
    # (the aggregated pass admitted both; the P/D one never ran)
    expected = [("worker 0", "aggregated", []), ("prefill worker 0", "prefill", [5])]
    for run, (worker, pool, heads) in zip([aggregated, disagg], expected, strict=True):
        with pytest.raises(ReplayError) as info:
            run.run()
        (d,) = info.value.diagnostics
        assert (d.code, d.path) == ("replay-stuck", ("engine", "workers", pool))
        assert d.message == (f"{worker} has work but cannot schedule any of it (waiting "
                             f"heads: {heads}); this is a scheduler invariant violation")
