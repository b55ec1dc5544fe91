"""Report names as vLLM's and AIPerf's benchmarks name them, the earlier names kept as
aliases for one release, and metrics read by either name in sweeps and searches."""

from __future__ import annotations

import pytest
from rich.console import Console

from servesim.compiler import compile_text
from servesim.engines.kernel.metrics import DEPRECATED_NAMES
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.render import report_summary, report_table
from servesim.replay import replay_payload
from servesim.search.goals import parse_constraint
from servesim.search.space import METRICS
from servesim.sweep.metrics import column_name, derived_columns
from servesim.testing import small_config

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))

VLLM_KEYS = ("completed", "failed", "total_input_tokens", "total_output_tokens",
             "request_throughput", "output_throughput", "total_token_throughput", "duration",
             *(f"{s}_{m}_ms" for s in ("mean", "median", "std", "p99")
               for m in ("ttft", "tpot", "itl", "e2el")))


@pytest.mark.parametrize(("metric", "column"), [
    ("ttft_ms.p99", "p99_ttft_ms"), ("ttft_ms.p50", "median_ttft_ms"),
    ("itl_ms.p99.9", "p99.9_itl_ms"), ("e2e_ms.p99", "p99_e2el_ms"),
    ("e2el_ms.mean", "mean_e2el_ms"), ("e2e_latency_ms.p90", "p90_e2el_ms"),
    ("p99_e2e_latency_ms", "p99_e2el_ms"), ("request_throughput_rps", "request_throughput"),
    ("goodput_request_throughput_rps", "request_goodput"), ("request_goodput", "request_goodput"),
    ("goodput_rps_per_gpu", "goodput_rps_per_gpu"), ("sla_targets_missed", "sla_targets_missed"),
])
def test_metrics_are_read_by_todays_name_and_the_earlier_ones(metric: str, column: str) -> None:
    assert column_name(metric) == column
    assert column in METRICS
    c = parse_constraint(f"{metric} <= 10")
    assert c is not None and c.violation({column: 4.0}) == -6.0


def test_every_deprecated_name_has_a_reported_successor() -> None:
    for old, new in DEPRECATED_NAMES.items():
        assert old != new and column_name(old) == new


def test_derived_columns_read_the_new_names() -> None:
    # the report's goodput under its ecosystem name, per GPU of the report's deployment
    cols = derived_columns({"gpus": 2, "request_goodput": 4.0, "output_tok_s_per_gpu": 50.0,
                            "usd_per_hour": 6.0})
    assert (cols["goodput_rps_per_gpu"], cols["output_tok_s_per_gpu"]) == (2.0, 50.0)
    assert cols["goodput_requests_per_usd"] == 4.0 * 3600 / 6.0


def test_the_report_and_summary_use_the_ecosystem_names() -> None:
    report = _report()
    for key in VLLM_KEYS:
        assert key in report, key
    for old, new in DEPRECATED_NAMES.items():  # goodput only with an SLA
        assert report.get(old) == report.get(new)
    assert "goodput_request_throughput_rps" not in report
    console = Console(width=120, color_system=None, record=True)
    console.print(report_summary(report))
    console.print(report_table(report))
    text = console.export_text()
    rows = [" ".join(line.replace("│", " ").split()) for line in text.splitlines()]
    assert f"completed {report['completed']} / {report['num_requests']}" in rows
    assert f"request_throughput {report['request_throughput']:.3f} req/s" in rows
    assert f"total_token_throughput {report['total_token_throughput']:.1f} tok/s" in rows
    assert any(row.startswith("e2el_ms ") for row in rows)
    assert "completed requests" not in text and "E2E (ms)" not in text


def _report() -> dict[str, object]:
    payload = compile_text(small_config(requests=4, input_tokens=16, output_tokens=4,
                                        concurrency=2), registry=REGISTRY)
    return replay_payload(payload, registry=REGISTRY).report
