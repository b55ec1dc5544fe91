"""The resolved workload dict (written by the compiler into the payload), as typed values.

The compiler has already validated the user's ``traffic`` table; this module re-checks
what a direct caller could get wrong (wrong types, a source/load combination no driver
implements) and raises :class:`~servesim.errors.WorkloadError` located at the offending
``traffic.*`` key. Optional keys take the defaults of the ``traffic`` schema. The rules
between values are the compiler's own (:mod:`servesim.traffic_rules`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from servesim.errors import Diagnostic, WorkloadError
from servesim.traffic_rules import DEFAULT_INPUT_TOKENS, check_traffic, rate_key

TRACE_FORMATS = ("mooncake", "mooncake-delta")
DEFAULT_TRACE_BLOCK_SIZE = 512
DEFAULT_POISSON_SEED = 42


@attrs.frozen
class SyntheticSource:
    input_tokens: int = DEFAULT_INPUT_TOKENS
    output_tokens: int = 128
    cached_prefix_tokens: int = 0
    # request i generates output_tokens x (1 + ratio x (2 u_i - 1)) tokens (at least one),
    # u_i a fixed low-discrepancy sequence over [0, 1): lengths spread evenly over the range,
    # the same in every replay, with mean output_tokens
    output_range_ratio: float = 0.0


@attrs.frozen
class SessionSource:
    new_input_tokens_per_turn: int = 1024
    output_tokens_per_turn: int = 128
    turns: int = 4
    shared_prefix_ratio: float = 0.0
    prefix_groups: int = 0
    inter_turn_delay_ms: float = 0.0
    # Granularity of the shared prefix: ``round(blocks * ratio)`` blocks of this size.
    # ``None`` shares ``round(tokens * ratio)`` tokens (block size 1).
    block_size: int | None = None


@attrs.frozen
class TraceSource:
    path: str
    format: str = "mooncake"
    block_size: int = DEFAULT_TRACE_BLOCK_SIZE


Source = SyntheticSource | SessionSource | TraceSource


@attrs.frozen
class ConcurrencyLoad:
    """Closed loop: ``concurrency`` units (requests or sessions) in flight."""

    concurrency: int


@attrs.frozen
class RateLoad:
    """Open loop at ``rate`` units per second: ``poisson`` or ``constant_rate``."""

    kind: Literal["poisson", "constant_rate"]
    rate: float
    unit: Literal["requests", "sessions"]
    seed: int = DEFAULT_POISSON_SEED


@attrs.frozen
class TimestampLoad:
    """Open loop at the trace's own timestamps, divided by ``speedup``."""

    speedup: float = 1.0


Load = ConcurrencyLoad | RateLoad | TimestampLoad


@attrs.frozen
class Stop:
    requests: int | None = None
    sessions: int | None = None
    max_time_ms: float | None = None


@attrs.frozen
class WorkloadSpec:
    source: Source
    load: Load
    stop: Stop


def _fail(path: tuple[str, ...], message: str, hint: str | None = None) -> WorkloadError:
    return WorkloadError(
        [Diagnostic(code="bad-workload", message=message, path=("traffic", *path), hint=hint)]
    )


