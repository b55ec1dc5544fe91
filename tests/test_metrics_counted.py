"""Counted (value -> multiplicity) distributions give the same floats as sample lists, and
ITL gaps counted per pass the same report as gaps counted per token."""

from __future__ import annotations

import itertools
import math
import random
from array import array
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servesim.engines.kernel.metrics import (
    MetricsCollector,
    distribution,
    exact_square_sum,
    exact_sum,
    sorted_distribution,
)
from servesim.engines.kernel.pass_ends import PassEnds
from servesim.engines.kernel.requests import RequestRecord

values = st.one_of(st.sampled_from([0.0, 1.0, 2.5, 1e-3, 7.123456789, 1e5 / 3, 0.1]),
                   st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False))


@given(st.lists(values, max_size=200), st.lists(st.booleans()))
def test_sorted_distribution_equals_the_sample_distribution(
        samples: list[float], splits: list[bool]) -> None:
    # the multiset as sorted (value, count) pairs; a value may take several entries
    values, weights = [], []
    marks = itertools.chain(splits, itertools.repeat(False))
    for (value, count), split in zip(sorted(Counter(samples).items()), marks, strict=False):
        if split and count > 1:
            values.append(value)
            weights.append(1)
            count -= 1
        values.append(value)
        weights.append(count)
    assert sorted_distribution(values, weights, "itl") == distribution(samples, "itl")


@given(st.lists(st.tuples(values, st.integers(1, 10**6)), max_size=50))
def test_exact_sum_is_fsum_of_the_repeated_values(pairs: list[tuple[float, int]]) -> None:
    small = [(v, c % 50 + 1) for v, c in pairs]
    expanded = [v for v, c in small for _ in range(c)]
    assert exact_sum([v for v, _ in small], [c for _, c in small]) == math.fsum(expanded)


@given(st.lists(st.tuples(values, st.integers(1, 10**6)), max_size=50), values)
def test_exact_square_sum_is_fsum_of_the_repeated_squares(
        pairs: list[tuple[float, int]], center: float) -> None:
    small = [(v, c % 50 + 1) for v, c in pairs]
    expanded = [(v - center) * (v - center) for v, c in small for _ in range(c)]
    got = exact_square_sum([v for v, _ in small], [c for _, c in small], center)
    assert got == math.fsum(expanded)


def test_exact_square_sum_past_the_split_takes_the_listed_squares() -> None:
    # a count of 2**27 is past the split's range: the squares are listed and summed exactly
    got = exact_square_sum([1.5, 2.25], [1 << 27, 3], 1.0)
    assert got == float(Fraction(1, 4) * (1 << 27) + Fraction(25, 16) * 3)


def test_exact_square_sum_needs_a_count_per_value() -> None:
    with pytest.raises(ValueError, match="one count per value"):
        exact_square_sum([1.0, 2.0], [1], 0.0)


@pytest.mark.parametrize("n", [2047, 2048, 2049, 6000])
def test_exact_sum_over_chunks_of_parts(n: int) -> None:
    # the split's parts are packed 4,096 (2,048 values) at a time: sums across that boundary
    rng = random.Random(n)
    pairs = [(rng.choice([rng.random(), rng.uniform(0, 1e7), 0.1, 1e-3]), rng.randint(1, 3))
             for _ in range(n)]
    expanded = [v for v, c in pairs for _ in range(c)]
    assert exact_sum([v for v, _ in pairs], [c for _, c in pairs]) == math.fsum(expanded)


def _itl_report(records: list[RequestRecord]) -> dict[str, float]:
    collector = MetricsCollector()
    for record in records:
        collector.add(record)
    report = collector.report(wall_time_ms=0.0, gpu_seconds=0.0)
    assert report == collector.report(wall_time_ms=0.0, gpu_seconds=0.0)  # repeatable
    return {k: v for k, v in report.items() if "itl" in k or "per_user" in k}


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.75, 0.1]), min_size=1, max_size=60),
       st.lists(st.tuples(st.integers(0, 59), st.integers(0, 12),
                          st.lists(st.integers(0, 11), max_size=12)), max_size=25),
       st.integers(0, 10))
