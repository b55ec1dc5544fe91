"""The parts of a config whose valid values come from plugins, checked against the registry.

``engine.engine`` names a registered engine (default ``vllm``, or ``disagg`` in
disaggregated mode) that must run the deployment's mode; ``[engine.options]`` is
structured by that engine's ``Options`` class with the same converter as the rest of the
config, so its errors read ``engine.options.<key>: ... [code]``; ``timing.type``,
``routing.type`` and ``traffic.source.format`` name registered timing providers, routers
and trace formats (a routing table's other keys are the router's options).
(``engine.backend`` is checked by the converter against the registered backends, see
:mod:`servesim.backends`.)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Any

import cattrs

from servesim import codes
from servesim.compiler.context import CompileContext, Registry
from servesim.compiler.model.parsed import Engine as ParsedEngine
from servesim.compiler.model.parsed import ParsedConfig, Timing
from servesim.engines.routing.registry import routing_args, routing_path
from servesim.errors import CompileError, Diagnostic, Path
from servesim.payload import RoutingArgs

DEFAULT_ENGINE = {"aggregated": "vllm", "disaggregated": "disagg"}
ENGINE_PATH: Path = ("engine", "engine")


def selected_engine(e: ParsedEngine) -> str:
    """The engine a config selects: ``engine.engine``, else the mode's default."""
    if e.engine is not None:
        return e.engine
    return DEFAULT_ENGINE["disaggregated" if e.mode == "disaggregated" else "aggregated"]


def _unknown(code: str, path: Path, kind: str, name: str, known: Iterable[str]) -> Diagnostic:
    known = sorted(known)
    close = difflib.get_close_matches(name, known, n=1)
    return Diagnostic(code=code, path=path,
                      message=f"unknown {kind} {name!r} (registered: {', '.join(known) or 'none'})",
                      hint=f"did you mean {close[0]!r}?" if close else
                      "is the plugin that provides it installed? `servesim plugins` lists them")


def check_plugin_sections(cfg: ParsedConfig, registry: Registry) -> list[Diagnostic]:
    """Every problem with the plugin-defined parts of ``cfg`` (parse stage)."""
    return list(_engine(cfg.engine, registry)) + list(_timing(cfg, registry)) \
        + list(_routing(cfg, registry)) + list(_trace_format(cfg, registry))


def _engine(e: ParsedEngine, registry: Registry) -> Iterator[Diagnostic]:
    name = selected_engine(e)
    cls = registry.engine_class(name)
    if cls is None:
        yield _unknown(codes.UNKNOWN_ENGINE, ENGINE_PATH, "engine", name, registry.names())
        return
    mode = e.mode or "aggregated"
    if mode in DEFAULT_ENGINE and mode not in cls.MODES:
        yield Diagnostic(code=codes.ENGINE_MODE,
                         path=ENGINE_PATH if e.engine else ("engine", "mode"),
                         message=f"engine {name!r} does not run {mode} deployments (it runs: "
                         f"{', '.join(cls.MODES)})")
    with registry.guard(name, f"{cls.__qualname__}.Options"):
        options, diags = cls.structure_options(e.options)
    yield from diags
    if options is not None:
        engine = registry.get(name)
        assert engine is not None
        yield from registry.diagnostics(name, f"{cls.__qualname__}.check_options",
                                        lambda: engine.check_options(options))


def _timing(cfg: ParsedConfig, registry: Registry) -> Iterator[Diagnostic]:
    known = registry.timing_providers
    for role in ("aggregated", "prefill", "decode"):
        worker = getattr(cfg.engine.workers, role)
        kind = worker.timing.type if worker is not None and worker.timing is not None else None
        if kind is not None and kind not in known:
            yield _unknown(codes.UNKNOWN_TIMING, ("engine", "workers", role, "timing", "type"),
                           "timing type", kind, known)
        elif worker is not None and worker.timing is not None:
            yield from _timing_options(worker.timing, role, registry)[1]


def _timing_options(timing: Timing, role: str, registry: Registry) -> tuple[
        dict[str, Any] | None, list[Diagnostic]]:
    """A role's timing options as the payload carries them (defaults applied; None for a
    provider without options), or the diagnostics that refuse them."""
    from servesim.timing.registry import options_class, provider_options

    kind = timing.type or "default"
    factory = registry.timing_providers[kind]
    path = ("engine", "workers", role, "timing", "options")
    options, diags = provider_options(factory, kind, timing.options, path)
    if diags or options_class(factory) is None:
        return None, diags
    return cattrs.Converter().unstructure(options), []


def resolve_timing_options(cfg: ParsedConfig, ctx: CompileContext) -> dict[
        str, dict[str, Any] | None]:
    """Each configured role's timing options (see :func:`_timing_options`); the parse pass
    refused any that are wrong."""
    out: dict[str, dict[str, Any] | None] = {}
    for role in ("aggregated", "prefill", "decode"):
        worker = getattr(cfg.engine.workers, role)
        if worker is not None:
            options, diags = _timing_options(worker.timing or Timing(), role, ctx.registry)
            if diags:
                raise CompileError(diags)
            out[role] = options
    return out


def _routing_tables(cfg: ParsedConfig) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each role's routing table, for the roles that write one."""
    for role in ("aggregated", "prefill", "decode"):
        worker = getattr(cfg.engine.workers, role)
        if worker is not None and worker.routing is not None:
            yield role, worker.routing


def _routing(cfg: ParsedConfig, registry: Registry) -> Iterator[Diagnostic]:
    for role, table in _routing_tables(cfg):
        yield from routing_args(table, registry.routers, routing_path(role))[1]


def resolve_routing(cfg: ParsedConfig, ctx: CompileContext) -> dict[str, RoutingArgs]:
    """The routing of each role that writes a routing table (the parse pass refused any
    that is wrong); a role without one keeps none in the payload: round-robin."""
    out: dict[str, RoutingArgs] = {}
    for role, table in _routing_tables(cfg):
        args, diags = routing_args(table, ctx.registry.routers, routing_path(role))
        if args is None:
            raise CompileError(diags)
        out[role] = args
    return out


def _trace_format(cfg: ParsedConfig, registry: Registry) -> Iterator[Diagnostic]:
    source = cfg.traffic.source if cfg.traffic is not None else None
    if source is not None and source.format is not None \
            and source.format not in registry.trace_formats:
        yield _unknown(codes.UNKNOWN_TRACE_FORMAT, ("traffic", "source", "format"), "trace format",
                       source.format, registry.trace_formats)


def resolve_engine_options(cfg: ParsedConfig, ctx: CompileContext) -> tuple[
        str, dict[str, Any], dict[str, bool]]:
    """The engine name, its options (defaults applied, JSON-ready) and which were authored."""
    registry = ctx.registry
    name = selected_engine(cfg.engine)
    cls = registry.engine_class(name)
    if cls is None:  # the parse pass reported it; reached only by a direct caller
        raise CompileError([_unknown(codes.UNKNOWN_ENGINE, ENGINE_PATH, "engine", name,
                                     registry.names())])
    options, diags = cls.structure_options(cfg.engine.options)
    if diags:
        raise CompileError(diags)
    data: dict[str, Any] = cattrs.Converter().unstructure(options)
    authored = cfg.engine.options or {}
    return name, data, {key: key in authored for key in data}
