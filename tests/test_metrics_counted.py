"""Counted (value -> multiplicity) distributions give the same floats as sample lists."""

from __future__ import annotations

import math
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from servesim.engines.kernel.metrics import counted_distribution, distribution, exact_sum

values = st.one_of(st.sampled_from([0.0, 1.0, 2.5, 1e-3, 7.123456789, 1e5 / 3, 0.1]),
                   st.floats(0.0, 1e7, allow_nan=False, allow_infinity=False))


@given(st.lists(values, max_size=200))
def test_counted_distribution_equals_the_sample_distribution(samples: list[float]) -> None:
    assert counted_distribution(Counter(samples), "itl") == distribution(samples, "itl")


@given(st.lists(st.tuples(values, st.integers(1, 10**6)), max_size=50))
def test_exact_sum_is_fsum_of_the_repeated_values(pairs: list[tuple[float, int]]) -> None:
    small = [(v, c % 50 + 1) for v, c in pairs]
    expanded = [v for v, c in small for _ in range(c)]
    assert exact_sum([v for v, _ in small], [c for _, c in small]) == math.fsum(expanded)
