"""Workloads: synthetic requests, synthetic sessions and Mooncake traces, with arrivals.

``build_workload(spec)`` turns the workload of a payload (a :class:`WorkloadSpec`, or its
JSON form) into an object implementing the kernel
:class:`~servesim.engines.kernel.requests.Workload` protocol.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim.errors import WorkloadError
from servesim.workloads.driver import (
    ArrivalPlan,
    ClosedLoop,
    OpenLoop,
    Session,
    SessionWorkload,
    constant_arrivals,
    gamma_arrivals,
    poisson_arrivals,
)
from servesim.workloads.formats import BUILTIN_FORMATS, TraceFile, TraceLoader
from servesim.workloads.lengths import LengthDistribution, read_rows
from servesim.workloads.mooncake import (
    TraceRow,
    iter_trace_rows,
    trace_sha256,
    unreadable_trace,
    validate_trace,
)
from servesim.workloads.spec import (
    DEFAULT_POISSON_SEED,
    ConcurrencyLoad,
    RateLoad,
    SessionSource,
    SyntheticSource,
    TimestampLoad,
    TraceSource,
    WorkloadSpec,
    load_workload,
)
from servesim.workloads.synthetic import synthetic_requests, synthetic_sessions

__all__ = [
    "SessionWorkload",
    "TraceRow",
    "WorkloadSpec",
    "build_workload",
    "constant_arrivals",
    "gamma_arrivals",
    "iter_trace_rows",
    "load_workload",
    "poisson_arrivals",
    "resolve_trace_path",
    "trace_sha256",
    "unreadable_trace",
    "validate_trace",
]


def resolve_trace_path(path: str, base_dir: Path | None = None) -> Path:
    """A trace path from the workload dict, relative to ``base_dir`` when not absolute."""
    p = Path(path)
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    return p


def _plan(spec: WorkloadSpec) -> ArrivalPlan:
    load = spec.load
    if isinstance(load, ConcurrencyLoad):
        return ClosedLoop(load.concurrency)
    if isinstance(load, TimestampLoad):
        return OpenLoop(None)
    rate, seed = load.rate, load.arrival_seed
    if load.type == "poisson":
        return OpenLoop(lambda: poisson_arrivals(rate, seed))
    if load.type == "gamma":
        cv = 1.0 if load.cv is None else load.cv
        return OpenLoop(lambda: gamma_arrivals(rate, cv, seed))
    return OpenLoop(lambda: constant_arrivals(rate))


def build_workload(spec: WorkloadSpec | Mapping[str, Any], *, base_dir: Path | None = None,
                   formats: Mapping[str, TraceLoader] | None = None) -> SessionWorkload:
    """The workload a payload describes, checked (see :mod:`servesim.workloads.spec`).

    Trace paths are relative to ``base_dir``. ``formats`` are the trace loaders by name
    (a plugin registry's ``trace_formats``; default: the built-in Mooncake formats). Trace
    rows are read lazily during replay, so a malformed row raises :class:`WorkloadError`
    (located ``file:line``) when it is reached; call :func:`validate_trace` first for an
    upfront check.
    """
    parsed = load_workload(spec, formats=None if formats is None else tuple(formats))
    source, stop = parsed.source, parsed.stop
    plan = _plan(parsed)
    units: Callable[[], Iterator[Session]]
    on_close: Callable[[], None] | None = None
    if isinstance(source, SyntheticSource):
        rows = _length_rows(source, ("input_tokens", "output_tokens"), base_dir)
        units = lambda: synthetic_requests(source, rows)  # noqa: E731
    elif isinstance(source, SessionSource):
        load = parsed.load
        seed = load.arrival_seed if isinstance(load, RateLoad) else DEFAULT_POISSON_SEED
        seed = seed if source.seed is None else source.seed
        rows = _length_rows(source, ("new_input_tokens_per_turn", "output_tokens_per_turn"),
                            base_dir)
        units = lambda: synthetic_sessions(source, seed, rows)  # noqa: E731
    else:
        units, on_close = _trace_units(source, parsed, base_dir, formats)
    return SessionWorkload(units, plan, max_sessions=stop.sessions, max_requests=stop.requests,
                           max_time_ms=stop.max_time_ms, on_close=on_close)


def _length_rows(source: SyntheticSource | SessionSource, keys: tuple[str, str],
                 base_dir: Path | None) -> Callable[[LengthDistribution, str], array[int]]:
    """The lengths of each empirical file (``input`` or ``output``), read now: a missing
    or bad file fails before the replay starts."""
    table: dict[str, array[int]] = {}
    for key, name in zip(keys, ("input", "output"), strict=True):
        d = getattr(source, key)
        if isinstance(d, LengthDistribution) and d.path is not None:
            path = str(resolve_trace_path(d.path, base_dir))
            table[name] = read_rows(attrs.evolve(d, path=path), name, ("traffic", "source", key))
    return lambda _d, name: table[name]


def _trace_units(
    source: TraceSource, spec: WorkloadSpec, base_dir: Path | None,
    formats: Mapping[str, TraceLoader] | None,
) -> tuple[Callable[[], Iterator[Session]], Callable[[], None]]:
    path = resolve_trace_path(source.path, base_dir)
    unreadable = unreadable_trace(path, source.path)
    if unreadable:
        raise WorkloadError([unreadable])
    load = spec.load
    timestamps = isinstance(load, TimestampLoad)
    loader = (BUILTIN_FORMATS if formats is None else formats)[source.format]
    reader = loader(TraceFile(path=path, name=source.path, format=source.format,
                              block_size=source.block_size, use_timestamps=timestamps,
                              speedup=load.speedup if isinstance(load, TimestampLoad) else 1.0,
                              max_requests=spec.stop.requests))
    return reader.sessions, reader.close
