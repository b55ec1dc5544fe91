"""A replay's time series, computed in linear time, equal the definitions evaluated
request by request."""

from __future__ import annotations

import random

import pytest

from servesim.report.series import Span, histogram, series


def spans(count: int, seed: int) -> list[Span]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        arrival = rng.uniform(0, 5000)
        admit = arrival + rng.choice([0.0, rng.uniform(0, 300)])
        first = admit + rng.uniform(1, 200)
        output = rng.randint(1, 50)
        last = first + (rng.uniform(1, 2000) if output > 1 else 0.0)
        end = last
        out.append(Span(arrival, admit, first, last, end, rng.randint(1, 4000), output,
                        first - arrival, (last - first) / max(output - 1, 1)))
    return out


def naive(spans: list[Span], t: float) -> tuple[float, int, int, float]:
    """Output tok/s, queued, running and KV tokens at ``t``, from the definitions."""
    tok_s = sum(s.output / (s.last - s.first) * 1000 for s in spans
                if s.first is not None and s.last > s.first and s.first <= t < s.last)
    queued = sum(1 for s in spans if s.arrival <= t < s.admit)
    active = [s for s in spans if s.first is not None and s.admit <= t < s.end]
    kv = 0.0
    for s in active:
        assert s.first is not None
        made = 0.0 if t < s.first else s.output if t >= s.last else \
            s.output * (t - s.first) / (s.last - s.first)
        kv += s.prompt + made
    return tok_s, queued, len(active), kv


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_series_equal_their_definitions(seed: int) -> None:
    data = spans(300, seed)
    got = series(data, buckets=50)
    for i, sec in enumerate(got.seconds):
        tok_s, queued, running, kv = naive(data, sec * 1000)
        assert got.output_tok_s[i] == pytest.approx(tok_s, rel=1e-6, abs=1e-6)
        assert (got.queued[i], got.running[i]) == (queued, running)
        assert got.kv_tokens[i] == pytest.approx(kv, rel=1e-6, abs=1e-3)


def test_histogram_counts_every_value_once() -> None:
    centres, counts, width = histogram([1.0, 2.0, 2.0, 10.0], bins=9)
    assert sum(counts) == 4 and counts[0] == 1 and counts[-1] == 1 and width == 1.0
    assert centres[0] == 1.5
    assert histogram([]) == ([], [], 0.0)


def test_a_span_reads_tpot_and_the_earlier_itl_name_of_a_request_line() -> None:
    line = {"arrival_time_ms": 0.0, "terminal_time_ms": 9.0, "first_token_ms": 3.0,
            "ttft_ms": 3.0, "output_length": 4}
    assert Span.of({**line, "tpot_ms": 2.0, "itl_ms": 2.0}).tpot == 2.0
    assert Span.of({**line, "itl_ms": 1.5}).tpot == 1.5  # a file written before tpot_ms
    assert Span.of(line).tpot is None
