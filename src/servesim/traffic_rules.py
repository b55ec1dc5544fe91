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
RATE_LOADS = ("poisson", "constant_rate", "gamma")
LENGTH_KEYS = {"synthetic": ("input_tokens", "output_tokens"),
               "synthetic-session": ("new_input_tokens_per_turn", "output_tokens_per_turn")}
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
    """Length tables follow their rules; the cached prefix fits the shortest prompt; a
    shared session prefix has groups."""
    from servesim.workloads.lengths import check_lengths

    stype = source.get("type", "synthetic")
    for key in LENGTH_KEYS.get(stype, ()):
        if isinstance(source.get(key), Mapping):
            yield from check_lengths(source[key], (*SOURCE, key))
    cached: Any = source.get("cached_prefix_tokens")
    isl: Any = source.get("input_tokens", DEFAULT_INPUT_TOKENS)
    if stype == "synthetic" and _number(cached) and cached > 0 and isinstance(isl, Mapping):
        shortest = _shortest(isl)
        if shortest is not None and cached > shortest:
            yield error(codes.TRAFFIC_VALUE, (*SOURCE, "cached_prefix_tokens"),
                        f"cached_prefix_tokens must be <= the shortest prompt (input_tokens "
                        f"gives {shortest} tokens or more), got {cached}; raise input_tokens.min")
    if source.get("output_range_ratio") is not None and isinstance(
            source.get("output_tokens"), Mapping):
        yield error(codes.TRAFFIC_VALUE, (*SOURCE, "output_range_ratio"),
                    "output_range_ratio spreads a fixed output_tokens; with a distribution, "
                    "write output_tokens = { distribution = \"uniform\", mean = N, "
                    "range_ratio = R }")
    if stype == "synthetic" and _number(cached) and _number(isl) and cached > isl:
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
    if ltype == "gamma" and load.get("cv") is None:
        yield error(codes.TRAFFIC_LOAD, (*LOAD, "cv"), "gamma load requires cv, the coefficient of "
                    "variation of the gaps between arrivals (1: poisson; above 1: bursty)")


def _shortest(table: Mapping[str, Any]) -> int | None:
    """The shortest length a (well-typed) length table draws, or None."""
    from cattrs import BaseValidationError

    from servesim.converter import make_converter
    from servesim.workloads.lengths import LengthDistribution, lower_bound

    try:
        return lower_bound(make_converter().structure(dict(table), LengthDistribution))
    except BaseValidationError:  # a table of the wrong shape: the type check reports it
        return None
