"""Serving metrics from request records: the flat report and per-request JSONL lines.

Population: only ``completed`` requests contribute to token counts, latency samples,
throughput and goodput; every record counts in ``num_requests``. Report keys follow
vLLM's ``vllm bench serve`` where it has the metric (``completed``, ``request_throughput``,
``output_throughput``, ``total_token_throughput``, ``request_goodput``, ``*_e2el_ms``)
and AIPerf's otherwise (``good_request_count``); :data:`DEPRECATED_NAMES` are the
earlier names, still written beside them for one release.

Gaps are counted between *emissions*, as vLLM's and AIPerf's benchmarks count streamed
chunks: the tokens a pass emits together (a speculative burst) share one time, and are
one emission, so ITL and TTST have no zero gaps; TPOT still divides by the tokens.

Memory per finished request is O(1): per-request latencies are ``array('d')`` samples
(8 bytes each), and ITL, one sample per emission gap, is kept as exact
``value -> count`` multiplicities (gaps repeat: a pass's duration is the gap of every
request in it), so its memory grows with the distinct gaps, not with the tokens. When a
record's tokens are consecutive entries of its worker's pass ends
(``RequestRecord.pass_ends``, the usual case), or a few runs of them (a preempted
request), its gaps are counted per pass of that worker in O(runs) (a difference array
over the passes), not token by token; that costs 8 bytes per pass of each worker, here
and in the worker's pass ends. A built-in engine's pass ends carry a *floor* (a
:class:`~servesim.engines.kernel.requests.PassEnds`): no request in flight or still to come
has a token at a pass ending before it, so once a worker has run :data:`_FOLD_PASSES`
passes the collector folds those passes into the multiset and drops them from both arrays;
a long replay holds the passes of its requests in flight, not of the whole run.

Distributions are reported as
``mean_/min_/max_/median_/p75_/p90_/p95_/p99_/p99.9_/std_<name>`` (``_ms`` suffix for
latencies). Percentile ``p`` is the sorted sample at rank ``round((count - 1) * p / 100)``
(halves round up); ``std`` is the population standard deviation; an empty distribution
reports zeros. Sums use ``math.fsum``, so the same
records always give the same floats, whatever order they were added in.
"""

from __future__ import annotations

import itertools
import json
import math
import operator
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from typing import IO, Any, Final

from mypy_extensions import mypyc_attr

from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.kernel.sla import RequestBounds, request_value, run_verdicts
from servesim.payload import SlaArgs
from servesim.sla import targets_of

PERCENTILES: tuple[tuple[str, float], ...] = (
    ("median", 50.0), ("p75", 75.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0),
    ("p99.9", 99.9),
)
STATS: tuple[str, ...] = ("mean", "min", "max", *(p for p, _ in PERCENTILES), "std")
LATENCIES: tuple[str, ...] = ("ttft", "ttst", "tpot", "itl", "e2el")
PER_USER = "output_token_throughput_per_user"
# The parts of a TTFT, in order (reported as ``ttft_<part>_ms``): see :func:`ttft_parts`.
TTFT_PARTS: tuple[str, ...] = ("prefill_queue", "prefill", "kv_transfer", "decode_queue",
                               "first_decode")
# Earlier report names -> today's; both are written until the next release.
DEPRECATED_NAMES: dict[str, str] = {
    "completed_requests": "completed",
    "request_throughput_rps": "request_throughput",
    "input_throughput_tok_s": "input_throughput",
    "output_throughput_tok_s": "output_throughput",
    "total_throughput_tok_s": "total_token_throughput",
    "goodput_request_throughput_rps": "request_goodput",
    "goodput_completed_requests": "good_request_count",
    "num_e2e_latency_samples": "num_e2el_samples",
    **{f"{stat}_e2e_latency_ms": f"{stat}_e2el_ms" for stat in STATS if stat != "p99.9"},
}
# Runs of consecutive passes a record's tokens may split into for its gaps to be counted
# per pass (a preempted request's few); more, and they are counted per token.
_MAX_RUNS = 8
# passes a worker's pass ends hold before the collector folds the settled ones
_FOLD_PASSES = 1 << 16


