"""Replay a payload: engine lookup and handoff check, workload, metrics, report.

The report is a pure function of the payload and the trace: the same inputs give
byte-identical report files across runs and processes. Host timing (the simulator's own
wall time) is therefore returned beside the report, never inside it.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import json
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import attrs

from servesim import __version__
from servesim.backends import use_backends
from servesim.engines.kernel.metrics import MetricsCollector, request_record_json
from servesim.engines.kernel.requests import RequestRecord
from servesim.errors import Diagnostic, PayloadError, ServesimError
from servesim.files import whole_file
from servesim.payload import Payload, map_paths, payload_to_dict
from servesim.plugins import checked
from servesim.plugins.manager import EngineRegistry
from servesim.rules import prompt_over_budget
from servesim.sla import sla_deprecations
from servesim.timing.measured import measured_notes
from servesim.timing.registry import make_timer, use_providers
from servesim.workloads import (
    build_workload,
    resolve_trace_path,
    trace_sha256,
    unreadable_trace,
    validate_trace,
)
from servesim.workloads.driver import SessionWorkload
from servesim.workloads.mooncake import iter_trace_rows
from servesim.workloads.spec import (
    TRACE_FORMATS,
    SessionSource,
    SyntheticSource,
    TimestampLoad,
    TraceSource,
    parse_workload_spec,
)


@attrs.frozen
class ReplayOutcome:
    report: dict[str, Any]
    wall_time_ms: float
    # what the user should know about the run but did not stop it (severity "warning"):
    # a role the measured kernel tables do not cover, priced by the default timing
    warnings: tuple[Diagnostic, ...] = ()


def replay(payload: Payload, *, registry: EngineRegistry | None = None,
           base_dir: Path | None = None) -> dict[str, Any]:
    """Replay a payload with the default plugin registry; return the report dict."""
    if registry is None:
        from servesim.plugins.manager import get_plugin_manager

        registry = EngineRegistry.collect(get_plugin_manager())
    return replay_payload(payload, registry=registry, base_dir=base_dir).report


def check_input_files(payload: Payload, *, registry: EngineRegistry,
                      base_dir: Path | None = None) -> list[Diagnostic]:
    """What a replay would find wrong in the files the payload names, found without
    replaying: every row of a trace in a built-in format (in a plugin's format, that the
    file is there), and each role's step timer, built as the replay builds it (a timing
    table is read and checked; a role the measured kernel tables do not cover gives a
    warning)."""
    out: list[Diagnostic] = []
    spec = parse_workload_spec(payload.workload, formats=tuple(registry.trace_formats))
    source = spec.source
    first_prompt: int | None = None  # the first request's prompt: nothing of it is cached
    if isinstance(source, TraceSource):
        path = resolve_trace_path(source.path, base_dir)
        if source.format in TRACE_FORMATS:
            out += validate_trace(path, source.format, source.block_size, display=source.path,
                                  require_timestamps=isinstance(spec.load, TimestampLoad))
            if not out:
                with closing(iter_trace_rows(path, source.path, source.block_size)) as rows:
                    first_prompt = next(rows).input_length
        else:
            unreadable = unreadable_trace(path, source.path)
            out += [unreadable] if unreadable else []
    elif isinstance(source, SyntheticSource):
        first_prompt = source.input_tokens
    elif isinstance(source, SessionSource):
        first_prompt = source.new_input_tokens_per_turn
    for role in payload.roles.values():
        if first_prompt is not None and role.worker_type != "decode":
            problem = prompt_over_budget(role, 0, first_prompt)
            out += [problem] if problem else []
    with use_providers(registry.timing_providers), use_backends(registry.backends):
        for role in payload.roles.values():
            try:
                make_timer(role)
            except ServesimError as exc:
                out += exc.diagnostics
    if not any(d.severity == "error" for d in out):
        out += measured_notes(payload.roles)[1]
    return out


def replay_payload(payload: Payload, *, registry: EngineRegistry, base_dir: Path | None = None,
                   requests_out: Path | None = None,
                   progress: Callable[[float], None] | None = None,
                   workload: SessionWorkload | None = None) -> ReplayOutcome:
    """Check the payload with its engine's rules, replay it, return the report.

    Per-request records stream to ``requests_out`` (JSON lines) as requests finish, so
    memory per finished request stays O(1) beyond the latency samples; they go to a
    temporary file beside it, renamed over it when the replay ends, so a replay that fails
    leaves the previous file in place. ``workload`` replaces the one ``payload.workload``
    describes (the report still names the latter).
    """
    engine = registry.get(payload.engine)
    if engine is None:
        raise PayloadError([Diagnostic(
            code="unknown-engine", path=("engine",),
            message=f"no engine named {payload.engine!r} is registered (registered: "
            f"{', '.join(registry.names()) or 'none'})")])
    hook = f"{type(engine).__qualname__}.%s"  # plugin errors name the engine method
    source = registry.source_of(payload.engine)
    third_party = source.kind != "builtin"  # a built-in's bookkeeping is audited instead
    with use_backends(registry.backends):
        diags = registry.diagnostics(payload.engine, hook % "validate_payload",
                                     lambda: engine.validate_payload(payload))
    if diags:
        raise PayloadError(diags)
    with use_providers(registry.timing_providers), use_backends(registry.backends):
        timing_sources, warnings = measured_notes(payload.roles)
    warnings = [*sla_deprecations(payload.sla), *warnings]
    collector = MetricsCollector(payload.sla)
    started = time.perf_counter()
    if workload is None:
        workload = build_workload(payload.workload, base_dir=base_dir,
                                  formats=registry.trace_formats)
    with workload, \
            use_providers(registry.timing_providers), use_backends(registry.backends), \
            _fewer_collections(), \
            registry.guard(payload.engine, hook % "replay"), contextlib.ExitStack() as stack:
        sink: Callable[[RequestRecord], None] = collector.add
        if requests_out is not None:  # renamed over it at the end (on Ctrl-C too)
            f = stack.enter_context(whole_file(requests_out, keep_on_interrupt=True))

            def sink(record: RequestRecord) -> None:
                collector.add(record)
                f.write(json.dumps(request_record_json(record), sort_keys=True) + "\n")

        if third_party:
            ledger = checked.Ledger(source, hook % "replay", sink)
            value = engine.replay(payload, ledger.workload(workload), ledger.sink,
                                  progress=progress)
            result = checked.result(source, hook % "replay", value)
            ledger.check_complete()
        else:
            result = engine.replay(payload, workload, sink, progress=progress)
    wall_ms = (time.perf_counter() - started) * 1000.0
    extra = {**result.extra, **provenance(payload, base_dir)}
    if timing_sources:
        extra["timing_sources"] = timing_sources
    report = collector.report(wall_time_ms=0.0, gpu_seconds=result.gpu_seconds, extra=extra)
    del report["wall_time_ms"]
    return ReplayOutcome(report=report, wall_time_ms=wall_ms, warnings=tuple(warnings))


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Within the block, the garbage collector runs about 70 times less often (the process's
    thresholds are restored after). A replay allocates many short-lived objects and makes
    little cyclic garbage, and each collection also walks the long-lived replay state."""
    thresholds = gc.get_threshold()
    gc.set_threshold(50_000, 20, 20)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def provenance(payload: Payload, base_dir: Path | None) -> dict[str, Any]:
    """What identifies a report's inputs: versions, hashes of payload and trace, seeds."""
    data = payload_to_dict(payload)
    source = data["workload"].get("source", {})
    out: dict[str, Any] = {"servesim_version": __version__, "engine": payload.engine}
    if "path" in source:
        out["trace_sha256"] = trace_sha256(resolve_trace_path(source["path"], base_dir))
    # files are named by their last part: a payload is the same wherever it and they live
    # (the trace is identified by its hash)
    map_paths(data, lambda path: Path(path).name)
    data.pop("servesim_version", None)
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    out["payload_sha256"] = hashlib.sha256(canonical.encode()).hexdigest()
    seeds = {f"speculation.{name}": role.speculation.seed
             for name, role in sorted(payload.roles.items()) if role.speculation is not None}
    if "seed" in data["workload"].get("load", {}):
        seeds["traffic.load"] = data["workload"]["load"]["seed"]
    out["seeds"] = seeds
    return out
