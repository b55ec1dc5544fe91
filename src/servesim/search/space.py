"""A search space file (TOML): what a search varies, optimises and must meet.

```toml
objectives = ["goodput_rps_per_gpu"]            # one: TPE; several: NSGA-II, a Pareto front
constraints = ["ttft_ms.p99 <= 1000", "tpot_ms.p99 <= 50"]
trials = 40                                     # optional (--trials)
seed = 0                                        # optional (--seed)

[parameters]                                    # config keys: a list of choices, or a range
"engine.hardware" = ["h100_sxm", "h200_sxm"]
"engine.workers.aggregated.parallelism.tensor" = [1, 2, 4, 8]
"engine.workers.aggregated.parallelism.replicas" = { low = 1, high = 4 }

[load]                                          # optional: the largest load meeting the SLA
key = "traffic.load.requests_per_second"
low = 0.5
high = 64
tolerance = 0.05                                # relative
```
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeGuard

import attrs

from servesim import codes
from servesim.compiler.overrides import format_key, parse_key
from servesim.compiler.source import SourceText, load_toml
from servesim.errors import CompileError, Diagnostic
from servesim.search.goals import (
    Constraint,
    LoadSearch,
    Objective,
    parse_constraint,
    parse_objective,
)
from servesim.sweep.metrics import DERIVED, STATS, column_name

SAMPLERS = ("auto", "tpe", "nsga2", "random", "grid")
MAX_TRIALS = 100_000
# every metric a row has: the report's, the derived ones, the load search's
LATENCIES = ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "ttst_ms",
             "output_token_throughput_per_user")
SCALARS = ("output_throughput", "input_throughput", "total_token_throughput",
           "request_throughput", "request_goodput", "goodput_output_throughput_tok_s",
           "good_request_count", "sla_targets_missed", "completed", "failed",
           "rejected_requests",
           "incomplete_requests", "gpu_hours", "duration", "duration_ms",
           "prefix_cache_reused_ratio", "max_load", "max_load_per_gpu")
METRICS = frozenset((*DERIVED, *SCALARS, *(f"{s}_{m}" for s in STATS for m in LATENCIES)))


@attrs.frozen
class Parameter:
    key: tuple[str, ...]
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    log: bool = False
    integer: bool = False

    @property
    def name(self) -> str:
        return format_key(self.key)


@attrs.frozen
class Space:
    parameters: tuple[Parameter, ...]
    objectives: tuple[Objective, ...]
    constraints: tuple[Constraint, ...]
    load: LoadSearch | None = None
    trials: int = 32
    seed: int = 0
    sampler: str = "auto"


class _Errors:
    def __init__(self, name: str) -> None:
        self.name, self.diags = name, list[Diagnostic]()

    def add(self, where: str, message: str, hint: str | None = None) -> None:
        self.diags.append(Diagnostic(code=codes.BAD_SPACE, location=f"{self.name}: {where}",
                                     message=message, hint=hint))


def load_space(path: str, objectives: list[str], constraints: list[str]) -> Space:
    """The space in ``path``; ``objectives`` (if any) replace the file's, ``constraints``
    are added to its own. Every problem is reported at once."""
    source = SourceText.from_path(path)
    errors = _Errors(Path(path).name)
    if not source.text.strip():
        errors.add("parameters", "the space file is empty", "give a [parameters] table")
        raise CompileError(errors.diags)
    data = load_toml(source)
    known = {"parameters", "objectives", "objective", "constraints", "load", "trials", "seed",
             "sampler"}
    for key in sorted(set(data) - known):
        errors.add(key, f"unknown key {key!r}", f"allowed: {', '.join(sorted(known))}")
    params = list(_parameters(data.get("parameters"), errors))
    objective_texts = objectives or _texts(data, "objectives", errors) \
        or _texts(data, "objective", errors) or ["goodput_rps_per_gpu"]
    goals = tuple(parse_objective(t) for t in objective_texts)
    for goal in goals:
        _check_metric(goal.metric, "objectives", errors)
    conds = []
    for text in [*_texts(data, "constraints", errors), *constraints]:
        cond = parse_constraint(text)
        if cond is None:
            errors.add("constraints", f"{text!r} is not a constraint",
                       'write METRIC <= NUMBER, e.g. "ttft_ms.p99 <= 1000"')
        else:
            _check_metric(cond.metric, "constraints", errors)
            conds.append(cond)
    load = _load(data.get("load"), errors)
    trials = _int(data, "trials", 32, 1, MAX_TRIALS, errors)
    seed = _int(data, "seed", 0, 0, 2**32 - 1, errors)
    sampler = data.get("sampler", "auto")
    if sampler not in SAMPLERS:
        errors.add("sampler", f"unknown sampler {sampler!r}", f"one of: {', '.join(SAMPLERS)}")
    if sampler == "grid":
        trials = _grid_trials(params, trials if "trials" in data else None, errors)
    if load is not None and not conds:
        errors.add("load", "a load search needs constraints: the load is raised until a "
                   "replay breaks one", 'add e.g. constraints = ["ttft_ms.p99 <= 1000"]')
    if errors.diags:
        raise CompileError(errors.diags)
    return Space(tuple(params), goals, tuple(conds), load, trials, seed, sampler)


def grid_size(params: list[Parameter] | tuple[Parameter, ...]) -> int:
    size = 1
    for p in params:
        size *= len(p.choices)
    return size


def _grid_trials(params: list[Parameter], trials: int | None, errors: _Errors) -> int:
    """A grid search tries every combination once (at most ``trials``)."""
    ranged = [p.name for p in params if not p.choices]
    if ranged:
        errors.add(f"parameters.{ranged[0]}", "the grid sampler takes lists of choices only",
                   "list the values to try, or use another sampler")
    size = grid_size(params)
    return min(size, trials) if trials is not None else max(1, min(size, MAX_TRIALS))


def _check_metric(metric: str, where: str, errors: _Errors) -> None:
    if column_name(metric) not in METRICS:
        errors.add(where, f"unknown metric {metric!r}",
                   "a report metric (ttft_ms.p99, output_throughput) or a derived one ("
                   + ", ".join(DERIVED) + ", max_load, max_load_per_gpu)")


def _texts(data: dict[str, Any], key: str, errors: _Errors) -> list[str]:
    value = data.get(key)
    if value is None:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(v, str) for v in items):
        errors.add(key, "expected a string or a list of strings")
        return []
    return list(items)


def _int(data: dict[str, Any], key: str, default: int, lo: int, hi: int,
         errors: _Errors) -> int:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        errors.add(key, f"expected an integer from {lo} to {hi}, got {value!r}")
        return default
    return value


def _parameters(table: Any, errors: _Errors) -> Iterator[Parameter]:
    if not isinstance(table, dict) or not table:
        errors.add("parameters", "the space needs a [parameters] table of config keys to vary",
                   '"engine.workers.aggregated.parallelism.tensor" = [1, 2, 4, 8]')
        return
    yield from _flatten(table, (), errors)


def _flatten(table: dict[str, Any], prefix: tuple[str, ...],
             errors: _Errors) -> Iterator[Parameter]:
    for raw, value in table.items():
        try:
            key = (*prefix, *parse_key(raw, raw))
        except CompileError:
            errors.add(f"parameters.{raw}", "not a dotted config key")
            continue
        where = f"parameters.{format_key(key)}"
        if isinstance(value, list):
            if not value:
                errors.add(where, "an empty list of choices")
            elif len({repr(v) for v in value}) < len(value):
                errors.add(where, "a choice is listed twice")
            else:
                yield Parameter(key, choices=tuple(value))
        elif isinstance(value, dict) and ("low" in value or "high" in value):
            param = _range(key, value, where, errors)
            if param is not None:
                yield param
        elif isinstance(value, dict):
            yield from _flatten(value, key, errors)
        else:
            errors.add(where, f"expected a list of choices or {{ low = .., high = .. }}, got "
                       f"{value!r}")


def _number(value: Any) -> TypeGuard[float]:
    return not isinstance(value, bool) and isinstance(value, (int, float)) \
        and math.isfinite(value)


def _range(key: tuple[str, ...], value: dict[str, Any], where: str,
           errors: _Errors) -> Parameter | None:
    low, high, log = value.get("low"), value.get("high"), value.get("log", False)
    extra = set(value) - {"low", "high", "log"}
    if extra:
        errors.add(where, f"unknown key {sorted(extra)[0]!r}", "a range has low, high and log")
    if not (_number(low) and _number(high)) or low > high or not isinstance(log, bool) \
            or (log and low <= 0):
        errors.add(where, f"expected finite numbers low <= high (> 0 with log), got "
                   f"low={low!r}, high={high!r}, log={log!r}")
        return None
    integer = isinstance(low, int) and isinstance(high, int)
    return Parameter(key, low=low, high=high, log=log, integer=integer)


def _load(table: Any, errors: _Errors) -> LoadSearch | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        errors.add("load", "expected a table with key, low, high (and tolerance)")
        return None
    extra = set(table) - {"key", "low", "high", "tolerance"}
    if extra:
        errors.add(f"load.{sorted(extra)[0]}", "unknown key", "allowed: key, low, high, "
                   "tolerance")
    key, low, high = table.get("key"), table.get("low"), table.get("high")
    tolerance = table.get("tolerance", 0.05)
    if not isinstance(key, str):
        errors.add("load.key", "expected the config key of the load, e.g. "
                   '"traffic.load.requests_per_second"')
        return None
    if not (_number(low) and _number(high)) or not 0 < low < high:
        errors.add("load", f"expected numbers 0 < low < high, got low={low!r}, high={high!r}")
        return None
    if not _number(tolerance) or not 0.001 <= tolerance <= 1:
        errors.add("load.tolerance", f"expected a relative tolerance from 0.001 to 1, got "
                   f"{tolerance!r}")
        return None
    try:
        parts = parse_key(key, key)
    except CompileError:
        errors.add("load.key", f"{key!r} is not a dotted config key")
        return None
    return LoadSearch(parts, float(low), float(high), float(tolerance),
                      integer=isinstance(low, int) and isinstance(high, int))
