"""Fixtures that drive a Workload by hand: a tiny virtual-time loop with fixed service time."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from servesim.engines.kernel.requests import RequestSpec, Workload

Simulate = Callable[..., list[tuple[RequestSpec, float]]]


def simulate_workload(
    workload: Workload, service_ms: float | Callable[[RequestSpec], float] = 10.0,
    limit: int = 100_000,
) -> list[tuple[RequestSpec, float]]:
    """Serve every request in ``service_ms`` (no queueing); return (request, end) in arrival
    order of processing. Respects ``max_time_ms`` like an engine: nothing after the cutoff."""
    cost = service_ms if callable(service_ms) else (lambda _s: float(service_ms))
    opened: Iterator[RequestSpec] = workload.start()
    upcoming = next(opened, None)
    events: list[tuple[float, int, int, RequestSpec]] = []  # (time, kind 0=end 1=arrive, seq)
    seq = 0
    out: list[tuple[RequestSpec, float]] = []
    cutoff = workload.max_time_ms

    def arrive(spec: RequestSpec) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (spec.arrival_ms, 1, seq, spec))

    while len(out) < limit:
        if upcoming is not None and (not events or upcoming.arrival_ms <= events[0][0]):
            arrive(upcoming)
            upcoming = next(opened, None)
            continue
        if not events:
            break
        t, kind, _, spec = heapq.heappop(events)
        if cutoff is not None and t > cutoff:
            break
        if kind == 1:
            end = t + cost(spec)
            out.append((spec, end))
            seq += 1
            heapq.heappush(events, (end, 0, seq, spec))
        else:
            for nxt in workload.on_terminal(spec, t):
                assert nxt.arrival_ms >= t
                arrive(nxt)
    return out


@pytest.fixture
def simulate() -> Simulate:
    return simulate_workload


@pytest.fixture
def write_trace(tmp_path: Path) -> Callable[..., Path]:
    def write(rows: list[Any], name: str = "trace.jsonl") -> Path:
        path = tmp_path / name
        lines = [r if isinstance(r, str) else json.dumps(r) for r in rows]
        path.write_text("".join(line + "\n" for line in lines))
        return path

    return write


TRAFFIC_CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated]
[traffic]
{traffic}
[traffic.source]
{source}
[traffic.load]
{load}
[traffic.stop]
{stop}
"""


def traffic_config(source: str, load: str = 'type = "concurrency"',
                   stop: str = "requests = 10", traffic: str = "") -> str:
    """A config of one aggregated H100 worker with these ``[traffic.*]`` lines."""
    return TRAFFIC_CONFIG.format(source=source, load=load, stop=stop, traffic=traffic)


@pytest.fixture
def config() -> Callable[..., str]:
    return traffic_config
