from __future__ import annotations

import io
import json
import math
import random
from array import array
from typing import Any

import pytest

from servesim.engines.kernel.metrics import (
    DEPRECATED_NAMES,
    LATENCIES,
    MetricsCollector,
    distribution,
    percentile,
    request_record_json,
    write_request_records,
)
from servesim.engines.kernel.requests import RequestRecord, TerminalStatus
from servesim.payload import SlaArgs, SlaTarget

STATS = ("mean", "min", "max", "median", "p75", "p90", "p95", "p99", "p99.9", "std")


def per_request(**bounds: float) -> SlaArgs:
    return SlaArgs(targets=tuple(SlaTarget(m, "per_request", b)  # type: ignore[arg-type]
                                 for m, b in bounds.items()))


def good(record: RequestRecord, sla: SlaArgs) -> bool:
    return report([record], sla)["good_request_count"] == 1


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
    keys = ["num_requests", "completed", "failed", "rejected_requests",
            "incomplete_requests", "total_input_tokens", "total_output_tokens", "duration",
            "duration_ms", "wall_time_ms", "request_throughput", "input_throughput",
            "output_throughput", "total_token_throughput"]
    for name in LATENCIES:
        keys += [f"{s}_{name}_ms" for s in STATS]
    keys += [f"{s}_output_token_throughput_per_user" for s in STATS]
    keys += [f"num_{name}_samples" for name in LATENCIES]
    keys += ["prefix_cache_reused_ratio", "first_admission_prefix_cache_reused_ratio",
             "committed_prefill_tokens", "gpu_hours"]
    if goodput:
        keys += ["good_request_count", "request_goodput", "goodput_output_throughput_tok_s",
                 "sla_verdicts", "sla_targets_missed"]
    keys += [old for old, new in DEPRECATED_NAMES.items() if new in keys]
    return keys


# -- spec §9 cases 49-51 ---------------------------------------------------------------------


@pytest.mark.parametrize("sla", [
    SlaArgs(ttft_ms=500.0, itl_ms=50.0),  # the first fields: itl_ms is the mean gap
    per_request(ttft_ms=500.0, tpot_ms=50.0),
], ids=["first-fields", "targets"])
def test_case_49_goodput_bounds_are_inclusive_and_tpot_is_skipped_for_one_token(
        sla: SlaArgs) -> None:
    one_token = rec(0.0, [500.0])
    three_tokens = rec(0.0, [500.0, 550.0, 600.0])  # e2e 600 -> mean gap (600-500)/2 = 50
    assert good(one_token, sla)
    assert good(three_tokens, sla)
    assert good(rec(0.0, [500.0, 590.0, 600.0]), sla)  # a 90 ms gap, mean 50: TPOT holds
    assert not good(rec(0.0, [500.0, 550.0, 601.0]), sla)
    assert not good(rec(0.0, [500.5]), sla)
    out = report([one_token, three_tokens, rec(0.0, [501.0])], sla)
    assert out["good_request_count"] == out["goodput_completed_requests"] == 2
    assert out["request_goodput"] == out["goodput_request_throughput_rps"] == 2 / 0.6
    assert out["goodput_output_throughput_tok_s"] == 4 / 0.6
    assert list(out) == expected_keys(goodput=True)


def test_itl_bound_checks_every_gap_between_emissions() -> None:
    sla = per_request(itl_ms=50.0)
    assert not good(rec(0.0, [500.0, 590.0, 600.0]), sla)  # mean 50, one gap of 90
    assert good(rec(0.0, [500.0, 550.0, 550.0, 600.0]), sla)  # a burst: gaps 50 and 50
    assert good(rec(0.0, [500.0, 500.0]), sla)  # one emission: no gap to check
    assert good(rec(0.0, [500.0]), sla)


def test_e2e_sla() -> None:
    sla = per_request(e2e_ms=100.0)
    assert good(rec(0.0, [40.0, 100.0]), sla)
    assert not good(rec(0.0, [40.0, 100.5]), sla)
    assert good(rec(10.0, [], terminal=110.0), sla)  # no token: e2e to terminal time