def _table(value: Any, path: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(path, f"must be a table, got {type(value).__name__}")
    return value


def _known(table: Mapping[str, Any], path: tuple[str, ...], *keys: str) -> None:
    """Refuse a key the table's kind does not read (a misspelt one would take a default)."""
    for key in table:
        if key not in keys:
            raise _fail((*path, str(key)), f"unknown key {str(key)!r}",
                        f"the keys read here are: {', '.join(sorted(keys))}")


def _upper_limits() -> dict[str, float]:
    """Upper bounds of the ``traffic`` keys, read from the config schema (one source)."""
    from servesim.compiler.model import parsed

    out: dict[str, float] = {}
    for cls in (parsed.Source, parsed.Session, parsed.Load, parsed.Stop):
        for f in attrs.fields(cls):
            if f.metadata.get("hi") is not None:
                out[f.name] = f.metadata["hi"]
    return out


_UPPER = _upper_limits()


def _int(table: Mapping[str, Any], key: str, path: tuple[str, ...], default: int | None,
         minimum: int) -> int:
    value = table.get(key, default)
    if value is None:
        raise _fail((*path, key), f"'{key}' is required")
    upper = _UPPER.get(key)
    if (isinstance(value, bool) or not isinstance(value, int) or value < minimum
            or (upper is not None and value > upper)):
        bound = f">= {minimum}" + (f" and <= {int(upper)}" if upper is not None else "")
        raise _fail((*path, key), f"'{key}' must be an integer {bound}, got {value!r}")
    return value


def _float(table: Mapping[str, Any], key: str, path: tuple[str, ...], default: float | None,
           *, positive: bool = False, upper: float | None = None) -> float:
    value = table.get(key, default)
    if value is None:
        raise _fail((*path, key), f"'{key}' is required")
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if ok:
        ok = value > 0 if positive else value >= 0
    upper = _UPPER.get(key) if upper is None else upper
    if ok and upper is not None:
        ok = value <= upper
    if not ok:
        bound = "> 0" if positive else ">= 0"
        if upper is not None:
            bound += f" and <= {upper:g}"
        raise _fail((*path, key), f"'{key}' must be a finite number {bound}, got {value!r}")
    return float(value)


def _parse_source(table: Mapping[str, Any], formats: tuple[str, ...] = TRACE_FORMATS) -> Source:
    path = ("source",)
    kind = table.get("type", "synthetic")
    if kind == "synthetic":
        _known(table, path, "type", "input_tokens", "output_tokens", "cached_prefix_tokens",
               "output_range_ratio")
        return SyntheticSource(_int(table, "input_tokens", path, DEFAULT_INPUT_TOKENS, 1),
                               _int(table, "output_tokens", path, 128, 0),
                               _int(table, "cached_prefix_tokens", path, 0, 0),
                               _float(table, "output_range_ratio", path, 0.0, upper=1.0))
    if kind == "synthetic-session":
        _known(table, path, "type", *(f.name for f in attrs.fields(SessionSource)))
        block = table.get("block_size")
        return SessionSource(
            new_input_tokens_per_turn=_int(table, "new_input_tokens_per_turn", path, 1024, 1),
            output_tokens_per_turn=_int(table, "output_tokens_per_turn", path, 128, 0),
            turns=_int(table, "turns", path, 4, 1),
            shared_prefix_ratio=_float(table, "shared_prefix_ratio", path, 0.0, upper=1.0),
            prefix_groups=_int(table, "prefix_groups", path, 0, 0),
            inter_turn_delay_ms=_float(table, "inter_turn_delay_ms", path, 0.0),
            block_size=None if block is None else _int(table, "block_size", path, None, 1),
        )
    if kind == "trace":
        _known(table, path, "type", "path", "paths", "format", "block_size")
        raw_path = table.get("path")
        if raw_path is None:
            paths = table.get("paths")
            if isinstance(paths, list | tuple) and len(paths) == 1:
                raw_path = paths[0]
        if not isinstance(raw_path, str) or not raw_path:
            raise _fail((*path, "path"), "a trace source needs one trace file path",
                        'set path = "traces/my_trace.jsonl"')
        fmt = table.get("format", "mooncake")
        if fmt not in formats:
            raise _fail((*path, "format"), f"trace format {fmt!r} is not supported",
                        f"use one of: {', '.join(sorted(formats))}")
        block = _int(table, "block_size", path, DEFAULT_TRACE_BLOCK_SIZE, 1)
        return TraceSource(raw_path, fmt, block)
    raise _fail((*path, "type"), f"unknown source type {kind!r}",
                "use 'synthetic', 'synthetic-session' or 'trace'")


def _parse_load(table: Mapping[str, Any], source_type: str) -> Load:
    """The load, once :func:`check_traffic` has matched it to the source."""
    path = ("load",)
    kind = table.get("type", "concurrency")
    if kind == "concurrency":
        _known(table, path, "type", "concurrency")
        return ConcurrencyLoad(_int(table, "concurrency", path, 10, 1))
    if kind in ("poisson", "constant_rate"):
        key = rate_key(source_type)
        _known(table, path, "type", key, "seed")
        rate = _float(table, key, path, None, positive=True)
        seed = _int(table, "seed", path, DEFAULT_POISSON_SEED, 0)
        return RateLoad(kind, rate, key.removesuffix("_per_second"), seed)  # type: ignore[arg-type]
    if kind == "trace_timestamps":
        _known(table, path, "type", "speedup")
        return TimestampLoad(_float(table, "speedup", path, 1.0, positive=True))
    raise _fail((*path, "type"), f"unknown load type {kind!r}",
                "use concurrency, poisson, constant_rate or trace_timestamps")


def _parse_stop(table: Mapping[str, Any], source: Source) -> Stop:
    path = ("stop",)
    _known(table, path, "requests", "sessions", "max_virtual_time_seconds")
    requests = None if table.get("requests") is None else _int(table, "requests", path, None, 1)
    sessions = None if table.get("sessions") is None else _int(table, "sessions", path, None, 1)
    max_time = None
    if table.get("max_virtual_time_seconds") is not None:
        max_time = 1000.0 * _float(table, "max_virtual_time_seconds", path, None, positive=True)
    if not isinstance(source, TraceSource) and requests is None and sessions is None \
            and max_time is None:
        raise _fail(path, "a synthetic workload needs a stop condition",
                    "set stop.requests (synthetic) or stop.sessions (synthetic-session)")
    return Stop(requests, sessions, max_time)


def parse_workload_spec(spec: Mapping[str, Any], *,
                        formats: tuple[str, ...] | None = None) -> WorkloadSpec:
    """Type-check the resolved workload dict; raise :class:`WorkloadError` if it is wrong.

    ``formats`` are the known trace format names (default: the built-in ones).
    """
    spec = _table(spec, ())
    _known(spec, (), "source", "load", "stop")
    tables = {key: _table(spec.get(key, {}), (key,)) for key in ("source", "load", "stop")}
    source = _parse_source(tables["source"], TRACE_FORMATS if formats is None else formats)
    diags = check_traffic(tables["source"], tables["load"])
    if diags:
        raise WorkloadError(diags)
    load = _parse_load(tables["load"], tables["source"].get("type", "synthetic"))
    stop = _parse_stop(tables["stop"], source)
    return WorkloadSpec(source, load, stop)