def test_gaps_counted_per_pass_equal_gaps_counted_per_token(
        steps: list[float], picks: list[tuple[int, int, list[int]]], grow: int) -> None:
    # A worker's pass ends (zero-length passes give repeated ends); each request's tokens
    # are a run of consecutive passes, or runs of them: each edit skips a pass (a
    # preemption, a prefill chunk without a token) or repeats an end (a burst).
    ends = array("d", itertools.accumulate(steps))
    records = []
    for i, (start, length, edits) in enumerate(picks):
        times = ends[start:start + length]
        for j in edits:
            if j < len(times) - 1:
                times = times[:j] + times[j + 1:] if j % 2 else times[:j + 1] + times[j:]
        records.append(RequestRecord(request_id=i, arrival_ms=0.0, input_length=1,
                                     requested_output_length=len(times), status="completed",
                                     token_times=times, pass_ends=ends))
    ends.extend(ends[-1] + 1.0 + k for k in range(grow))  # passes after the last record
    per_pass = _itl_report(records)
    per_token = _itl_report([r.evolve(pass_ends=None) for r in records])
    assert per_pass == per_token
    # gaps between emissions: tokens at one time (a burst, passes ending together) are one
    gaps = [b - a for r in records for a, b in itertools.pairwise(r.token_times) if b > a]
    assert per_pass["mean_itl_ms"] == (math.fsum(gaps) / len(gaps) if gaps else 0.0)


def test_speculative_bursts_count_the_gaps_of_their_emissions() -> None:
    # tokens of a burst share their pass's end; each request emits at every pass
    ends = array("d", [1.0, 2.5, 3.0, 4.75, 6.0, 8.0, 8.5, 9.0, 11.0, 12.5])
    bursts = [[1, 3, 1, 2, 4, 1], [2, 2, 1, 1, 3, 1, 2], [4, 1, 1, 1, 1, 1, 1, 2]]
    records = []
    for i, b in enumerate(bursts):
        times = [t for t, k in zip(ends[i:i + len(b)], b, strict=True) for _ in range(k)]
        records.append(RequestRecord(request_id=i, arrival_ms=0.0, input_length=1,
                                     requested_output_length=len(times), status="completed",
                                     token_times=array("d", times), pass_ends=ends))
    per_pass = _itl_report(records)
    assert per_pass == _itl_report([r.evolve(pass_ends=None) for r in records])
    gaps = [b - a for i, b_ in enumerate(bursts) for a, b in
            itertools.pairwise(ends[i:i + len(b_)])]
    assert per_pass["num_itl_samples"] == len(gaps) == 5 + 6 + 7
    assert per_pass["mean_itl_ms"] == math.fsum(gaps) / len(gaps)


@given(st.lists(st.tuples(st.one_of(values, st.floats(0.0, 1e-300), st.floats(1e280, 1e290),
                                     st.floats(-1e6, 0.0)),
                          st.one_of(st.integers(1, 60), st.integers(1, 2**40))), max_size=40))
def test_exact_sum_is_the_exact_sum_rounded_for_any_count(
        pairs: list[tuple[float, int]]) -> None:
    exact = sum((Fraction(v) * c for v, c in pairs), Fraction(0))
    assert exact_sum([v for v, _ in pairs], [c for _, c in pairs]) == float(exact)


@given(st.lists(st.tuples(st.floats(-1e250, 1e250, allow_nan=False),
                          st.integers(1, 2**26 - 1)), max_size=40))
def test_exact_sum_of_split_values_is_the_exact_sum_rounded(
        pairs: list[tuple[float, int]]) -> None:
    # the counts and magnitudes that take the split path (halves times counts, fsum)
    exact = sum((Fraction(v) * c for v, c in pairs), Fraction(0))
    assert exact_sum([v for v, _ in pairs], [c for _, c in pairs]) == float(exact)


@pytest.mark.parametrize("count", [3, 2**26 - 1, 2**26 + 1, 3**20, 2**40 + 3])
@pytest.mark.parametrize("value", [0.1, 1 / 3, 7.123456789, 1e-301, 1e290])
def test_exact_sum_keeps_the_rounding_error_of_a_product(value: float, count: int) -> None:
    # value * count minus its rounded float: only an exact sum sees the difference
    rounded = value * count
    exact = Fraction(value) * count - Fraction(rounded)
    assert exact_sum([value, -rounded], [count, 1]) == float(exact)