def percentile(sorted_samples: Iterable[float] | array, p: float) -> float:
    """Sample at rank ``round((count - 1) * p / 100)`` of already sorted samples."""
    values = sorted_samples if isinstance(sorted_samples, array | list) else list(sorted_samples)
    if not values:
        return 0.0
    rank = math.floor((len(values) - 1) * p / 100.0 + 0.5)
    return float(values[min(max(rank, 0), len(values) - 1)])


def distribution(samples: Iterable[float], name: str, unit: str = "_ms") -> dict[str, float]:
    """``mean_/min_/max_/median_/p75_/p90_/p95_/p99_/std_<name><unit>`` of ``samples``."""
    values = sorted(samples)
    n = len(values)
    out: dict[str, float] = {}
    if n == 0:
        for stat in STATS:
            out[f"{stat}_{name}{unit}"] = 0.0
        return out
    mean = math.fsum(values) / n
    out[f"mean_{name}{unit}"] = mean
    out[f"min_{name}{unit}"] = values[0]
    out[f"max_{name}{unit}"] = values[-1]
    for label, p in PERCENTILES:
        out[f"{label}_{name}{unit}"] = percentile(values, p)
    # C-level maps instead of a generator: ITL has one sample per output token
    deviations = list(map(operator.sub, values, itertools.repeat(mean, n)))
    out[f"std_{name}{unit}"] = math.sqrt(math.fsum(map(operator.mul, deviations, deviations)) / n)
    return out


def exact_sum(values: Iterable[float], counts: Iterable[int]) -> float:
    """``math.fsum`` of every value repeated ``count`` times, in O(distinct values).

    Both are the exact sum correctly rounded to a float. The usual way is
    :func:`_split_sum` (counts below ``2**26``, magnitudes within ``2**±900``). Else, with
    C-level integers: scaled by ``2**shift``, the smallest nonzero magnitude's unit in the
    last place times ``2**shift`` is at least 1, so every value becomes an exact integer,
    the integers times their counts sum exactly, and ``int / int`` rounds correctly.
    Magnitudes below
    ``2**-970`` or spread over more than about 970 binades, where the scale or the scaled
    largest would overflow a float, take each value's integer ratio instead.
    """
    values = values if isinstance(values, list) else list(values)
    counts = counts if isinstance(counts, list) else list(counts)
    if len(values) != len(counts):
        raise ValueError("exact_sum needs one count per value")
    split = _split_sum(values, counts)
    if split is not None:
        return split
    smallest = min(filter(None, map(abs, values)), default=0.0)
    if not smallest:
        return 0.0
    low = math.frexp(smallest)[1]  # ulp(value) >= 2**(low - 53) for every value
    high = math.frexp(max(map(abs, values)))[1]  # every magnitude < 2**high
    shift = max(53 - low, 0)
    if max(high, 0) + shift <= 1023:
        scaled = map(int, map(operator.mul, values, itertools.repeat(math.ldexp(1.0, shift))))
        return sum(map(operator.mul, scaled, counts)) / (1 << shift)
    num, exp = 0, 0  # the sum so far is num / 2**exp
    for value, count in zip(values, counts, strict=True):
        n, d = value.as_integer_ratio()
        e = d.bit_length() - 1
        if e > exp:
            num <<= e - exp
            exp = e
        num += (count * n) << (exp - e)
    return num / (1 << exp)


# Veltkamp's split: ``value * (2**27 + 1)`` cuts a double into two halves of at most 26
# significant bits each, exact in round-to-nearest while the product cannot overflow; a
# half times a count below 2**26 is then an exact double (while it stays normal).
_SPLITTER: Final = 134217729.0
_SPLIT_COUNT: Final = 1 << 26
# magnitudes in which halves and products stay normal: 900 binades either side of 1
# (``math.frexp`` exponents -900 .. 900)
_SPLIT_LOW: Final = 2.0 ** -901
_SPLIT_HIGH: Final = 2.0 ** 900
_INF: Final = float("inf")
# parts packed into the buffer at a time (a list of floats stores natively when compiled;
# a buffer item store parses its float as an argument)
_PACK_PARTS: Final = 4096
_PACK = struct.Struct(f"{_PACK_PARTS}d")


