"""Length distributions of synthetic prompts and outputs: the table, its rules, its sampler.

A synthetic source's length key (``input_tokens``, ``output_tokens``, and a session's
``new_input_tokens_per_turn``, ``output_tokens_per_turn``) is an integer (every request
the same) or a table drawing each request's length::

    input_tokens = { distribution = "lognormal", mean = 2000, std = 800 }

- ``uniform``: integers spread evenly over ``[min, max]``, or over ``mean x (1 -/+
  range_ratio)`` (a benchmark client's ``--random-range-ratio``);
- ``normal``: ``mean`` and ``std``, rounded;
- ``lognormal``: the ``mean`` and ``std`` of the lengths (what a trace's statistics
  show), or ``mu`` and ``sigma`` of their logarithm (numpy's and scipy's parameters);
- ``empirical``: a length drawn from the rows of a file (``path``, relative to the
  config): a Mooncake JSONL trace (its rows' ``input_length`` or ``output_length``) or a
  CSV file with a header (the ``column`` named, by default ``input_length`` or
  ``output_length``, or the only column). Input and output drawn from the same file come
  from the same row.

Every draw is clipped to ``[min, max]`` (default ``[1, 2^24]``) and comes from a
:class:`random.Random` seeded by ``traffic.seed``: the same seed gives the same lengths.
"""

from __future__ import annotations

import csv
import io
import math
import random
from array import array
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path as FilePath
from typing import Any, Literal

import attrs

from servesim import codes
from servesim import limits as L
from servesim.errors import Diagnostic, Path, WorkloadError, format_path
from servesim.limits import bounded

Distribution = Literal["uniform", "normal", "lognormal", "empirical"]
EmpiricalFormat = Literal["mooncake", "csv"]
MAX_ROWS = 2**24  # lengths an empirical file may hold (4 bytes each in memory)
MAX_CSV_BYTES = 256 * 1024 * 1024
LOG_MAX = math.log(L.TOKENS)

# the keys each distribution reads, beside ``distribution``
ACCEPTS: dict[str, frozenset[str]] = {
    "uniform": frozenset({"min", "max", "mean", "range_ratio"}),
    "normal": frozenset({"mean", "std", "min", "max"}),
    "lognormal": frozenset({"mean", "std", "mu", "sigma", "min", "max"}),
    "empirical": frozenset({"path", "format", "column", "min", "max"}),
}


def _help(text: str, *examples: Any) -> dict[str, Any]:
    return {"help": text, "examples": list(examples)}


@attrs.frozen
class LengthDistribution:
    """Token lengths drawn per request: uniform, normal, lognormal or empirical."""

    distribution: Distribution = attrs.field(metadata=_help(
        "uniform (min and max, or mean and range_ratio), normal (mean, std), lognormal "
        "(mean and std of the lengths, or mu and sigma), empirical (path)", "lognormal"))
    mean: float | None = bounded(0.0, L.TOKENS, lo_open=True, metadata=_help(
        "mean length in tokens", 2000))
    std: float | None = bounded(0.0, L.TOKENS, metadata=_help(
        "standard deviation of the lengths in tokens", 800))
    range_ratio: float | None = bounded(0.0, 1.0, metadata=_help(
        "uniform: lengths over mean x (1 -/+ range_ratio)", 0.2))
    mu: float | None = bounded(0.0, LOG_MAX, metadata=_help(
        "lognormal: mean of the lengths' natural logarithm (the median is e^mu)", 7.5))
    sigma: float | None = bounded(0.0, 10.0, metadata=_help(
        "lognormal: standard deviation of the lengths' natural logarithm", 0.6))
    min: int | None = bounded(1, L.TOKENS, metadata=_help(
        "shortest length: draws below are raised to it (default 1)", 16))
    max: int | None = bounded(1, L.TOKENS, metadata=_help(
        "longest length: draws above are lowered to it (default 2^24)", 16384))
    path: str | None = attrs.field(default=None, metadata=_help(
        "empirical: a Mooncake JSONL trace or a CSV file, relative to the config",
        "traces/lengths.csv"))
    format: EmpiricalFormat | None = attrs.field(default=None, metadata=_help(
        "empirical: mooncake or csv (default: csv for a .csv file, else mooncake)", "csv"))
    column: str | None = attrs.field(default=None, metadata=_help(
        "empirical csv: the column of lengths (default input_length or output_length, or "
        "the only column)", "output_length"))


