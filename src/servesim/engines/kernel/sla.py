"""SLA verdicts of a replay: per-request bounds (goodput) and targets on the run.

A per-request bound holds for a request whose value is within it (inclusive) or who has
no such value (no token: no TTFT; fewer than two tokens: no TPOT; fewer than two
emissions: no ITL). Its verdict is met when it holds for every completed request, and
names the worst value and the share of requests within (``attainment``). A target on
the run compares a statistic of the report's distribution with its bound; a
distribution without samples meets no target (``met`` is None).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

from servesim.engines.kernel.requests import RequestRecord
from servesim.payload import SlaTarget
from servesim.sla import PER_REQUEST, RUN_STATS

# The report's distribution of each SLA metric
DISTRIBUTION = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2el"}


def request_value(metric: str, record: RequestRecord) -> float | None:
    """The value of ``metric`` a per-request bound checks, None where it has none."""
    times = record.token_times
    n = len(times)
    if metric == "ttft_ms":
        return times[0] - record.arrival_ms if n else None
    if metric == "tpot_ms":
        return (times[-1] - times[0]) / (n - 1) if n >= 2 else None
    if metric == "itl_ms":  # the largest gap between emissions
        return max(map(operator.sub, times[1:], times)) if n >= 2 and times[-1] > times[0] \
            else None
    if n:
        return times[-1] - record.arrival_ms
    end = record.terminal_ms if record.terminal_ms is not None else record.arrival_ms
    return end - record.arrival_ms


class RequestBounds:
    """The per-request bounds of an SLA, checked request by request."""

    def __init__(self, targets: Sequence[SlaTarget]) -> None:
        self.targets = [t for t in targets if t.stat == PER_REQUEST]
        self.worst: list[float | None] = [None] * len(self.targets)
        self.within = [0] * len(self.targets)
        self.checked = [0] * len(self.targets)

    def check(self, record: RequestRecord) -> bool:
        """Whether ``record`` is within every bound (counted for the verdicts)."""
        good = True
        for i, target in enumerate(self.targets):
            value = request_value(target.metric, record)
            if value is None:
                continue
            self.checked[i] += 1
            worst = self.worst[i]
            if worst is None or value > worst:
                self.worst[i] = value
            if value <= target.bound:
                self.within[i] += 1
            else:
                good = False
        return good

    def verdicts(self) -> list[dict[str, Any]]:
        out = []
        for i, target in enumerate(self.targets):
            checked = self.checked[i]
            out.append({**_named(target), "value": self.worst[i],
                        "met": self.within[i] == checked,
                        "attainment": self.within[i] / checked if checked else 1.0})
        return out


def run_verdicts(targets: Sequence[SlaTarget], report: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The verdict of each target on the run, from the report's distributions."""
    out = []
    for target in targets:
        if target.stat == PER_REQUEST:
            continue
        name = DISTRIBUTION[target.metric]
        if not report.get(f"num_{name}_samples"):
            out.append({**_named(target), "value": None, "met": None})
            continue
        value = float(report[f"{RUN_STATS[target.stat]}_{name}_ms"])
        out.append({**_named(target), "value": value, "met": value <= target.bound})
    return out


def _named(target: SlaTarget) -> dict[str, Any]:
    return {"metric": target.metric, "stat": target.stat, "target": target.bound}