def _split_sum(values: list[float], counts: list[int], center: float | None = None
               ) -> float | None:
    """:func:`exact_sum` as ``math.fsum`` of exact products: each value split into two
    halves (:data:`_SPLITTER`), each half times its count. fsum rounds the exact sum of
    its inputs correctly, so this is the same float as the integer sum, without integers
    of a hundred bits and more. None where a count or a finite nonzero magnitude is out
    of the split's range (checked in the same loop). The parts go to a buffer of 16 bytes
    a value, not 64 as float objects in a list (a report may sum millions of distinct
    gaps), :data:`_PACK_PARTS` at a time. With ``center``, each value is first replaced
    by ``(value - center) ** 2`` (:func:`exact_square_sum`)."""
    n = len(values)
    squared = center is not None
    middle = 0.0 if center is None else center
    buffer = bytearray(16 * n)
    chunk: list[float] = []
    offset = 0
    for i in range(n):  # (by index: the compiled loop reads the lists unboxed)
        value = values[i]
        if squared:
            deviation = value - middle
            value = deviation * deviation
        count = counts[i]
        magnitude = value if value >= 0.0 else -value
        if count >= _SPLIT_COUNT or (0.0 < magnitude < _SPLIT_LOW) or (
                _SPLIT_HIGH <= magnitude < _INF):
            return None
        scaled = value * _SPLITTER
        high = scaled - (scaled - value)
        weight = float(count)
        chunk.append(high * weight)
        chunk.append((value - high) * weight)
        if len(chunk) == _PACK_PARTS:
            _PACK.pack_into(buffer, offset, *chunk)
            offset += 8 * _PACK_PARTS
            chunk.clear()
    if chunk:
        struct.pack_into(f"{len(chunk)}d", buffer, offset, *chunk)
    with memoryview(buffer) as raw, raw.cast("d") as parts:
        return math.fsum(parts)


def sorted_distribution(values: list[float], weights: list[int], name: str,
                        unit: str = "_ms") -> dict[str, float]:
    """:func:`distribution` of every ``values[i]`` repeated ``weights[i] > 0`` times,
    ``values`` in non-decreasing order; the same floats."""
    n = sum(weights)
    out: dict[str, float] = {}
    if n == 0:
        for stat in STATS:
            out[f"{stat}_{name}{unit}"] = 0.0
        return out
    mean = exact_sum(values, weights) / n
    out[f"mean_{name}{unit}"] = mean
    out[f"min_{name}{unit}"] = values[0]
    out[f"max_{name}{unit}"] = values[-1]
    cumulative = list(itertools.accumulate(weights))
    for label, p in PERCENTILES:
        rank = min(max(math.floor((n - 1) * p / 100.0 + 0.5), 0), n - 1)
        out[f"{label}_{name}{unit}"] = float(values[bisect_right(cumulative, rank)])
    out[f"std_{name}{unit}"] = math.sqrt(exact_square_sum(values, weights, mean) / n)
    return out


def exact_square_sum(values: list[float], counts: list[int], center: float) -> float:
    """:func:`exact_sum` of every ``(values[i] - center) ** 2`` (the float difference
    squared) repeated ``counts[i]`` times: the squares are made in the split's own loop,
    not listed first."""
    if len(values) != len(counts):
        raise ValueError("exact_square_sum needs one count per value")
    split = _split_sum(values, counts, center)
    if split is not None:
        return split
    deviations = list(map(operator.sub, values, itertools.repeat(center, len(values))))
    return exact_sum(list(map(operator.mul, deviations, deviations)), counts)


def _ttst(times: array) -> float | None:
    """Second emission minus the first (tokens of one burst share a time)."""
    if len(times) > 1 and times[1] != times[0]:
        return times[1] - times[0]  # the usual case: the second token is the second emission
    second = bisect_right(times, times[0]) if times else 0
    return times[second] - times[0] if second < len(times) else None