def empirical_format(path: str) -> EmpiricalFormat:
    """The format of an empirical file that names none: by its suffix."""
    return "csv" if path.lower().endswith(".csv") else "mooncake"


def _d(path: Path, message: str, hint: str | None = None) -> Diagnostic:
    return Diagnostic(code=codes.TRAFFIC_LENGTH, message=message, path=path, hint=hint)


def check_lengths(dist: Mapping[str, Any], path: Path) -> Iterator[Diagnostic]:
    """The rules of one length table (in its JSON form), located under ``path``."""
    kind = dist.get("distribution")
    if kind not in ACCEPTS:
        return  # the type check reports it
    given = {k for k, v in dist.items() if v is not None and k != "distribution"}
    for key in sorted(given - ACCEPTS[kind]):
        yield _d((*path, key), f"distribution {kind!r} does not accept {key}",
                 f"it reads: {', '.join(sorted(ACCEPTS[kind]))}")
    yield from _required(kind, given, path)
    lo, hi = dist.get("min"), dist.get("max")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        yield _d((*path, "min"), f"min ({lo}) must be <= max ({hi})")


def _required(kind: str, given: set[str], path: Path) -> Iterator[Diagnostic]:
    """The parameters each distribution needs, in one of its forms."""
    forms = {"uniform": (("min", "max"), ("mean", "range_ratio")),
             "normal": (("mean", "std"),),
             "lognormal": (("mean", "std"), ("mu", "sigma")),
             "empirical": (("path",),)}[kind]
    named = [f for f in forms if given & set(f)]
    if len(named) > 1:
        yield _d(path, f"{kind}: give {' and '.join(forms[0])}, or "
                 f"{' and '.join(forms[1])}, not both")
        return
    form = named[0] if named else forms[0]
    for key in form:
        if key not in given:
            others = [k for k in form if k in given]
            why = f"{others[0]} requires {key}" if others else f"{kind} requires {key}"
            yield _d((*path, key), why, _example(kind, form))


def _example(kind: str, form: tuple[str, ...]) -> str:
    sample = {"min": "100", "max": "300", "mean": "2000", "std": "800", "range_ratio": "0.5",
              "mu": "7.5", "sigma": "0.4", "path": '"lengths.csv"'}
    return ("write { distribution = \"" + kind + "\", "
            + ", ".join(f"{k} = {sample[k]}" for k in form) + " }")


def lower_bound(value: int | LengthDistribution) -> int:
    """The shortest length a fixed length or a distribution gives."""
    if isinstance(value, int):
        return value
    if value.distribution == "uniform":
        return _uniform_bounds(value)[0]
    return value.min or 1


def _uniform_bounds(d: LengthDistribution) -> tuple[int, int]:
    if d.mean is not None:
        r = d.range_ratio or 0.0
        lo = max(1, _round(d.mean * (1 - r)))
        return lo, max(lo, min(L.TOKENS, _round(d.mean * (1 + r))))
    return d.min or 1, d.max or L.TOKENS


def _round(x: float) -> int:
    return math.floor(x + 0.5)


Sampler = Callable[[], int]


def make_sampler(value: int | LengthDistribution, seed: int, name: str,
                 rows: Callable[[LengthDistribution, str], array[int]]) -> Sampler:
    """A function drawing the next length of the stream ``name`` (``input``, ``output``):
    a fixed length, or draws from a :class:`random.Random` seeded by ``seed`` and
    ``name`` (an empirical file's rows by ``rows``, seeded by the file)."""
    if isinstance(value, int):
        return lambda: value
    d = value
    lo, hi = d.min or 1, d.max or L.TOKENS
    if d.distribution == "empirical":
        assert d.path is not None
        table = rows(d, name)
        pick = random.Random(f"{seed}:rows:{d.path}")  # one row for input and output
        return lambda: min(max(table[pick.randrange(len(table))], lo), hi)
    rng = random.Random(f"{seed}:{name}-length")
    if d.distribution == "uniform":
        a, b = _uniform_bounds(d)
        return lambda: rng.randint(a, b)
    draw = _continuous(d, rng)
    return lambda: _round(min(max(draw(), lo), hi))


