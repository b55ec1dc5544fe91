"""The TTFT breakdown of P/D replays: the instants the disaggregated engine records, the
parts they split each TTFT into (exactly), their report distributions and JSON fields.

Fixed timing as in ``test_disagg.py``: prefill passes P = 10 ms, decode passes D = 1 ms.
"""

from __future__ import annotations

import math
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.engines.kernel.metrics import (
    TTFT_PARTS,
    MetricsCollector,
    request_record_json,
    ttft_parts,
)
from servesim.engines.kernel.requests import RequestRecord

from .conftest import Sim
from .test_disagg import D, P, decode_role, link, prefill_role, run_pd


def _queued_behind_a_busy_prefill_worker() -> dict[int, RequestRecord]:
    # One prompt at a time on the prefill worker: request 1 waits for request 0's pass.
    # 16 tokens x 1e6 B at 8 GB/s = 2 ms, 12 tokens = 1.5 ms. Request 0 decodes 40 tokens
    # from 12 on, so request 1's KV lands at 21.5, inside the decode pass 21-22.
    specs = [Sim.spec(0, 16, 40), Sim.spec(1, 12, 2)]
    records, _, _ = run_pd(specs, prefill=prefill_role(max_sequences=1), kv=link(8.0))
    return records


def test_each_part_is_measured_between_the_instants_of_the_handoff() -> None:
    records = _queued_behind_a_busy_prefill_worker()
    first, second = records[0], records[1]
    assert (first.first_admit_ms, first.prefill_end_ms, first.kv_transfer_start_ms,
            first.kv_transfer_end_ms, first.decode_admit_ms) == (0.0, P, P, P + 2.0, P + 2.0)
    assert ttft_parts(first) == {"prefill_queue": 0.0, "prefill": P, "kv_transfer": 2.0,
                                 "decode_queue": 0.0, "first_decode": D}
    assert (second.first_admit_ms, second.prefill_end_ms, second.kv_transfer_end_ms,
            second.decode_admit_ms, second.token_times[0]) == (P, 2 * P, 21.5, 22.0, 23.0)
    assert ttft_parts(second) == {"prefill_queue": P, "prefill": P, "kv_transfer": 1.5,
                                  "decode_queue": 0.5, "first_decode": D}


def test_waiting_for_a_decode_reservation_counts_as_kv_transfer() -> None:
    # One sequence at a time on the decode side: the three prompts prefill together (0-10);
    # request 1 is reserved, and its (instant) transfer done, when request 0 ends at 13.
    specs = [Sim.spec(i, 4, 3) for i in range(3)]
    records, _, _ = run_pd(specs, prefill=prefill_role(max_sequences=3),
                           decode=decode_role(max_sequences=1))
    r = records[1]
    assert (r.prefill_end_ms, r.kv_transfer_start_ms, r.kv_transfer_end_ms) == (P, 13.0, 13.0)
    assert ttft_parts(r) == {"prefill_queue": 0.0, "prefill": P, "kv_transfer": 3.0,
                             "decode_queue": 0.0, "first_decode": D}


def test_destination_first_queues_before_the_prefill() -> None:
    # SGLang reserves the destination at arrival: request 1 waits for it before its prefill.
    specs = [Sim.spec(i, 4, 3) for i in range(2)]
    records, _, _ = run_pd(specs, prefill=prefill_role(max_sequences=2, backend="sglang"),
                           decode=decode_role(max_sequences=1, backend="sglang"))
    assert ttft_parts(records[1]) == {"prefill_queue": P + 3 * D, "prefill": P,
                                      "kv_transfer": 0.0, "decode_queue": 0.0,
                                      "first_decode": D}


def test_requests_without_a_first_token_have_no_parts() -> None:
    records, _, _ = run_pd([Sim.spec(0, 4, 0), Sim.spec(1, 8, 1, arrival=100.0)],
                           decode=decode_role(max_model_len=8))
    assert records[0].status == "completed" and ttft_parts(records[0]) is None
    assert records[1].status == "rejected" and ttft_parts(records[1]) is None
    line = request_record_json(records[1])
    assert all(line[f"ttft_{name}_ms"] is None for name in TTFT_PARTS)


def _record(arrival: float, first_token: float, admit: float | None,
            handoff: tuple[float | None, float | None, float | None] | None) -> RequestRecord:
    r = RequestRecord(request_id=0, arrival_ms=arrival, input_length=8,
                      requested_output_length=1, status="completed",
                      token_times=array("d", [first_token]))
    r.first_admit_ms = admit
    if handoff is not None:
        r.prefill_end_ms, r.kv_transfer_end_ms, r.decode_admit_ms = handoff
    return r


def test_an_aggregated_request_has_the_parts_that_apply() -> None:
    r = _record(2.0, 30.0, 5.0, None)
    assert ttft_parts(r) == {"prefill_queue": 3.0, "prefill": 25.0}
    line = request_record_json(r)
    assert (line["ttft_prefill_queue_ms"], line["ttft_prefill_ms"]) == (3.0, 25.0)
    assert [line[f"ttft_{name}_ms"] for name in TTFT_PARTS[2:]] == [None, None, None]
    assert line["prefill_end_ms"] is None and line["decode_admit_ms"] is None
    # a handoff recorded in part cannot be split
    assert ttft_parts(_record(2.0, 30.0, 5.0, (10.0, None, 20.0))) is None


times = st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False)


@given(st.lists(times, min_size=6, max_size=6))
def test_the_parts_add_up_to_the_ttft_exactly(instants: list[float]) -> None:
    arrival, admit, prefill_end, transfer_end, decode_admit, first = sorted(instants)
    r = _record(arrival, first, admit, (prefill_end, transfer_end, decode_admit))
    parts = ttft_parts(r)
    assert parts is not None and list(parts) == list(TTFT_PARTS)
    ttft = first - arrival
    values = list(parts.values())
    assert sum(values) == ttft and sum(reversed(values)) == ttft and math.fsum(values) == ttft
    assert all(v >= 0.0 for v in values)
    exact = [admit - arrival, prefill_end - admit, transfer_end - prefill_end,
             decode_admit - transfer_end, first - decode_admit]
    for value, want in zip(values, exact, strict=True):
        assert value == pytest.approx(want, rel=1e-12, abs=1e-15 * ttft + 1e-300)


def test_the_report_gives_each_part_s_distribution() -> None:
    records = _queued_behind_a_busy_prefill_worker()
    collector = MetricsCollector()
    for r in records.values():
        collector.add(r)
    out = collector.report(wall_time_ms=0.0, gpu_seconds=1.0)
    assert out["mean_ttft_prefill_queue_ms"] == P / 2
    assert out["max_ttft_kv_transfer_ms"] == 2.0 and out["min_ttft_kv_transfer_ms"] == 1.5
    assert out["mean_ttft_decode_queue_ms"] == 0.25
    assert out["p99_ttft_first_decode_ms"] == D
    assert math.fsum(out[f"mean_ttft_{name}_ms"] for name in TTFT_PARTS) == out["mean_ttft_ms"]


def test_a_report_of_records_without_instants_has_no_breakdown() -> None:
    collector = MetricsCollector()
    collector.add(_record(0.0, 3.0, None, None))
    out = collector.report(wall_time_ms=0.0, gpu_seconds=1.0)
    assert not any(key.startswith(("mean_ttft_", "p99_ttft_")) and key != "mean_ttft_ms"
                   and key != "p99_ttft_ms" for key in out)
