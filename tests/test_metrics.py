from __future__ import annotations

import io
import json
import math
import random
from array import array
from typing import Any

import pytest

from servesim.engines.kernel.metrics import (
    LATENCIES,
    MetricsCollector,
    distribution,
    meets_sla,
    percentile,
    request_record_json,
    write_request_records,
)
from servesim.engines.kernel.requests import RequestRecord, TerminalStatus
from servesim.payload import SlaArgs

STATS = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "std")


def rec(arrival: float, times: list[float], *, status: TerminalStatus = "completed",
        request_id: int = 0, input_length: int = 10, terminal: float | None = None,
        reused: int = 0, first_reused: int = 0) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, arrival_ms=arrival, input_length=input_length,
        requested_output_length=len(times), status=status, token_times=array("d", times),
        terminal_ms=terminal if terminal is not None else (times[-1] if times else arrival),
        reused_input_tokens=reused, first_admission_reused_tokens=first_reused,
    )


def report(records: list[RequestRecord], sla: SlaArgs | None = None,
           gpu_seconds: float | dict[str, float] = 0.0) -> dict[str, Any]:
    c = MetricsCollector(sla)
    for r in records:
        c.add(r)
    return c.report(wall_time_ms=1.5, gpu_seconds=gpu_seconds)


def expected_keys(goodput: bool) -> list[str]:
    keys = ["num_requests", "completed_requests", "rejected_requests", "incomplete_requests",
            "total_input_tokens", "total_output_tokens", "duration_ms", "wall_time_ms",
            "request_throughput_rps", "input_throughput_tok_s", "output_throughput_tok_s",
            "total_throughput_tok_s"]
    for name in LATENCIES:
        keys += [f"{s}_{name}_ms" for s in STATS]
    keys += [f"{s}_output_token_throughput_per_user" for s in STATS]
    keys += ["num_ttft_samples", "num_tpot_samples", "num_e2e_latency_samples",
             "prefix_cache_reused_ratio", "first_admission_prefix_cache_reused_ratio",
             "committed_prefill_tokens", "gpu_hours"]
    if goodput:
        keys += ["goodput_completed_requests", "goodput_request_throughput_rps",
                 "goodput_output_throughput_tok_s"]
    return keys


# -- spec §9 cases 49-51 ---------------------------------------------------------------------


def test_case_49_goodput_bounds_are_inclusive_and_itl_is_skipped_for_one_token() -> None:
    sla = SlaArgs(ttft_ms=500.0, itl_ms=50.0)
    one_token = rec(0.0, [500.0])
    three_tokens = rec(0.0, [500.0, 550.0, 600.0])  # e2e 600 -> avg ITL (600-500)/2 = 50
    assert meets_sla(one_token, sla)
    assert meets_sla(three_tokens, sla)
    assert not meets_sla(rec(0.0, [500.0, 550.0, 601.0]), sla)
    assert not meets_sla(rec(0.0, [500.5]), sla)
    out = report([one_token, three_tokens, rec(0.0, [501.0])], sla)
    assert out["goodput_completed_requests"] == 2
    assert out["goodput_request_throughput_rps"] == 2 / 0.6
    assert out["goodput_output_throughput_tok_s"] == 4 / 0.6
    assert list(out) == expected_keys(goodput=True)


def test_e2e_sla() -> None:
    sla = SlaArgs(e2e_ms=100.0)
    assert meets_sla(rec(0.0, [40.0, 100.0]), sla)
    assert not meets_sla(rec(0.0, [40.0, 100.5]), sla)
    assert meets_sla(rec(10.0, [], terminal=110.0), sla)  # no token: e2e to terminal time


def test_case_50_tpot_is_per_request_and_itl_is_per_gap() -> None:
    a = rec(0.0, [5.0, 15.0], request_id=0)  # one 10 ms gap
    b = rec(0.0, [5.0, 35.0, 65.0, 95.0], request_id=1)  # three 30 ms gaps
    out = report([a, b])
    assert out["mean_tpot_ms"] == 20.0
    assert out["mean_itl_ms"] == 25.0
    assert out["num_tpot_samples"] == 2
    assert out["max_itl_ms"] == 30.0 and out["min_itl_ms"] == 10.0


