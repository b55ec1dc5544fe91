from __future__ import annotations

import math

import pytest

from servesim.errors import ReplayError
from servesim.payload import RoleArgs, TimingArgs
from servesim.timing import FixedTimer, PolynomialTimer, make_timer


def _role(timing: TimingArgs, **kw: object) -> RoleArgs:
    args: dict[str, object] = {"worker_type": "aggregated", "backend": "vllm", "model": "m",
                               "hardware": "h", **kw}
    return RoleArgs(timing=timing, **args)  # type: ignore[arg-type]


def test_fixed_charges_each_half_only_when_it_has_work() -> None:
    t = FixedTimer(prefill_ms=10.0, decode_ms=2.0)
    assert t.prefill_ms(1, 9, 0) == 10.0
    assert t.prefill_ms(0, 0, 0) == 0.0
    assert t.prefill_ms(1, 8, 8) == 0.0  # fully cached: zero new tokens costs nothing
    assert t.decode_ms(3, 30, 10, 1000) == 2.0
    assert t.decode_ms(0, 0, 0, 1000) == 0.0


def test_polynomial_matches_the_closed_forms() -> None:
    t = PolynomialTimer()
    new = 4 * (700 - 100)
    assert t.prefill_ms(4, 700, 100) == pytest.approx(4.209989e-07 * new**2 + 1.518344e-02 * new
                                                      + 16.50142)
    assert t.prefill_ms(2, 64, 64) == 0.0
    assert t.prefill_ms(0, 0, 0) == 0.0
    u = 250 / 1000
    assert t.decode_ms(5, 250, 50, 1000) == pytest.approx(-25.74 * u * u + 54.01 * u + 5.74)
    # utilisation is capped at 1 and the curve floored at 1 ms
    assert t.decode_ms(5, 5000, 50, 1000) == pytest.approx(max(1.0, -25.74 + 54.01 + 5.74))
    assert t.decode_ms(1, 0, 0, 1000) == pytest.approx(5.74)
    assert t.decode_ms(0, 0, 0, 1000) == 0.0


def test_make_timer_builds_fixed_and_polynomial() -> None:
    fixed = make_timer(_role(TimingArgs(type="fixed", prefill_ms=3.0, decode_ms=1.5)))
    assert fixed == FixedTimer(prefill_ms=3.0, decode_ms=1.5)
    assert isinstance(make_timer(_role(TimingArgs(type="polynomial"))), PolynomialTimer)


def test_unknown_timing_type_names_the_providers() -> None:
    with pytest.raises(ReplayError) as err:
        make_timer(_role(TimingArgs(type="magic"), worker_type="decode"))
    (diag,) = err.value.diagnostics
    assert diag.code == "timing-unavailable"
    assert diag.where == "engine.workers.decode.timing.type"
    assert diag.message == (
        "unknown timing type 'magic'; expected one of default, fixed, measured, polynomial, table"
    )


@pytest.mark.parametrize("bad", [None, -1.0, math.nan, math.inf])
def test_fixed_timing_values_must_be_finite_and_non_negative(bad: float | None) -> None:
    with pytest.raises(ReplayError) as err:
        make_timer(_role(TimingArgs(type="fixed", prefill_ms=bad, decode_ms=1.0)))
    (diag,) = err.value.diagnostics
    assert diag.where == "engine.workers.aggregated.timing.prefill_ms"
