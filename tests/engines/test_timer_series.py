"""A timer's run of steady decode steps (``decode_steps_ms``) that is not one duration per
pass stops the replay with a diagnostic naming the method, not a traceback."""

from __future__ import annotations

from typing import Any

import pytest

from servesim import codes
from servesim.engines.vllm import AggregatedReplay
from servesim.errors import ReplayError
from servesim.timing import make_timer

from .conftest import ListWorkload, Sim


class _Series:
    """The role's own timer, with a ``decode_steps_ms`` that returns ``bad(steps)``."""

    def __init__(self, inner: Any, bad: Any) -> None:
        self.inner, self.bad = inner, bad

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return float(self.inner.prefill_ms(batch, mean_isl, mean_prefix))

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        return float(self.inner.decode_ms(batch, active, mean_context, total))

    def decode_steps_ms(self, batch: int, active: int, total: int, steps: int) -> Any:
        return self.bad(steps)


@pytest.mark.parametrize(("bad", "says"), [
    (lambda steps: [1.0] * (steps - 1), "values"),  # a pass short
    (lambda steps: None, "None"),  # not a list
])
def test_a_series_that_is_not_one_duration_per_pass_is_the_timers_error(
        sim: type[Sim], bad: Any, says: str) -> None:
    role = sim.role()
    timer = _Series(make_timer(role), bad)
    run = AggregatedReplay(role, timer, ListWorkload([sim.spec(0, 8, 12)]),
                           lambda record: None, None)
    with pytest.raises(ReplayError) as info:
        run.run()
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == codes.TIMING_INVALID
    assert "decode_steps_ms" in diagnostic.message and says in diagnostic.message
    assert "one per pass" in diagnostic.message