def test_case_51_throughput_and_gpu_hours() -> None:
    records = [rec(0.0, [float(t) for t in range(1, 101)], request_id=i, terminal=500.0 * i)
               for i in range(1, 5)]
    out = report(records, gpu_seconds=2 * 2.0)  # 2 GPUs for 2 s
    assert out["completed_requests"] == 4
    assert out["total_output_tokens"] == 400
    assert out["duration_ms"] == 2000.0
    assert out["request_throughput_rps"] == 2.0
    assert out["output_throughput_tok_s"] == 200.0
    assert out["input_throughput_tok_s"] == 20.0
    assert out["total_throughput_tok_s"] == 220.0
    assert out["gpu_hours"] == 2 * 2 / 3600
    assert report(records, gpu_seconds={"prefill": 1.0, "decode": 3.0})["gpu_hours"] == 4 / 3600


# -- distributions -----------------------------------------------------------------------------


def test_percentile_rank_rounds_half_up_over_sorted_samples() -> None:
    values = [float(v) for v in range(1, 11)]
    assert percentile(values, 50) == 6.0  # rank round(4.5) = 5
    assert percentile(values, 75) == 8.0  # round(6.75) = 7
    assert percentile(values, 90) == 9.0  # round(8.1) = 8
    assert percentile(values, 99) == 10.0  # round(8.91) = 9
    assert percentile([], 50) == 0.0
    assert percentile([3.0], 99) == 3.0


def test_distribution_stats_and_population_std() -> None:
    d = distribution([4.0, 1.0, 3.0, 2.0], "x")
    assert d == {"mean_x_ms": 2.5, "min_x_ms": 1.0, "max_x_ms": 4.0, "median_x_ms": 3.0,
                 "p75_x_ms": 3.0, "p90_x_ms": 4.0, "p95_x_ms": 4.0, "p99_x_ms": 4.0,
                 "std_x_ms": math.sqrt(1.25)}
    assert distribution([], "y", unit="") == {f"{s}_y": 0.0 for s in STATS}


def test_empty_report_is_all_zeros_and_has_no_goodput_without_sla() -> None:
    out = report([], SlaArgs())
    assert list(out) == expected_keys(goodput=False)
    assert all(v == 0 for k, v in out.items() if k != "wall_time_ms")
    assert out["wall_time_ms"] == 1.5


def test_latency_samples() -> None:
    r = rec(100.0, [130.0, 140.0, 140.0, 160.0])
    out = report([r])
    assert out["mean_ttft_ms"] == 30.0
    assert out["mean_ttst_ms"] == 10.0
    assert out["mean_e2e_latency_ms"] == 60.0
    assert out["mean_tpot_ms"] == 10.0
    assert out["min_itl_ms"] == 0.0  # zero gaps (speculative bursts) are ITL samples
    # per-user throughput: 1000 / gap for positive gaps only (10 ms and 20 ms)
    assert out["min_output_token_throughput_per_user"] == 50.0
    assert out["max_output_token_throughput_per_user"] == 100.0
    assert out["mean_output_token_throughput_per_user"] == 75.0
    assert (out["num_ttft_samples"], out["num_tpot_samples"],
            out["num_e2e_latency_samples"]) == (1, 1, 1)


def test_only_completed_requests_are_measured() -> None:
    records = [
        rec(0.0, [10.0, 20.0], request_id=0, input_length=5),
        rec(0.0, [], status="rejected", request_id=1, input_length=7),
        rec(0.0, [10.0], status="incomplete", request_id=2, input_length=9, terminal=900.0),
        rec(0.0, [], request_id=3, input_length=4, terminal=30.0),  # zero-output, completed
    ]
    out = report(records)
    assert (out["num_requests"], out["completed_requests"], out["rejected_requests"],
            out["incomplete_requests"]) == (4, 2, 1, 1)
    assert out["total_input_tokens"] == 9
    assert out["total_output_tokens"] == 2
    assert out["duration_ms"] == 30.0
    assert out["num_ttft_samples"] == 1
    assert out["num_e2e_latency_samples"] == 2
    assert out["max_e2e_latency_ms"] == 30.0


