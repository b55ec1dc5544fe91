"""The columns of a result row: the report's metrics, and what a deployment choice is
judged by (GPUs, goodput and throughput per GPU, cost).

A metric is named as in the report (``p99_ttft_ms``) or as ``NAME.STAT``
(``ttft_ms.p99``, ``tpot_ms.mean``), the way SLA constraints are written.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

STATS = ("min", "max", "mean", "median", "std", "p75", "p90", "p95", "p99")
# derived columns, in the order they are shown
DERIVED = ("gpus", "goodput_rps_per_gpu", "output_tok_s_per_gpu", "usd_per_hour",
           "usd_per_million_output_tokens", "goodput_requests_per_usd")


def column_name(metric: str) -> str:
    """``ttft_ms.p99`` -> ``p99_ttft_ms``; a report or derived name is itself."""
    name, dot, stat = metric.strip().rpartition(".")
    return f"{stat}_{name}" if dot and stat in STATS else metric.strip()


def derived_columns(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report's GPUs, output per GPU and costs (see :func:`servesim.sweep.pricing.
    cost_figures`), and goodput per GPU and good requests per dollar."""
    gpus = int(report.get("gpus") or 0)
    usd_per_hour = report.get("usd_per_hour")
    goodput_rps = float(report.get("goodput_request_throughput_rps") or 0.0)
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
