"""One trial: a config with a point's overrides, compiled, validated and replayed, as one
result row. An invalid point gives a row with its diagnostics instead of metrics.

A :class:`Base` is what every trial of a sweep or search shares (the config document, the
settings given once, the plugin modules); it is sent to each worker once. A trial is then
``(index, overrides)`` and its row depends on nothing else, so rows are the same whatever
runs them.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim.compiler import compile_source
from servesim.compiler.overrides import Override, format_key
from servesim.compiler.source import SourceText
from servesim.errors import ServesimError
from servesim.payload import Payload, load_payload, map_paths, payload_files, payload_to_dict
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload
from servesim.search.goals import Constraint, LoadSearch
from servesim.sweep.metrics import derived_columns, report_columns

Task = tuple[int, tuple[Override, ...]]


@attrs.frozen
class Base:
    """The config every trial starts from."""

    text: str
    name: str
    base_dir: str | None
    overrides: tuple[Override, ...] = ()
    plugins: tuple[str, ...] = ()
    # a search's load bisection, and the constraints it must meet
    load: LoadSearch | None = None
    constraints: tuple[Constraint, ...] = ()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()

    def source(self, point: tuple[Override, ...]) -> SourceText:
        return SourceText(text=self.text, name=self.name,
                          base_dir=Path(self.base_dir) if self.base_dir else None,
                          overrides=(*self.overrides, *point))


def registry_for(plugins: tuple[str, ...]) -> EngineRegistry:
    """The plugin registry a worker replays with: entry points and ``--plugin`` modules."""
    modules = [importlib.import_module(name) for name in plugins]
    return EngineRegistry.collect(get_plugin_manager(plugins=modules))


def compile_point(base: Base, point: tuple[Override, ...],
                  registry: EngineRegistry) -> Payload:
    """The point's payload (with the GPU-hour prices its report's costs come from)."""
    payload: Payload = compile_source(base.source(point), registry=registry)
    return payload


def input_files(base: Base, registry: EngineRegistry) -> list[str]:
    """The files the config (without a point's overrides) names: its trace and timing
    tables (none when it does not compile: then each point says why)."""
    try:
        payload = compile_point(base, (), registry)
    except ServesimError:
        return []
    return payload_files(payload)


def run_trial(base: Base, task: Task, registry: EngineRegistry,
              local_files: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The result row of one point. ``local_files`` maps a file the config names to the
    copy this machine reads (a Ray worker on another node). With a load search, the row
    of the largest load meeting the constraints, that load in ``max_load``."""
    index, point = task
    row: dict[str, Any] = {"point": index, **{format_key(k): v for k, v in point}}
    load = base.load
    if load is None:
        return {**row, **_replayed(base, point, registry, local_files)}

    def replay_at(value: float) -> dict[str, Any]:
        at = int(value) if load.integer else value
        return _replayed(base, (*point, (load.key, at)), registry, local_files)

    best = load.best(replay_at, base.constraints)
    gpus, max_load = best.get("gpus"), best["max_load"]
    per_gpu = max_load / gpus if max_load is not None and gpus else None
    return {**row, **best, "max_load_per_gpu": per_gpu}


def _replayed(base: Base, point: tuple[Override, ...], registry: EngineRegistry,
              local_files: Mapping[str, str] | None) -> dict[str, Any]:
    try:
        payload = compile_point(base, point, registry)
    except ServesimError as exc:
        return {"status": "invalid", "error": _errors(exc)}
    if local_files:
        data = payload_to_dict(payload)
        map_paths(data, lambda p: local_files.get(p, p), models=False)
        payload = load_payload(data)
    try:
        report = replay_payload(payload, registry=registry).report
    except ServesimError as exc:
        return {"status": "failed", "error": _errors(exc)}
    return {"status": "ok", "error": None,
            **derived_columns(report), **report_columns(report)}


def _errors(exc: ServesimError) -> str:
    return "; ".join(d.render().replace("\n  hint: ", " (hint: ") + (")" if d.hint else "")
                     for d in exc.diagnostics)
