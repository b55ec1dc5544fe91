"""The run map against its definition: a value per offset, held as maximal runs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.runmap import Counts, RunMap


def _map(values: list[Any]) -> Counts:
    out = Counts()
    for v in values:
        out.append(1, v)
    return out


def _runs(m: RunMap[Any]) -> list[tuple[int, int, Any]]:
    return m.runs(0, m.size)


def test_append_merges_equal_values_into_one_run() -> None:
    m = _map([1, 1, 2, 2, 2, 1])
    assert _runs(m) == [(0, 2, 1), (2, 5, 2), (5, 6, 1)]
    assert m.starts == [0, 2, 5] and m.size == 6 and m.is_canonical()
    m.append(0, 7)  # nothing
    assert m.size == 6 and m.last() == 1


def test_an_empty_range_changes_and_holds_nothing() -> None:
    m = _map([1, 2, 3])
    m.assign(2, 2, 9)
    m.assign(2, 1, 9)
    m.shift(1, 1, 5)
    assert m.expand() == [1, 2, 3]
    assert m.runs(2, 2) == [] and m.count(1, 1, 2) == 0
    assert m.first_not(1, 1, 7) == 1 and m.all(3, 3, 7)


def test_reads_clip_to_the_size() -> None:
    m = _map([4, 4, 5])
    assert m.runs(1, 10) == [(1, 2, 4), (2, 3, 5)]
    assert m.count(0, 10, 4) == 2
    assert m.runs(3, 9) == [] and RunMap[int]().runs(0, 4) == []


def test_assign_splits_a_run_and_merges_with_equal_neighbours() -> None:
    m = _map([0] * 10)
    m.assign(3, 6, 1)  # a split in three
    assert _runs(m) == [(0, 3, 0), (3, 6, 1), (6, 10, 0)]
    m.assign(3, 6, 0)  # back to one run
    assert _runs(m) == [(0, 10, 0)]
    m.assign(0, 4, 2)
    m.assign(6, 10, 2)
    m.assign(4, 6, 2)  # joins both sides
    assert _runs(m) == [(0, 10, 2)] and m.is_canonical()


def test_assign_moves_one_boundary_where_a_neighbour_holds_the_value() -> None:
    m = _map([1, 1, 2, 2, 2, 2])
    m.assign(2, 4, 1)  # the run below grows
    assert _runs(m) == [(0, 4, 1), (4, 6, 2)]
    m.assign(3, 4, 2)  # the run above grows down
    assert _runs(m) == [(0, 3, 1), (3, 6, 2)]
    m.assign(0, 6, 3)  # over every run
    assert _runs(m) == [(0, 6, 3)]


def test_shift_adds_to_a_range_and_joins_runs_that_become_equal() -> None:
    m = _map([1, 1, 0, 0, 1])
    m.shift(2, 4, 1)
    assert _runs(m) == [(0, 5, 1)]
    m.shift(1, 3, -1)
    assert _runs(m) == [(0, 1, 1), (1, 3, 0), (3, 5, 1)]
    assert m.count(0, 5, 0) == 2 and m.first_not(0, 5, 1) == 1


def test_truncate_and_get() -> None:
    m = _map([1, 2, 2, 3])
    assert [m.get(k) for k in range(4)] == [1, 2, 2, 3]
    m.truncate(2)
    assert _runs(m) == [(0, 1, 1), (1, 2, 2)]
    m.truncate(5)  # past the end: nothing
    assert m.size == 2
    m.clear()
    assert m.size == 0 and m.starts == [] and m.is_canonical()


def test_is_canonical_finds_equal_neighbours_and_bad_starts() -> None:
    m = _map([1, 2])
    m.values[1] = 1
    assert not m.is_canonical()
    m = _map([1, 2])
    m.starts[0] = 1
    assert not m.is_canonical()


def _runs_of(model: list[int], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The maximal stretches of one value of ``model[lo:hi]``."""
    out: list[tuple[int, int, int]] = []
    for k in range(lo, min(hi, len(model))):
        if out and out[-1][2] == model[k]:
            out[-1] = (out[-1][0], k + 1, model[k])
        else:
            out.append((k, k + 1, model[k]))
    return out


OPS = st.lists(st.tuples(st.sampled_from(["assign", "shift", "append", "truncate"]),
                         st.integers(0, 24), st.integers(0, 24), st.integers(-2, 2)),
               max_size=40)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2), max_size=20), OPS)
def test_the_run_map_follows_a_list(start: list[int], ops: list[tuple[str, int, int, int]]) -> None:
    m, model = _map(start), list(start)
    for op, a, b, v in ops:
        lo, hi = min(a, b), min(max(a, b), len(model))
        if op == "assign":
            m.assign(lo, hi, v)
            model[lo:hi] = [v] * max(hi - lo, 0)
        elif op == "shift":
            m.shift(lo, hi, v)
            model[lo:hi] = [x + v for x in model[lo:hi]]
        elif op == "append":
            m.append(a % 4, v)
            model += [v] * (a % 4)
        else:
            m.truncate(a)
            del model[a:]
        assert m.expand() == model and m.is_canonical() and m.size == len(model)
        assert m.count(lo, b, v) == model[lo:b].count(v)
        assert m.runs(lo, b) == _runs_of(model, lo, b)
        hi = min(hi, len(model))
        first = next((k for k in range(lo, hi) if model[k] != v), hi)
        assert m.first_not(lo, hi, v) == first


@pytest.mark.parametrize("value", [None, "x"])
def test_object_values_compare_equal_to_merge(value: object) -> None:
    m: RunMap[object] = RunMap()
    m.append(3, value)
    m.append(2, value)
    assert _runs(m) == [(0, 5, value)]