@given(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.75, 0.1]), min_size=1, max_size=60),
       st.lists(st.tuples(st.integers(0, 59), st.integers(0, 12), st.booleans()),
                max_size=25),
       st.integers(1, 8))
def test_folding_settled_passes_keeps_the_report(
        steps: list[float], picks: list[tuple[int, int, bool]], fold_passes: int) -> None:
    # The engine raises its pass ends' floor to the arrival of the oldest request still
    # in flight; the collector folds and drops the passes before it as records come in.
    ends = PassEnds()
    ends.extend(itertools.accumulate(steps))
    every = ends.tolist()
    records = []
    for i, (start, length, skip) in enumerate(picks):
        times = array("d", every[start:start + length])
        if skip and len(times) > 2:
            del times[1]  # a pass without a token (a preemption)
        arrival = times[0] if times else every[min(start, len(every) - 1)]
        records.append(RequestRecord(request_id=i, arrival_ms=arrival, input_length=1,
                                     requested_output_length=len(times), status="completed",
                                     token_times=times, pass_ends=ends))
    per_token = _itl_report([r.evolve(pass_ends=None) for r in records])
    collector = MetricsCollector()
    collector.fold_passes = fold_passes
    order = sorted(records, key=lambda r: r.token_times[-1] if r.token_times else 0.0)
    for k, record in enumerate(order):
        ends.floor = min((r.arrival_ms for r in order[k:]), default=every[-1])
        collector.add(record)
    report = collector.report(wall_time_ms=0.0, gpu_seconds=0.0)
    assert {k: v for k, v in report.items() if "itl" in k or "per_user" in k} == per_token


def test_a_fold_carries_the_gaps_of_a_request_across_the_floor() -> None:
    # A's tokens are passes 0-9, B's 5-12 (it arrived at pass 5). When B is added the
    # passes before its arrival are folded and dropped; A's gaps after them still count.
    ends = PassEnds()
    ends.extend(float(i * i) for i in range(14))  # every gap its own value
    every = ends.tolist()

    def record(request_id: int, first: int, last: int) -> RequestRecord:
        times = array("d", every[first:last + 1])
        return RequestRecord(request_id=request_id, arrival_ms=times[0], input_length=1,
                             requested_output_length=len(times), status="completed",
                             token_times=times, pass_ends=ends)

    a, b = record(0, 0, 9), record(1, 5, 12)
    collector = MetricsCollector()
    collector.fold_passes = 2
    ends.floor = a.arrival_ms
    collector.add(a)
    ends.floor = b.arrival_ms
    collector.add(b)
    assert len(ends) == 10  # passes 4 .. 13 are kept
    report = collector.report(wall_time_ms=0.0, gpu_seconds=0.0)
    per_token = _itl_report([r.evolve(pass_ends=None) for r in (a, b)])
    assert {k: v for k, v in report.items() if "itl" in k or "per_user" in k} == per_token


@pytest.mark.parametrize("extra", ["", '[engine.speculation]\nkind = "mtp"\n'
                                       "num_speculative_tokens = 2\n"
                                       "acceptance_rates = [0.7, 0.5]\n"])
def test_a_replay_that_folds_its_passes_reports_the_same(
        extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 requests of 40 tokens from 8 clients on 2 workers: thousands of passes, folded
    # every 16 of them against not at all.
    from servesim.compiler import compile_text
    from servesim.engines.kernel import metrics
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import replay_payload
    from servesim.testing import small_config

    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    text = small_config(requests=200, input_tokens=64, output_tokens=40, concurrency=8,
                        replicas=2, extra=extra)
    payload = compile_text(text, name="c.toml", registry=registry)
    whole = replay_payload(payload, registry=registry).report
    monkeypatch.setattr(metrics, "_FOLD_PASSES", 16)
    folded = replay_payload(payload, registry=registry).report
    assert folded == whole
    assert whole["completed"] == 200
