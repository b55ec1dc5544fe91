"""Placement of new requests over targets (servesim.engines.kernel.placement)."""

from __future__ import annotations

import pytest

from servesim.engines.kernel.placement import Placement


def test_round_robin_takes_the_targets_in_turn_from_the_first() -> None:
    placement = Placement(["a", "b", "c"])
    assert [placement.pick() for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]


def test_least_loaded_reads_the_load_at_every_pick_and_keeps_the_first_of_a_tie() -> None:
    load = {"a": 2, "b": 1, "c": 1}
    placement = Placement(["a", "b", "c"], load=load.__getitem__)
    assert placement.pick() == "b"  # b and c hold one each: the first of them
    load["b"] = 3
    assert placement.pick() == "c"
    load["c"] = 5
    assert placement.pick() == "a"


def test_a_placement_needs_a_target() -> None:
    with pytest.raises(ValueError, match="at least one target"):
        Placement([])
