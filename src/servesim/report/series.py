"""A replay's time series and distributions from its per-request records, in time and
memory linear in the records (a million-request replay included): output tokens/s, queued
and running requests, and the tokens the running requests hold in KV cache, each sampled
at ``buckets`` evenly spaced virtual times; and histograms of TTFT and ITL.

Between a request's first and last token its output tokens are spread evenly (records
hold those two times, not each token's); a request holds its prompt's tokens from its
first admission to its end, and its output tokens as they are produced.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.sweep.metrics import finite


@attrs.frozen
class Span:
    """What the series need of one request record (times in ms)."""

    arrival: float
    admit: float  # first admission; the end for a request never admitted
    first: float | None  # first token; None without one
    last: float
    end: float
    prompt: int
    output: int
    ttft: float | None
    tpot: float | None  # the request's mean token gap

    @classmethod
    def of(cls, r: Mapping[str, Any]) -> Span:
        end = finite(r.get("terminal_time_ms")) or 0.0
        first = finite(r.get("first_token_ms"))
        admit = finite(r.get("first_admit_ms"))
        return cls(arrival=finite(r.get("arrival_time_ms")) or 0.0,
                   admit=end if admit is None else admit, first=first,
                   last=finite(r.get("last_token_ms")) or (first or end), end=end,
                   prompt=int(r.get("input_length") or 0),
                   output=int(r.get("output_length") or 0) if first is not None else 0,
                   ttft=finite(r.get("ttft_ms")),
                   tpot=finite(r.get("tpot_ms", r.get("itl_ms"))))  # itl_ms: earlier name


def read_spans(path: str) -> list[Span]:
    """The spans of a ``--requests-out`` file, read line by line."""
    out = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    record = json.loads(line)
                    if not isinstance(record, dict) or "arrival_time_ms" not in record:
                        raise ValueError(f"line {n} is not a request record")
                    out.append(Span.of(record))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ServesimError([Diagnostic(
            code=codes.RESULTS_FILE, location=path, message=f"cannot read request records: {exc}",
            hint="give the --requests-out file of `servesim replay`")]) from None
    return out


@attrs.frozen
class Series:
    seconds: list[float]
    output_tok_s: list[float]
    queued: list[int]
    running: list[int]
    kv_tokens: list[float]


def series(spans: list[Span], buckets: int = 200) -> Series:
    end = max((s.end for s in spans), default=0.0)
    step = max(end / buckets, 1e-3)
    times = [i * step for i in range(int(end / step) + 1)]
    n = len(times)

    def count(starts: Iterable[float], stops: Iterable[float]) -> list[int]:
        a, b = sorted(starts), sorted(stops)
        return [bisect.bisect_right(a, t) - bisect.bisect_right(b, t) for t in times]

    queued = count((s.arrival for s in spans), (max(s.admit, s.arrival) for s in spans))
    running = count((s.admit for s in spans if s.first is not None),
                    (max(s.end, s.admit) for s in spans if s.first is not None))
    # linear pieces a + b*t over [start, stop) as difference arrays over the sample indices
    rate, kv_a, kv_b = [0.0] * (n + 1), [0.0] * (n + 1), [0.0] * (n + 1)

    def add(diff: list[float], start: float, stop: float, value: float) -> None:
        i, j = math.ceil(start / step), math.ceil(stop / step)  # samples with start <= t < stop
        if i < j:
            diff[min(i, n)] += value
            diff[min(j, n)] -= value

    for s in spans:
        if s.first is None:
            continue
        add(kv_a, s.admit, s.end, s.prompt)
        if s.last > s.first:
            per_ms = s.output / (s.last - s.first)
            add(rate, s.first, s.last, per_ms * 1000.0)
            add(kv_b, s.first, s.last, per_ms)
            add(kv_a, s.first, s.last, -per_ms * s.first)
        add(kv_a, s.last, s.end, s.output)
    tok_s, kv, r, a, b = [], [], 0.0, 0.0, 0.0
    for i, t in enumerate(times):
        r, a, b = r + rate[i], a + kv_a[i], b + kv_b[i]
        tok_s.append(r)
        kv.append(a + b * t)
    return Series([t / 1000.0 for t in times], tok_s, queued, running, kv)


def histogram(values: list[float], bins: int = 60) -> tuple[list[float], list[int], float]:
    """Bin centres, counts and the bin width of ``values`` (equal bins from min to max)."""
    if not values:
        return [], [], 0.0
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    return [lo + (i + 0.5) * width for i in range(bins)], counts, width
