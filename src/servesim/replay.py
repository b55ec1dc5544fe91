"""Replay a payload: engine lookup and handoff check, workload, metrics, report."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servesim import __version__
from servesim.engines.kernel.metrics import MetricsCollector, request_record_json
from servesim.engines.kernel.requests import RequestRecord
from servesim.errors import Diagnostic, PayloadError
from servesim.payload import Payload
from servesim.plugins.manager import EngineRegistry
from servesim.workloads import build_workload


def replay(payload: Payload, *, registry: EngineRegistry | None = None,
           base_dir: Path | None = None) -> dict[str, Any]:
    """Replay a payload with the default plugin registry; return the report dict."""
    if registry is None:
        from servesim.plugins.manager import get_plugin_manager

        registry = EngineRegistry.collect(get_plugin_manager())
    return replay_payload(payload, registry=registry, base_dir=base_dir)


def replay_payload(payload: Payload, *, registry: EngineRegistry, base_dir: Path | None = None,
                   requests_out: Path | None = None,
                   progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Check the payload with its engine's rules, replay it, return the report dict.

    Per-request records stream to ``requests_out`` (JSON lines) as requests finish, so
    memory per finished request stays O(1) beyond the latency samples.
    """
    engine = registry.get(payload.engine)
    if engine is None:
        raise PayloadError([Diagnostic(
            code="unknown-engine", path=("engine",),
            message=f"no engine named {payload.engine!r} is registered (registered: "
            f"{', '.join(registry.names()) or 'none'})")])
    diags = engine.validate_payload(payload)
    if diags:
        raise PayloadError(diags)
    collector = MetricsCollector(payload.sla)
    started = time.perf_counter()
    with build_workload(payload.workload, base_dir=base_dir) as workload:
        if requests_out is None:
            result = engine.replay(payload, workload, collector.add, progress=progress)
        else:
            requests_out.parent.mkdir(parents=True, exist_ok=True)
            with requests_out.open("w", encoding="utf-8") as f:
                def sink(record: RequestRecord) -> None:
                    collector.add(record)
                    f.write(json.dumps(request_record_json(record), sort_keys=True) + "\n")

                result = engine.replay(payload, workload, sink, progress=progress)
    wall_ms = (time.perf_counter() - started) * 1000.0
    report = collector.report(wall_time_ms=wall_ms, gpu_seconds=result.gpu_seconds)
    report["servesim_version"] = __version__
    report["engine"] = payload.engine
    return report
