"""The columns of a result row: the report's metrics, and what a deployment choice is
judged by (GPUs, goodput and throughput per GPU, cost).

A metric is named as in the report (``p99_ttft_ms``) or as ``NAME.STAT``
(``ttft_ms.p99``, ``tpot_ms.mean``, ``e2el_ms.p99.9``), the way SLA targets are written;
``e2e_ms`` (the SLA key) is ``e2el_ms``, and an earlier report name
(``e2e_latency_ms.p99``, ``request_throughput_rps``) is today's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from servesim.engines.kernel.metrics import DEPRECATED_NAMES

STATS = ("min", "max", "mean", "median", "std", "p50", "p75", "p90", "p95", "p99", "p99.9")
# a name as SLA targets write it -> the report's
_NAMES = {"e2e_ms": "e2el_ms", "e2e_latency_ms": "e2el_ms"}
# derived columns, in the order they are shown
DERIVED = ("gpus", "goodput_rps_per_gpu", "output_tok_s_per_gpu", "usd_per_hour",
           "usd_per_million_output_tokens", "goodput_requests_per_usd")


def column_name(metric: str) -> str:
    """``ttft_ms.p99`` -> ``p99_ttft_ms``; a report or derived name is itself, an earlier
    report name today's."""
    text = metric.strip()
    for stat in STATS:
        name, dot, rest = text.partition(f".{stat}")
        if dot and not rest and name:
            prefix = "median" if stat == "p50" else stat
            return f"{prefix}_{_NAMES.get(name, name)}"
    return DEPRECATED_NAMES.get(text, text)


def derived_columns(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's GPUs, output per GPU and costs (see :func:`servesim.sweep.pricing.
    cost_figures`), and goodput per GPU and good requests per dollar."""
    gpus = int(report.get("gpus") or 0)
    usd_per_hour = report.get("usd_per_hour")
    goodput_rps = float(report.get("request_goodput") or 0.0)
    return {
        "gpus": gpus,
        "goodput_rps_per_gpu": goodput_rps / gpus if gpus else 0.0,
        "output_tok_s_per_gpu": report.get("output_tok_s_per_gpu"),
        "usd_per_hour": usd_per_hour,
        "usd_per_million_output_tokens": report.get("usd_per_million_output_tokens"),
        "goodput_requests_per_usd": _ratio(goodput_rps * 3600, usd_per_hour),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def report_columns(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report as flat columns (a nested value, such as the seeds, as JSON text)."""
    return {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
            for k, v in report.items()}


def finite(value: Any) -> float | None:
    """``value`` as a finite float, or None (a missing metric, an invalid point)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