def test_verdicts_per_request_and_on_the_run() -> None:
    sla = SlaArgs(targets=(SlaTarget("ttft_ms", "per_request", 100.0),
                           SlaTarget("ttft_ms", "p50", 60.0),
                           SlaTarget("itl_ms", "max", 20.0),
                           SlaTarget("tpot_ms", "p99", 5.0)))
    records = [rec(0.0, [50.0, 60.0], request_id=0), rec(0.0, [150.0, 160.0], request_id=1),
               rec(0.0, [40.0, 70.0], request_id=2)]
    out = report(records, sla)
    assert out["sla_verdicts"] == [
        {"metric": "ttft_ms", "stat": "per_request", "target": 100.0, "value": 150.0,
         "met": False, "attainment": 2 / 3},
        {"metric": "ttft_ms", "stat": "p50", "target": 60.0, "value": 50.0, "met": True},
        {"metric": "itl_ms", "stat": "max", "target": 20.0, "value": 30.0, "met": False},
        {"metric": "tpot_ms", "stat": "p99", "target": 5.0, "value": 30.0, "met": False},
    ]
    assert out["good_request_count"] == 2
    assert out["sla_targets_missed"] == 3
    # no samples: a target on the run is neither met nor missed
    one = report([rec(0.0, [5.0])], SlaArgs(targets=(SlaTarget("itl_ms", "p99", 1.0),)))
    assert one["sla_verdicts"][0]["met"] is None and "good_request_count" not in one
    assert one["sla_targets_missed"] == 1  # not shown to be met


def test_legacy_itl_ms_verdict_names_what_it_checks() -> None:
    out = report([rec(0.0, [10.0, 30.0])], SlaArgs(itl_ms=25.0))
    assert out["sla_verdicts"] == [{"metric": "tpot_ms", "stat": "per_request",
                                    "target": 25.0, "value": 20.0, "met": True,
                                    "attainment": 1.0}]


def test_p99_9_is_reported() -> None:
    records = [rec(0.0, [float(i + 1)], request_id=i) for i in range(2000)]
    out = report(records)
    assert out["p99.9_ttft_ms"] == 1998.0  # sample at rank round(1999 * 0.999) = 1997
    assert out["p99_ttft_ms"] == 1980.0


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
    assert out["completed"] == 4
    assert out["total_output_tokens"] == 400
    assert out["duration_ms"] == 2000.0 and out["duration"] == 2.0
    assert out["request_throughput"] == 2.0
    assert out["output_throughput"] == 200.0
    assert out["input_throughput"] == 20.0
    assert out["total_token_throughput"] == 220.0
    for old, new in DEPRECATED_NAMES.items():  # the earlier names, for one release
        if new in out:
            assert out[old] == out[new]
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
                 "p99.9_x_ms": 4.0, "std_x_ms": math.sqrt(1.25)}
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
    assert out["mean_e2el_ms"] == out["mean_e2e_latency_ms"] == 60.0
    assert out["mean_tpot_ms"] == 10.0
    # gaps between emissions: the two tokens at 140 are one emission (10 and 20 ms gaps)
    assert (out["min_itl_ms"], out["max_itl_ms"], out["mean_itl_ms"]) == (10.0, 20.0, 15.0)
    assert out["min_output_token_throughput_per_user"] == 50.0
    assert out["max_output_token_throughput_per_user"] == 100.0
    assert out["mean_output_token_throughput_per_user"] == 75.0
    assert (out["num_ttft_samples"], out["num_tpot_samples"], out["num_itl_samples"],
            out["num_e2el_samples"]) == (1, 1, 2, 1)


def test_speculative_bursts_are_one_emission() -> None:
    # three passes, 20 ms apart, emitting 3, 1 and 2 tokens: two gaps of 20 ms
    burst = rec(0.0, [50.0, 50.0, 50.0, 70.0, 90.0, 90.0])
    out = report([burst])
    assert out["median_itl_ms"] == 20.0 and out["num_itl_samples"] == 2
    assert out["mean_ttst_ms"] == 20.0  # the second emission, not the second token
    assert out["mean_tpot_ms"] == 8.0  # (90 - 50) / 5: TPOT divides by the tokens
    single = report([rec(0.0, [50.0, 50.0])])  # every token in one emission
    assert single["num_ttst_samples"] == 0 and single["num_itl_samples"] == 0


def test_only_completed_requests_are_measured() -> None:
    records = [
        rec(0.0, [10.0, 20.0], request_id=0, input_length=5),
        rec(0.0, [], status="rejected", request_id=1, input_length=7),
        rec(0.0, [10.0], status="incomplete", request_id=2, input_length=9, terminal=900.0),
        rec(0.0, [], request_id=3, input_length=4, terminal=30.0),  # zero-output, completed
    ]
    out = report(records)
    assert (out["num_requests"], out["completed"], out["rejected_requests"],
            out["incomplete_requests"], out["failed"]) == (4, 2, 1, 1, 2)
    assert out["total_input_tokens"] == 9
    assert out["total_output_tokens"] == 2
    assert out["duration_ms"] == 30.0
    assert out["num_ttft_samples"] == 1
    assert out["num_e2el_samples"] == 2
    assert out["max_e2el_ms"] == 30.0


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
        "last_token_ms": 45.0, "ttft_ms": 20.0, "ttst_ms": 5.0, "e2el_ms": 35.0,
        "e2e_latency_ms": 35.0, "tpot_ms": 7.5, "itl_ms": 7.5, "max_itl_ms": 10.0,
        "input_length": 100, "requested_output_length": 4, "output_length": 3,
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
