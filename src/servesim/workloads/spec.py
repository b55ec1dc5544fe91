"""The workload of a payload: the traffic a replay drives, every default applied.

The compiler's resolve pass builds a :class:`WorkloadSpec` from the config's ``traffic``
table, the payload carries it, and an engine reads it back with the strict converter
(:mod:`servesim.converter`), as it reads every other part of a payload. The JSON shape is
the config's, flattened: ``source``, ``load`` and ``stop`` tables, the first two tagged by
``type`` (the session keys ``turns``, ``shared_prefix_ratio``... sit beside ``type``).

The defaults below are the ``traffic`` table's: the resolve pass takes them from here.
A workload written by hand (bypassing the compiler) is held to the config's bounds and
rules by :func:`check_workload`; each problem is located at the ``traffic.*`` key that
carries the value. The rules between values are the compiler's own
(:mod:`servesim.traffic_rules`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from servesim import codes
from servesim import limits as L
from servesim.errors import Diagnostic, Path, WorkloadError
from servesim.limits import bounded
from servesim.traffic_rules import check_traffic
from servesim.workloads.lengths import LengthDistribution

Length = int | LengthDistribution  # a fixed length, or one drawn per request

TRACE_FORMATS = ("mooncake", "mooncake-delta")
DEFAULT_POISSON_SEED = 42
MAX_CV = 100.0  # burstiness of gamma arrivals: gap shape 1 / cv^2 stays above 1e-4
TRAFFIC: Path = ("traffic",)  # where a payload's workload lives in a config


@attrs.frozen
class SyntheticSource:
    type: Literal["synthetic"] = "synthetic"
    input_tokens: Length = bounded(1, L.TOKENS, default=1024)
    output_tokens: Length = bounded(0, L.TOKENS, default=128)
    # request i generates output_tokens x (1 + ratio x (2 u_i - 1)) tokens (at least one),
    # u_i a fixed low-discrepancy sequence over [0, 1): lengths spread evenly over the range,
    # the same in every replay, with mean output_tokens (None: written only when authored)
    output_range_ratio: float | None = bounded(0.0, 1.0)
    cached_prefix_tokens: int = bounded(0, L.TOKENS, default=0)
    # seeds the drawn lengths (None: written only with a distribution or traffic.seed)
    seed: int | None = bounded(0, L.U64_MAX)


@attrs.frozen
class SessionSource:
    type: Literal["synthetic-session"] = "synthetic-session"
    new_input_tokens_per_turn: Length = bounded(1, L.TOKENS, default=1024)
    output_tokens_per_turn: Length = bounded(0, L.TOKENS, default=128)
    turns: int = bounded(1, 10_000, default=4)
    shared_prefix_ratio: float = bounded(0.0, 1.0, default=0.0)
    prefix_groups: int = bounded(0, L.COUNT, default=0)
    inter_turn_delay_ms: float = bounded(0.0, L.LATENCY_MS, default=0.0)
    # Granularity of the shared prefix: ``round(blocks * ratio)`` blocks of this size.
    # ``None`` shares ``round(tokens * ratio)`` tokens (block size 1).
    block_size: int | None = bounded(1, L.BLOCK_SIZE)
    # seeds the drawn lengths and the prefix groups (None: the load's seed, as before)
    seed: int | None = bounded(0, L.U64_MAX)


@attrs.frozen
class TraceSource:
    type: Literal["trace"] = "trace"
    path: str = attrs.field(kw_only=True)
    format: str = "mooncake"  # a registered trace format
    block_size: int = bounded(1, L.BLOCK_SIZE, default=512)


Source = SyntheticSource | SessionSource | TraceSource


@attrs.frozen
class ConcurrencyLoad:
    """Closed loop: ``concurrency`` units (requests or sessions) in flight."""

    type: Literal["concurrency"] = "concurrency"
    concurrency: int = bounded(1, L.CONCURRENCY, default=10)


@attrs.frozen
class RateLoad:
    """Open loop: ``poisson``, ``gamma`` or ``constant_rate`` arrivals of requests or
    sessions (the rate key names the unit, as the source type requires). ``gamma`` gaps
    have the mean ``1 / rate`` and the coefficient of variation ``cv`` (1: poisson)."""

    type: Literal["poisson", "constant_rate", "gamma"]
    requests_per_second: float | None = bounded(0.0, 1e7, lo_open=True)
    sessions_per_second: float | None = bounded(0.0, 1e7, lo_open=True)
    seed: int | None = bounded(0, L.U64_MAX)  # poisson, gamma (None: DEFAULT_POISSON_SEED)
    cv: float | None = bounded(0.0, MAX_CV, lo_open=True)  # gamma

    @property
    def rate(self) -> float:
        return self.requests_per_second or self.sessions_per_second or 0.0

    @property
    def arrival_seed(self) -> int:
        return DEFAULT_POISSON_SEED if self.seed is None else self.seed


@attrs.frozen
class TimestampLoad:
    """Open loop at the trace's own timestamps, divided by ``speedup``."""

    type: Literal["trace_timestamps"] = "trace_timestamps"
    speedup: float = bounded(0.0, 1e6, lo_open=True, default=1.0)