def _continuous(d: LengthDistribution, rng: random.Random) -> Callable[[], float]:
    if d.distribution == "normal":
        mean, std = d.mean or 0.0, d.std or 0.0
        return lambda: rng.gauss(mean, std)
    if d.mean is not None:
        mean, std = d.mean, d.std or 0.0
        s2 = math.log1p((std / mean) ** 2)
        mu, sigma = math.log(mean) - s2 / 2, math.sqrt(s2)
    else:
        mu, sigma = d.mu or 0.0, d.sigma or 0.0
    return lambda: rng.lognormvariate(mu, sigma)


# -- empirical files ---------------------------------------------------------------------


def read_rows(d: LengthDistribution, name: str, where: Path) -> array[int]:
    """The lengths of an empirical file: a Mooncake trace's rows or a CSV column (its
    first :data:`MAX_ROWS`).

    Raise :class:`WorkloadError` at ``where`` (the table's config path) when the file is
    missing or holds no lengths, and at ``file:line`` for a bad row."""
    assert d.path is not None
    fmt = d.format or empirical_format(d.path)
    file = FilePath(d.path)
    out = (_mooncake(file, d.path, name, where) if fmt == "mooncake"
           else _csv(file, d, name, where))
    if not out:
        raise WorkloadError([_d((*where, "path"), f"{d.path} holds no lengths",
                                "give a file with at least one row")])
    return out


def _path_hint(where: Path) -> str:
    return f"check {format_path((*where, 'path'))} (relative to the config file)"


def _mooncake(file: FilePath, shown: str, name: str, where: Path) -> array[int]:
    from servesim.workloads.mooncake import iter_trace_rows, unreadable_trace

    problem = unreadable_trace(file, shown)
    if problem is not None:
        raise WorkloadError([attrs.evolve(problem, hint=_path_hint(where))])
    out = array("i")
    key = "input_length" if name == "input" else "output_length"
    for row in iter_trace_rows(file, shown, 512):
        out.append(getattr(row, key))
        if len(out) >= MAX_ROWS:
            break
    return out


def _csv(file: FilePath, d: LengthDistribution, name: str, where: Path) -> array[int]:
    from servesim.files import Unreadable, read_bounded

    shown = d.path or ""
    try:
        text = read_bounded(file, "a CSV file of lengths", MAX_CSV_BYTES).decode("utf-8-sig")
    except Unreadable as exc:
        raise WorkloadError([Diagnostic(code=exc.code, message=exc.message, location=shown,
                                        hint=_path_hint(where))]) from None
    except UnicodeDecodeError:
        raise WorkloadError([Diagnostic(code=codes.BAD_LENGTH_FILE, location=shown,
                                        message="not UTF-8 text")]) from None
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    out = array("i")
    if not header:
        return out  # an empty file: no lengths
    column = _column(header, d.column, name, shown, where)
    for row in reader:
        if not any(cell.strip() for cell in row):
            continue
        out.append(_cell(row, column, f"{shown}:{reader.line_num}"))
        if len(out) >= MAX_ROWS:
            break
    return out


def _column(header: list[str], column: str | None, name: str, shown: str, where: Path) -> int:
    want = column or f"{name}_length"
    if want in header:
        return header.index(want)
    if column is None and len(header) == 1:
        return 0
    raise WorkloadError([_d((*where, "column"), f"{shown} has no column {want!r} (header: "
                            f"{', '.join(header) or 'empty'})",
                            "set column to one of the header's names")])


def _cell(row: list[str], column: int, location: str) -> int:
    def bad(message: str) -> WorkloadError:
        return WorkloadError([Diagnostic(code=codes.BAD_LENGTH_FILE, location=location,
                                         message=message, hint="one length (a whole number "
                                         f"of tokens, 0 to {L.TOKENS}) per row")])

    if column >= len(row):
        raise bad(f"row has {len(row)} fields, the column is field {column + 1}")
    cell = row[column].strip()
    if not cell.isdigit():
        raise bad(f"expected a length, got {cell[:40]!r}")
    value = int(cell)
    if value > L.TOKENS:
        raise bad(f"length {value} is over {L.TOKENS} tokens")
    return value