def ttft_parts(record: RequestRecord) -> dict[str, float] | None:
    """The record's TTFT split at the instants its engine recorded, or None (no first
    token, or no first admission).

    * prefill queue: arrival (the client's, so the serving front end counts here) to the
      start of its first prefill pass;
    * prefill: to the end of the pass that completed the prompt (aggregated: to the first
      token, which that pass emits; the other parts do not apply);
    * KV transfer: to the end of the transfer (waiting for a decode reservation, then on
      the link);
    * decode queue: to the start of the decode pass that admitted it;
    * first decode: to the first token.

    The parts add up to the TTFT exactly, in any order: each instant is taken as its offset
    from the arrival, within ``[0, TTFT]`` and rounded to a multiple of the TTFT's unit in
    the last place (a change below 1e-15 of the TTFT), so every part is an exact
    difference on one grid and so is every partial sum.
    """
    times = record.token_times
    admit = record.first_admit_ms
    if not times or admit is None:
        return None
    arrival = record.arrival_ms
    ttft = times[0] - arrival
    unit = math.ulp(ttft)
    start = _on_grid(admit - arrival, ttft, unit)
    prefill, transfer, decode = (record.prefill_end_ms, record.kv_transfer_end_ms,
                                 record.decode_admit_ms)
    if prefill is None and transfer is None and decode is None:
        return {TTFT_PARTS[0]: start, TTFT_PARTS[1]: ttft - start}
    if prefill is None or transfer is None or decode is None:
        return None  # a handoff the engine did not record whole
    offsets = [0.0, start, _on_grid(prefill - arrival, ttft, unit),
               _on_grid(transfer - arrival, ttft, unit), _on_grid(decode - arrival, ttft, unit),
               ttft]
    return {name: offsets[i + 1] - offsets[i] for i, name in enumerate(TTFT_PARTS)}


def _on_grid(offset: float, ttft: float, unit: float) -> float:
    """``offset`` within ``[0, ttft]``, rounded to a multiple of ``unit``."""
    return round(min(max(offset, 0.0), ttft) / unit) * unit if ttft > 0 else 0.0


def _opt(value: float | None) -> float | None:
    return None if value is None else float(value)


def request_record_json(record: RequestRecord) -> dict[str, Any]:
    """The per-request fields of a ``requests.jsonl`` line (``None`` where not applicable)."""
    times = record.token_times
    first = times[0] if times else None
    last = times[-1] if times else None
    tpot = request_value("tpot_ms", record)
    e2e = request_value("e2e_ms", record) if times or record.terminal_ms is not None else None
    return {
        "request_id": record.request_id,
        "session_id": record.session_id,
        "turn_index": record.turn_index,
        "arrival_time_ms": record.arrival_ms,
        "first_admit_ms": _opt(record.first_admit_ms),
        "terminal_time_ms": _opt(record.terminal_ms),
        "first_token_ms": first,
        "last_token_ms": last,
        "ttft_ms": request_value("ttft_ms", record),
        "ttst_ms": _ttst(times),
        "e2el_ms": e2e,
        "e2e_latency_ms": e2e,  # deprecated: e2el_ms
        "tpot_ms": tpot,
        "itl_ms": tpot,  # deprecated: this request's mean gap, tpot_ms
        "max_itl_ms": request_value("itl_ms", record),
        "input_length": record.input_length,
        "requested_output_length": record.requested_output_length,
        "output_length": record.output_length,
        "reused_input_tokens": record.reused_input_tokens,
        "first_admission_g1_reused_input_tokens": record.first_admission_reused_tokens,
        "prefill_worker_idx": record.prefill_worker,
        "decode_worker_idx": record.decode_worker,
        "num_preemptions": record.num_preemptions,
        "terminal_status": record.status,
        "prefill_end_ms": _opt(record.prefill_end_ms),
        "kv_transfer_start_ms": _opt(record.kv_transfer_start_ms),
        "kv_transfer_end_ms": _opt(record.kv_transfer_end_ms),
        "decode_admit_ms": _opt(record.decode_admit_ms),
        **_ttft_part_fields(record),
    }


def _ttft_part_fields(record: RequestRecord) -> dict[str, float | None]:
    """``ttft_<part>_ms`` of every part: its value, or None where it does not apply."""
    parts = ttft_parts(record) or {}
    return {f"ttft_{name}_ms": parts.get(name) for name in TTFT_PARTS}