Load = ConcurrencyLoad | RateLoad | TimestampLoad


@attrs.frozen
class Stop:
    """The first of these ends the replay (a trace also ends with its last row)."""

    requests: int | None = bounded(1, L.COUNT)
    sessions: int | None = bounded(1, L.COUNT)
    max_virtual_time_seconds: float | None = bounded(0.0, 1e9, lo_open=True)

    @property
    def max_time_ms(self) -> float | None:
        s = self.max_virtual_time_seconds
        return None if s is None else 1000.0 * s


@attrs.frozen
class WorkloadSpec:
    source: Source = attrs.field(factory=SyntheticSource)
    load: Load = attrs.field(factory=ConcurrencyLoad)
    stop: Stop = attrs.field(factory=Stop)


def default_of(cls: type, name: str) -> Any:
    """The default of a workload field (the resolve pass's, too: one set of defaults)."""
    return attrs.fields_dict(cls)[name].default


def workload_to_data(spec: WorkloadSpec) -> dict[str, Any]:
    """The JSON form: ``None`` fields dropped (an unauthored ratio, a trace's missing stop)."""
    from servesim.payload import drop_none

    return {section: drop_none(attrs.asdict(getattr(spec, section)))
            for section in ("source", "load", "stop")}


def check_workload(spec: WorkloadSpec, formats: tuple[str, ...] = TRACE_FORMATS
                   ) -> list[Diagnostic]:
    """Every problem of a typed workload: bounds, the traffic rules, a trace format no
    reader knows, a synthetic workload that never stops."""
    from servesim.converter import check_limits

    out = check_limits(spec, TRAFFIC)
    data = workload_to_data(spec)
    out += check_traffic(data["source"], data["load"])
    source, stop = spec.source, spec.stop
    if isinstance(source, TraceSource) and source.format not in formats:
        out.append(_problem(("source", "format"),
                            f"trace format {source.format!r} is not supported",
                            f"use one of: {', '.join(sorted(formats))}"))
    if not isinstance(source, TraceSource) and stop == Stop():
        out.append(_problem(("stop",), "a synthetic workload needs a stop condition",
                            "set stop.requests (synthetic) or stop.sessions "
                            "(synthetic-session)"))
    return out


def _problem(path: Path, message: str, hint: str) -> Diagnostic:
    return Diagnostic(code=codes.BAD_WORKLOAD, message=message, path=(*TRAFFIC, *path), hint=hint)


def located(diags: list[Diagnostic]) -> list[Diagnostic]:
    """Structure problems of a payload's ``workload`` located at the config's ``traffic``."""
    return [attrs.evolve(d, path=(*TRAFFIC, *d.path[1:]))
            if d.path[:1] == ("workload",) and len(d.path) > 1 else d for d in diags]


def load_workload(data: WorkloadSpec | Mapping[str, Any], *,
                  formats: tuple[str, ...] | None = None) -> WorkloadSpec:
    """A checked workload from a typed one or its JSON form; raise :class:`WorkloadError`
    naming every problem. ``formats`` are the known trace formats (default: built-in)."""
    if not isinstance(data, WorkloadSpec):
        from servesim.converter import make_converter, structure

        spec, diags = structure(make_converter(), dict(data) if isinstance(data, Mapping)
                                else data, WorkloadSpec, TRAFFIC)
        if spec is None:
            raise WorkloadError(diags)
        data = spec
    diags = check_workload(data, TRACE_FORMATS if formats is None else formats)
    if diags:
        raise WorkloadError(diags)
    return data
