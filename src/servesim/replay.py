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
import sys
import time
import types
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import attrs

from servesim import codes
from servesim.engines.kernel.metrics import MetricsCollector, request_record_json
from servesim.engines.kernel.requests import RequestRecord
from servesim.errors import Diagnostic, PayloadError, ServesimError, WorkloadError
from servesim.files import whole_file
from servesim.payload import Payload, map_paths, payload_to_dict
from servesim.plugins import checked
from servesim.plugins.manager import EngineRegistry
from servesim.rules import prompt_over_budget
from servesim.sla import sla_deprecations
from servesim.sweep.pricing import cost_figures
from servesim.timing.registry import make_timer
from servesim.version import __version__
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
    load_workload,
)


@attrs.frozen
class ReplayOutcome(Mapping[str, Any]):
    """What :func:`replay` and :func:`replay_payload` return: the report, and beside it the
    host's wall time and the warnings. It reads as the report too (``outcome["mean_ttft_ms"]``,
    ``dict(outcome)``), as :func:`replay`'s report dict did."""

    report: dict[str, Any]
    wall_time_ms: float
    # what the user should know about the run but did not stop it (severity "warning"):
    # a role the measured kernel tables do not cover, priced by the default timing
    warnings: tuple[Diagnostic, ...] = ()

    def __getitem__(self, key: str) -> Any:
        return self.report[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.report)

    def __len__(self) -> int:
        return len(self.report)


def replay(payload: Payload, *, registry: EngineRegistry | None = None,
           base_dir: Path | None = None) -> ReplayOutcome:
    """Replay a payload (with the default plugin registry unless given one)."""
    return replay_payload(payload, registry=registry, base_dir=base_dir)


def default_registry() -> EngineRegistry:
    """The built-ins and the installed entry-point plugins."""
    from servesim.plugins.manager import get_plugin_manager

    return EngineRegistry.collect(get_plugin_manager())


def check_input_files(payload: Payload, *, registry: EngineRegistry,
                      base_dir: Path | None = None) -> list[Diagnostic]:
    """What a replay would find wrong in the files the payload names, found without
    replaying: every row of a trace in a built-in format (in a plugin's format, that the
    file is there), and each role's step timer, built as the replay builds it (a timing
    table is read and checked; a role the measured kernel tables do not cover gives a
    warning)."""
    out: list[Diagnostic] = []
    spec = load_workload(payload.workload, formats=tuple(registry.trace_formats))
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
    elif isinstance(source, SyntheticSource | SessionSource):
        try:  # the first request's prompt, drawn (an empirical length's file is read)
            with build_workload(spec, base_dir=base_dir) as drawn:
                first_prompt = next(drawn.start()).input_length
        except WorkloadError as exc:
            out += exc.diagnostics
    for role in payload.roles.values():
        if first_prompt is not None and role.worker_type != "decode":
            problem = prompt_over_budget(role, 0, first_prompt)
            out += [problem] if problem else []
    for role in payload.roles.values():
        try:
            make_timer(role, registry.timing_providers, registry.backends)
        except ServesimError as exc:
            out += exc.diagnostics
    if not any(d.severity == "error" for d in out):
        out += _measured_notes(payload, registry)[1]
    return out


def _measured_notes(payload: Payload, registry: EngineRegistry
                    ) -> tuple[dict[str, str], list[Diagnostic]]:
    """:func:`servesim.timing.measured.measured_notes` of the payload's roles; the measured
    provider (and the default timing it falls back to) is imported only for a payload
    that uses it."""
    if all(role.timing.type != "measured" for role in payload.roles.values()):
        return {}, []
    from servesim.timing.measured import measured_notes

    return measured_notes(payload.roles, registry.backends)


def replay_payload(payload: Payload, *, registry: EngineRegistry | None = None,
                   base_dir: Path | None = None,
                   requests_out: Path | None = None,
                   progress: Callable[[float], None] | None = None,
                   workload: SessionWorkload | None = None,
                   on_record: Callable[[RequestRecord], None] | None = None) -> ReplayOutcome:
    """Check the payload with its engine's rules, replay it, return the report.

    Per-request records stream to ``requests_out`` (JSON lines) as requests finish, so
    memory per finished request stays O(1) beyond the latency samples; they go to a
    temporary file beside it, renamed over it when the replay ends, so a replay that fails
    leaves the previous file in place. ``on_record`` (if given) is called with each record
    too, and ``progress`` with the virtual time now and then (by an engine that does).
    ``workload`` replaces the one ``payload.workload`` describes (the report still names
    the latter). ``registry`` defaults to the built-ins and the installed entry-point
    plugins.
    """
    registry = default_registry() if registry is None else registry
    engine = registry.get(payload.engine)
    if engine is None:
        raise PayloadError([Diagnostic(
            code=codes.UNKNOWN_ENGINE, path=("engine",),
            message=f"no engine named {payload.engine!r} is registered (registered: "
            f"{', '.join(registry.names()) or 'none'})")])
    hook = f"{type(engine).__qualname__}.%s"  # plugin errors name the engine method
    source = registry.source_of(payload.engine)
    third_party = source.kind != "builtin"  # a built-in's bookkeeping is audited instead
    diags = registry.diagnostics(payload.engine, hook % "validate_payload",
                                 lambda: engine.validate_payload(payload))
    if diags:
        raise PayloadError(diags)
    timing_sources, warnings = _measured_notes(payload, registry)
    warnings = [*sla_deprecations(payload.sla), *warnings]
    collector = MetricsCollector(payload.sla)
    started = time.perf_counter()
    if workload is None:
        workload = build_workload(payload.workload, base_dir=base_dir,
                                  formats=registry.trace_formats)
    with workload, _fewer_collections(), \
            registry.guard(payload.engine, hook % "replay"), contextlib.ExitStack() as stack:
        sink: Callable[[RequestRecord], None] = collector.add
        if requests_out is not None:  # renamed over it at the end (on Ctrl-C too)
            f = stack.enter_context(whole_file(requests_out, keep_on_interrupt=True))

            def sink(record: RequestRecord) -> None:
                collector.add(record)
                f.write(json.dumps(request_record_json(record), sort_keys=True) + "\n")

        if on_record is not None:
            sink = _then(sink, on_record)
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
    report.update(cost_figures(payload.roles, payload.gpu_hour_usd,
                               report["output_throughput_tok_s"], result.gpu_seconds))
    return ReplayOutcome(report=report, wall_time_ms=wall_ms, warnings=tuple(warnings))


def _then(first: Callable[[RequestRecord], None], then: Callable[[RequestRecord], None]
          ) -> Callable[[RequestRecord], None]:
    def both(record: RequestRecord) -> None:
        first(record)
        then(record)

    return both


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


class _ReplayModule(types.ModuleType):
    """This module, callable as :func:`replay`. Importing ``servesim.replay`` sets the package's
    attribute ``replay`` to the module, over the function ``servesim.replay`` exports: calling
    either replays."""

    def __call__(self, payload: Payload, *, registry: EngineRegistry | None = None,
                 base_dir: Path | None = None) -> ReplayOutcome:
        return replay(payload, registry=registry, base_dir=base_dir)


sys.modules[__name__].__class__ = _ReplayModule
