"""The timing fit's start and ridge (bench/fit_timing.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import calib
import fit_timing

from servesim.timing.analytical import load_constants

KEYS = [*fit_timing.GLOBAL,
        *(f"{b}.{f}" for b in fit_timing.BACKENDS for f in fit_timing.PER_BACKEND)]


def test_the_start_holds_no_fitted_value() -> None:
    # two sets of constants that differ in every fitted value start alike
    shipped = load_constants()
    other = shipped.with_values(**{k: shipped.value(k) * 1.5 for k in KEYS})
    first, second = fit_timing.start(shipped), fit_timing.start(other)
    assert [first.value(k) for k in KEYS] == [second.value(k) for k in KEYS]
    assert first.value("gemm_scale") == fit_timing.START["gemm_scale"]
    assert first.value("vllm.layer_us") == shipped.overheads("default").layer_us


def test_every_start_lies_within_its_bounds() -> None:
    c = fit_timing.start(load_constants())
    for k in KEYS:
        lo, hi = fit_timing.BOUNDS[k.split(".")[-1]]
        assert lo <= c.value(k) <= hi, k


@pytest.fixture(scope="module")
def item() -> fit_timing.Item:
    row = calib.Row(
        id="r", backend="vllm", system="h100_sxm", model="meta-llama/Llama-3.1-8B-Instruct",
        mode="agg", isl=512, osl=32, concurrency=2, tp=1, dp=1, moe_tp=1, moe_ep=1,
        gemm_quant="", moe_quant="", ttft_ms=40.0, tpot_ms=30.0, version="")
    s = calib.setup(row, max_tokens=calib.MAX_TOKENS)
    assert isinstance(s, calib.Setup)
    return s, calib.record(s)


@pytest.mark.parametrize("ridge, moves", [(0.0, True), (1e6, False)])
def test_the_ridge_holds_the_constants_at_their_start(item: fit_timing.Item, ridge: float,
                                                     moves: bool) -> None:
    # a row measured far slower than the start predicts pulls the constants away from it,
    # unless a strong ridge holds them there
    base = fit_timing.start(load_constants())
    start_tpot = fit_timing.predict(base, item)[1]
    assert start_tpot < 0.5 * item[0].row.tpot_ms
    fitted = fit_timing.fit(base, [item], KEYS, 1.0, 3, error="relative", ridge=ridge)
    tpot = fit_timing.predict(fitted, item)[1]
    assert (tpot > 1.2 * start_tpot) == moves