def test_prefix_cache_ratios_and_committed_prefill_tokens() -> None:
    # spec case 46 shape: two 24300-token requests, the second reusing 24192 tokens
    records = [rec(0.0, [1.0, 2.0], request_id=0, input_length=24300),
               rec(0.0, [3.0, 4.0], request_id=1, input_length=24300, reused=24192,
                   first_reused=24000)]
    out = report(records)
    assert out["total_input_tokens"] == 48600
    assert out["prefix_cache_reused_ratio"] == 24192 / 48600
    assert out["first_admission_prefix_cache_reused_ratio"] == 24000 / 48600
    assert out["committed_prefill_tokens"] == 48600 - 24192


def test_report_is_deterministic_and_independent_of_record_order() -> None:
    rng = random.Random(5)
    records = []
    for i in range(200):
        arrival = rng.random() * 1000
        times = sorted(arrival + rng.random() * 100 for _ in range(rng.randint(0, 6)))
        records.append(rec(arrival, times, request_id=i, input_length=rng.randint(1, 99),
                           terminal=(times[-1] if times else arrival + 0.1)))
    sla = SlaArgs(ttft_ms=50.0, itl_ms=20.0)
    first = report(records, sla)
    shuffled = records[:]
    rng.shuffle(shuffled)
    assert report(shuffled, sla) == first
    assert json.dumps(report(records, sla)) == json.dumps(first)


def test_extra_keys_are_appended() -> None:
    c = MetricsCollector(None)
    out = c.report(wall_time_ms=0.0, gpu_seconds=0.0,
                   extra={"committed_prefill_tokens": 7, "provenance": {"x": 1}})
    assert out["committed_prefill_tokens"] == 7
    assert list(out)[-1] == "provenance"


# -- per-request records -------------------------------------------------------------------------


def test_request_record_json_fields() -> None:
    r = RequestRecord(request_id=3, arrival_ms=10.0, input_length=100,
                      requested_output_length=4, status="completed",
                      token_times=array("d", [30.0, 35.0, 45.0]), session_id="s", turn_index=1,
                      first_admit_ms=12.0, terminal_ms=45.0, reused_input_tokens=64,
                      first_admission_reused_tokens=32, num_preemptions=1, decode_worker=0)
    line = request_record_json(r)
    assert line == {
        "request_id": 3, "session_id": "s", "turn_index": 1, "arrival_time_ms": 10.0,
        "first_admit_ms": 12.0, "terminal_time_ms": 45.0, "first_token_ms": 30.0,
        "last_token_ms": 45.0, "ttft_ms": 20.0, "ttst_ms": 5.0, "e2e_latency_ms": 35.0,
        "itl_ms": 7.5, "input_length": 100, "requested_output_length": 4, "output_length": 3,
        "reused_input_tokens": 64, "first_admission_g1_reused_input_tokens": 32,
        "prefill_worker_idx": None, "decode_worker_idx": 0, "num_preemptions": 1,
        "terminal_status": "completed", "prefill_end_ms": None, "kv_transfer_start_ms": None,
        "kv_transfer_end_ms": None, "decode_admit_ms": None,
        # aggregated: queued from arrival to the first pass, which ends with the first token
        "ttft_prefill_queue_ms": 2.0, "ttft_prefill_ms": 18.0, "ttft_kv_transfer_ms": None,
        "ttft_decode_queue_ms": None, "ttft_first_decode_ms": None,
    }
    rejected = request_record_json(rec(5.0, [], status="rejected", terminal=5.0))
    assert rejected["ttft_ms"] is None and rejected["first_token_ms"] is None
    assert rejected["terminal_status"] == "rejected"


def test_request_log_streams_one_line_per_record() -> None:
    buf = io.StringIO()
    c = MetricsCollector(None, request_log=buf)
    records = [rec(0.0, [1.0], request_id=i) for i in range(3)]
    for r in records:
        c.add(r)
    lines = buf.getvalue().splitlines()
    assert [json.loads(x)["request_id"] for x in lines] == [0, 1, 2]
    other = io.StringIO()
    assert write_request_records(records, other) == 3
    assert other.getvalue() == buf.getvalue()


@pytest.mark.parametrize("n", [1, 2, 7])
def test_median_of_small_samples(n: int) -> None:
    values = [float(i) for i in range(n)]
    assert percentile(values, 50) == values[math.floor((n - 1) / 2 + 0.5)]
