"""Cross-field traffic rules over resolved workload values, shared by compiler and workloads.

The parse pass runs :func:`check_traffic` on the ``traffic`` table it has just typed
(absent keys take their defaults); :func:`servesim.workloads.spec.check_workload` runs it
on the workload dict of a payload (which may be written by hand, bypassing the compiler).
Either way a rule reads the same, located at the config key that carries the value, e.g.
``traffic.source.cached_prefix_tokens: cached_prefix_tokens must be <= input_tokens (1024),
got 1025 [traffic-value]``.

Both sides pass the workload in the payload's shape: ``source`` flat (the session keys
``shared_prefix_ratio`` and ``prefix_groups`` beside ``type``), ``load`` with the rate
under ``requests_per_second`` or ``sessions_per_second``. The rules need only the source
and load: which stop keys a config accepts is a rule of the config's shape (the parse
pass), and a payload may stop a trace after a count or a synthetic source after a time.

Values of the wrong type are not this module's business: a rule that cannot compare
them stays silent and the caller's type check reports them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from servesim import codes
from servesim.errors import Diagnostic, Path, error

SOURCE_TYPES = ("synthetic", "synthetic-session", "trace")
RATE_LOADS = ("poisson", "constant_rate")
DEFAULT_INPUT_TOKENS = 1024

SOURCE: Path = ("traffic", "source")
LOAD: Path = ("traffic", "load")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def rate_key(source_type: str) -> str:
    """The load key that carries the rate of an open loop over this source."""
    return "sessions_per_second" if source_type == "synthetic-session" else "requests_per_second"


def check_traffic(source: Mapping[str, Any], load: Mapping[str, Any]) -> list[Diagnostic]:
    """Every cross-field rule of the source and load; return all diagnostics."""
    return [*_source(source), *_load(source.get("type", "synthetic"), load)]


def _source(source: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """The cached prefix fits the prompt; a shared session prefix has groups."""
    cached: Any = source.get("cached_prefix_tokens")
    isl: Any = source.get("input_tokens", DEFAULT_INPUT_TOKENS)
    if (source.get("type", "synthetic") == "synthetic" and _number(cached) and _number(isl)
            and cached > isl):
        yield error(codes.TRAFFIC_VALUE, (*SOURCE, "cached_prefix_tokens"),
                    f"cached_prefix_tokens must be <= input_tokens ({isl}), got {cached}")
    ratio: Any = source.get("shared_prefix_ratio")
    groups: Any = source.get("prefix_groups")
    if _number(ratio) and ratio > 0 and not (_number(groups) and groups):
        yield error(codes.TRAFFIC_VALUE, (*SOURCE, "session", "prefix_groups"),
                    "shared_prefix_ratio > 0 requires prefix_groups > 0")


def _load(stype: Any, load: Mapping[str, Any]) -> Iterator[Diagnostic]:
    """The load fits the source: arrivals, rate unit, rate present."""
    if stype not in SOURCE_TYPES:
        return  # the caller reports the unknown source type
    ltype = load.get("type", "concurrency")
    if stype == "trace" and ltype in RATE_LOADS:
        yield error(codes.TRAFFIC_LOAD, (*LOAD, "type"),
                    "trace load must be trace_timestamps or concurrency")
    if stype != "trace" and ltype == "trace_timestamps":
        yield error(codes.TRAFFIC_LOAD, (*LOAD, "type"),
                    f"{stype} source rejects trace_timestamps load; use concurrency, poisson or "
                    "constant_rate")
    if ltype in RATE_LOADS:
        want = rate_key(stype)
        other = "requests_per_second" if want == "sessions_per_second" else "sessions_per_second"
        if load.get(other) is not None:
            yield error(codes.TRAFFIC_LOAD, (*LOAD, other),
                        f"rate unit does not match source type {stype!r}; use {want}")
        elif load.get(want) is None:
            yield error(codes.TRAFFIC_LOAD, (*LOAD, want), f"{ltype} load requires {want}")
