"""The calibration data checks (bench/data_checks.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import calib
import data_checks


def _row(osl: int, ttft_ms: float, tpot_ms: float, **changes: object) -> calib.Row:
    fields: dict[str, object] = dict(
        id=f"{osl}-{ttft_ms}", backend="trtllm", system="b200_sxm", model="org/m",
        mode="agg", isl=1024, osl=osl, concurrency=8, tp=8, dp=1, moe_tp=1, moe_ep=1,
        gemm_quant="fp8", moe_quant="", ttft_ms=ttft_ms, tpot_ms=tpot_ms, version="1.0")
    fields.update(changes)
    return calib.Row(**fields)  # type: ignore[arg-type]


def test_a_configuration_measured_at_two_output_lengths_gives_one_ratio() -> None:
    # repeated measurements of one configuration count once, by their median
    rows = [_row(1024, 100.0, 10.0), _row(1024, 300.0, 12.0), _row(1024, 200.0, 11.0),
            _row(8192, 100.0, 9.9)]
    found = data_checks.ratios(rows, "osl")
    assert list(found) == [("b200_sxm", "trtllm", "m", "1.0", "1024 -> 8192")]
    [(ttft, tpot)] = found[("b200_sxm", "trtllm", "m", "1.0", "1024 -> 8192")]
    assert ttft == pytest.approx(0.5)
    assert tpot == pytest.approx(0.9)


@pytest.mark.parametrize("change", [
    {"tp": 4}, {"concurrency": 16}, {"isl": 8192}, {"gemm_quant": "nvfp4"},
    {"system": "gb200"}, {"version": "1.1"}, {"mode": "disagg"}, {"concurrency": 0},
    {"excluded": "repeats another row's measurement (counted once)"},
])
def test_rows_that_differ_in_another_column_are_not_paired(change: dict[str, object]) -> None:
    assert data_checks.ratios([_row(1024, 100.0, 10.0), _row(8192, 90.0, 9.0, **change)],
                              "osl") == {}


def test_pairs_across_versions_are_grouped_by_the_two_versions() -> None:
    rows = [_row(1024, 100.0, 10.0, version="post2"), _row(1024, 110.0, 6.0, version="post3"),
            _row(8192, 100.0, 10.0, version="post2"), _row(8192, 120.0, 5.0, version="post3")]
    found = data_checks.ratios(rows, "version")
    assert [tpot for _, tpot in found[("b200_sxm", "trtllm", "m", "post2 -> post3")]] == (
        pytest.approx([0.6, 0.5]))


def test_a_column_that_names_no_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="ttft_ms"):
        data_checks.ratios([], "ttft_ms")


def test_a_configuration_measured_by_several_runs_gives_its_highest_over_lowest() -> None:
    rows = [_row(1024, 100.0, 10.0), _row(1024, 120.0, 15.0), _row(1024, 110.0, 12.0),
            _row(8192, 100.0, 9.0)]  # measured once: no ratio
    assert data_checks.remeasured(rows) == {
        ("b200_sxm", "trtllm", "m", "1.0"): [(pytest.approx(1.2), pytest.approx(1.5))]}


@pytest.mark.parametrize("change", [
    {"isl": 8192}, {"version": "1.1"}, {"concurrency": 16}, {"mode": "disagg"},
    {"excluded": "repeats another row's measurement (counted once)"},
])
def test_only_distinct_runs_of_one_configuration_are_remeasured(
        change: dict[str, object]) -> None:
    assert data_checks.remeasured([_row(1024, 100.0, 10.0),
                                   _row(1024, 100.0, 20.0, **change)]) == {}