class RequestJsonlWriter:
    """Streams one JSON line per record to ``stream`` (nothing is kept in memory)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self.count = 0

    def write(self, record: RequestRecord) -> None:
        self._stream.write(json.dumps(request_record_json(record), separators=(",", ":")))
        self._stream.write("\n")
        self.count += 1


def write_request_records(records: Iterable[RequestRecord], stream: IO[str]) -> int:
    """Write ``records`` as JSONL to ``stream``; returns the number of lines written."""
    writer = RequestJsonlWriter(stream)
    for record in records:
        writer.write(record)
    return writer.count


def _same(passes: memoryview, first: int, tokens: memoryview, i: int, k: int) -> bool:
    """Tokens ``i .. i + k - 1`` are the ends of passes ``first .. first + k - 1``.

    Compared as bytes (a memcmp, no float objects): equal bytes are equal times, and times
    equal but for the sign of a zero are counted token by token."""
    return passes[first:first + k].tobytes() == tokens[i:i + k].tobytes()


def _emissions(times: array) -> array:
    """``times`` without repeats: one time per emission (a speculative burst's tokens
    share one), so no gap between two of them is zero."""
    values: list[float] = times.tolist()
    kept: list[float] = []
    last = values[0] if values else 0.0
    if values:
        kept.append(last)
    for t in values:
        if t != last:
            kept.append(t)
            last = t
    return array("d", kept)


@mypyc_attr(allow_interpreted_subclasses=True)
class MetricsCollector:
    """Accumulates finished requests and produces the flat report dict.

    ``request_log``, when given, receives every added record as a JSONL line.
    """

    def __init__(self, sla: SlaArgs | None = None, *,
                 request_log: IO[str] | None = None) -> None:
        self._targets = targets_of(sla)
        self._bounds = RequestBounds(self._targets)
        self._writer = None if request_log is None else RequestJsonlWriter(request_log)
        self.num_requests = 0
        self.completed = 0
        self.rejected = 0
        self.incomplete = 0
        self.total_input_tokens = 0
        self.total_output_tokens = 0
        self.reused_tokens = 0
        self.first_admission_reused_tokens = 0
        self.duration_ms = 0.0
        self.goodput_completed = 0
        self.goodput_output_tokens = 0
        self._samples: dict[str, array] = {name: array("d") for name in LATENCIES
                                           if name != "itl"}
        # each TTFT part of the completed requests it applies to (see ttft_parts)
        self._ttft_parts: dict[str, array] = {name: array("d") for name in TTFT_PARTS}
        # every gap between emissions, counted: the gap -> its place in ``_itl_counts`` (one
        # dict operation a gap, setdefault, where gap -> count takes a get and a set)
        self._itl: dict[float, int] = {}
        self._itl_counts: list[int] = []
        # per pass-ends array (by id): the array and a difference array of how many
        # requests' gaps each pass ends (gaps not yet folded into ``_itl``)
        self._runs: dict[int, tuple[array[float], array[int]]] = {}
        self.fold_passes = _FOLD_PASSES

    def add(self, record: RequestRecord) -> None:
        self.num_requests += 1
        if self._writer is not None:
            self._writer.write(record)
        if record.status == "rejected":
            self.rejected += 1
            return
        if record.status != "completed":
            self.incomplete += 1
            return
        self.completed += 1
        times = record.token_times
        n = len(times)
        self.total_input_tokens += record.input_length
        self.total_output_tokens += n
        self.reused_tokens += record.reused_input_tokens
        self.first_admission_reused_tokens += record.first_admission_reused_tokens
        end = record.terminal_ms
        if end is None:
            end = times[-1] if n else record.arrival_ms
        self.duration_ms = max(self.duration_ms, end)
        samples = self._samples
        if n >= 1:
            samples["ttft"].append(times[0] - record.arrival_ms)
            for name, part in (ttft_parts(record) or {}).items():
                self._ttft_parts[name].append(part)
        if n >= 2:
            ttst = _ttst(times)
            if ttst is not None:
                samples["ttst"].append(ttst)
            samples["tpot"].append((times[-1] - times[0]) / (n - 1))
            if not self._count_runs(record.pass_ends, times, n):
                # a zero gap is inside one emission (a speculative burst): no gap
                for gap in filter(None, map(operator.sub, itertools.islice(times, 1, None),
                                            times)):
                    self._count_gap(gap, 1)
        samples["e2el"].append(request_value("e2e_ms", record) or 0.0)
        if self._bounds.targets and self._bounds.check(record):
            self.goodput_completed += 1
            self.goodput_output_tokens += n

    def _count_runs(self, ends: array | None, times: array, n: int) -> bool:
        """Count the ``n - 1`` gaps of a record's token ``times`` when each token is a pass
        end of ``ends``: the gaps inside a run of tokens at consecutive passes per pass, the
        gap between two runs by itself. False, with nothing counted, when a token is no
        pass end or the tokens split into more than :data:`_MAX_RUNS` runs. The tokens of
        a speculative burst share a time: a record with bursts counts the gaps of its
        emissions (:func:`_emissions`), the same nonzero gaps."""
        if ends is None:
            return False
        self._fold_settled(ends)  # first: it shifts the pass indices
        runs: list[tuple[int, int]] = []  # (first pass, tokens) of each run, in order
        top = 0  # the pass after the last run's
        burst = False
        # The views are released at once, so the worker can still append pass ends.
        with memoryview(ends) as passes, memoryview(times) as tokens:
            i = 0
            while i < n and not burst:
                if len(runs) == _MAX_RUNS:
                    return False
                # (on the view: bisecting the array subclass indexes it through Python's
                # generic __getitem__, about a thousand instructions a probe)
                first = bisect_left(passes, times[i])
                k = min(n - i, len(ends) - first)
                if not _same(passes, first, tokens, i, k):
                    # the longest run, by bisection (a run's prefixes are runs too)
                    lo, hi = 0, k  # tokens i .. i + lo - 1 are a run, to i + hi - 1 not
                    while hi - lo > 1:
                        mid = (lo + hi) // 2
                        if _same(passes, first, tokens, i, mid):
                            lo = mid
                        else:
                            hi = mid
                    k = lo
                if not k:
                    return False  # not a pass end: a token stamped some other way
                # a run that ends inside a speculative burst (tokens of one emission)
                burst = i + k < n and times[i + k] == times[i + k - 1]
                runs.append((first, k))
                top = max(top, first + k)
                i += k
        if burst:  # the gaps are those of the emissions: count these
            emissions = _emissions(times)
            return self._count_runs(ends, emissions, len(emissions))
        cover = self._cover(ends, top + 1)
        i = 0
        for first, k in runs:
            gap = times[i] - times[i - 1] if i else 0.0  # from the run before
            if gap:
                self._count_gap(gap, 1)
            cover[first + 1] += 1  # the gaps ending at passes first + 1 .. first + k - 1
            cover[first + k] -= 1
            i += k
        return True

    def _cover(self, ends: array, size: int) -> array:
        """The difference array of how many gaps each pass of ``ends`` ends, at least
        ``size`` long."""
        run = self._runs.get(id(ends))
        if run is None:
            run = self._runs[id(ends)] = (ends, array("q"))
        cover = run[1]
        short = size - len(cover)
        if short > 0:
            cover.frombytes(bytes(8 * short))
        return cover

    def _fold_runs(self) -> None:
        """Add the gaps counted per pass to the ``value -> count`` ITL multiset."""
        for pass_ends, cover in self._runs.values():
            self._fold(pass_ends, cover, min(len(pass_ends), len(cover)))
        self._runs.clear()

    def _fold(self, pass_ends: array, cover: array, end: int) -> int:
        """Add the gaps ending at passes ``1 .. end - 1`` to the ITL multiset; the count
        of gaps at pass ``end - 1`` (the running sum of ``cover``)."""
        ends: list[float] = pass_ends[:end].tolist()
        covered: list[int] = cover[:end].tolist()
        count = 0
        for k in range(1, end):
            count += covered[k]
            gap = ends[k] - ends[k - 1]
            if count and gap:  # passes ending together emit together
                self._count_gap(gap, count)
        return count

    def _count_gap(self, gap: float, count: int) -> None:
        """Count ``gap`` ``count`` more times."""
        counts = self._itl_counts
        at = self._itl.setdefault(gap, len(counts))
        if at == len(counts):
            counts.append(count)
        else:
            counts[at] += count

    def _fold_settled(self, pass_ends: array) -> None:
        """Fold the passes of ``pass_ends`` that end before its floor (see the module
        docstring) and drop them from it and from its difference array."""
        floor = getattr(pass_ends, "floor", None)
        if floor is None or len(pass_ends) < self.fold_passes:
            return
        with memoryview(pass_ends) as view:  # (see _count_runs)
            settled = bisect_left(view, floor)
        if settled < self.fold_passes // 2 or settled < 2:
            return
        keep_from = settled - 1  # the pass before the first kept gap stays, as index 0
        run = self._runs.get(id(pass_ends))
        if run is not None:
            cover = run[1]
            if len(cover) > settled:
                cover[settled] += self._fold(pass_ends, cover, settled)
                del cover[:keep_from]
                cover[0] = 0
            else:
                self._fold(pass_ends, cover, len(cover))
                del cover[:]
        del pass_ends[:keep_from]

    def report(self, *, wall_time_ms: float, gpu_seconds: float | Mapping[str, float],
               extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The flat report. ``gpu_seconds``: total GPU-seconds, or GPU-seconds per role.

        ``extra`` keys are appended (and override computed keys of the same name).
        """
        duration_s = self.duration_ms / 1000.0

        def rate(amount: float) -> float:
            return amount / duration_s if duration_s > 0 else 0.0

        total_input = self.total_input_tokens
        out: dict[str, Any] = {
            "num_requests": self.num_requests,
            "completed": self.completed,
            "failed": self.rejected + self.incomplete,
            "rejected_requests": self.rejected,
            "incomplete_requests": self.incomplete,
            "total_input_tokens": total_input,
            "total_output_tokens": self.total_output_tokens,
            "duration": duration_s,
            "duration_ms": self.duration_ms,
            "wall_time_ms": float(wall_time_ms),
            "request_throughput": rate(self.completed),
            "input_throughput": rate(total_input),
            "output_throughput": rate(self.total_output_tokens),
            "total_token_throughput": rate(total_input + self.total_output_tokens),
        }
        self._fold_runs()
        gaps = sorted(self._itl)
        counts = list(map(self._itl_counts.__getitem__, map(self._itl.__getitem__, gaps)))
        for name in LATENCIES:
            if name == "itl":
                out.update(sorted_distribution(gaps, counts, name))
            else:
                out.update(distribution(self._samples[name], name))
        # 1000 / gap for every positive gap (gaps are never negative), in non-decreasing
        # order: a correctly rounded division is monotonic in the divisor
        zero = bisect_right(gaps, 0.0)
        rates = list(map(operator.truediv, itertools.repeat(1000.0), gaps[zero:][::-1]))
        out.update(sorted_distribution(rates, counts[zero:][::-1], PER_USER, unit=""))
        for name, parts in self._ttft_parts.items():
            if parts:  # the parts some request has: none for an engine that records none
                out.update(distribution(parts, f"ttft_{name}"))
        for name in LATENCIES:
            out[f"num_{name}_samples"] = sum(counts) if name == "itl" \
                else len(self._samples[name])
        out["prefix_cache_reused_ratio"] = (
            self.reused_tokens / total_input if total_input else 0.0)
        out["first_admission_prefix_cache_reused_ratio"] = (
            self.first_admission_reused_tokens / total_input if total_input else 0.0)
        out["committed_prefill_tokens"] = total_input - self.reused_tokens
        if isinstance(gpu_seconds, Mapping):
            total_gpu_s = math.fsum(float(gpu_seconds[k]) for k in sorted(gpu_seconds))
        else:
            total_gpu_s = float(gpu_seconds)
        out["gpu_hours"] = total_gpu_s / 3600.0
        if self._bounds.targets:
            out["good_request_count"] = self.goodput_completed
            out["request_goodput"] = rate(self.goodput_completed)
            out["goodput_output_throughput_tok_s"] = rate(self.goodput_output_tokens)
        if self._targets:
            verdicts = self._bounds.verdicts() + run_verdicts(self._targets, out)
            out["sla_verdicts"] = verdicts
            # a column sweeps and searches can bound: sla_targets_missed <= 0
            out["sla_targets_missed"] = sum(v["met"] is not True for v in verdicts)
        for old, new in DEPRECATED_NAMES.items():
            if new in out:
                out[old] = out[new]
        if extra:
            out.update(extra)
        return out
