"""The step-time provider interface a scheduler prices its passes with."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from servesim import codes
from servesim.errors import Diagnostic, ReplayError


class StepTimer(Protocol):
    """Duration of the two sequential halves of one engine pass, in milliseconds.

    A scheduler calls :meth:`prefill_ms` once per pass with the requests that computed
    prompt tokens in it and :meth:`decode_ms` once with the requests that emit a token.
    An empty half (``batch == 0``) must cost ``0.0``. Both must be pure functions of
    their arguments: the built-in engines price runs of steady decode passes ahead of
    time, in bulk, and rely on the same arguments giving the same float.

    A timer may also define ``request_ms(input_tokens) -> float``: the latency a request
    spends in the serving front end (HTTP handling, tokenisation) before the scheduler
    sees it. The engines admit each request that much after its arrival (see
    :func:`front_end`); a timer without the method adds none.

    And ``prefill_group_ms(batch, mean_isl, mean_prefix, group_tokens) -> float``: the
    prefill half of one attention-DP rank in a pass where the ranks of its worker compute
    ``group_tokens`` prompt tokens together (mixture-of-experts layers see them all). The
    engines call it, instead of :meth:`prefill_ms`, for the ranks of a pass in which more
    than one rank prefilled; a timer without it prices every rank on its own.

    And ``decode_steps_ms(batch, active_kv_tokens, total_kv_tokens, steps) -> list[float]``:
    the decode halves of ``steps`` steady passes of the same ``batch`` requests, pass
    ``j`` (from 0) holding ``active_kv_tokens + batch * j`` tokens with a mean context of
    that over ``batch``, rounded down; each the float :meth:`decode_ms` gives for those
    arguments. The engines price a run of steady passes with it in one call; a timer
    without it is called once per pass.
    """

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        """``batch`` prefilling requests; mean context after and before this pass's chunk."""
        ...

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        """``batch`` decoding requests holding ``active_kv_tokens`` of ``total_kv_tokens``."""
        ...


def front_end(timer: StepTimer, path: tuple[str, ...]) -> Callable[[int], float] | None:
    """``timer``'s front-end latency of a request by its prompt length, checked to be a
    finite number >= 0 (a :class:`ReplayError` located at ``path`` otherwise); ``None``
    when the timer has no ``request_ms``."""
    request_ms = getattr(timer, "request_ms", None)
    if request_ms is None:
        return None

    def latency(input_tokens: int) -> float:
        value = request_ms(input_tokens)
        if isinstance(value, (int, float)) and 0.0 <= value < math.inf:
            return float(value)
        raise ReplayError([Diagnostic(
            code=codes.TIMING_INVALID,
            message=f"the timer's front-end latency for a {input_tokens}-token prompt is "
                    f"{value!r}; request_ms must return a finite number of ms >= 0",
            path=path)])

    return latency


def prefill_group_ms(timer: StepTimer, batch: int, mean_isl: float, mean_prefix: float,
                     group_tokens: int) -> float:
    """``timer``'s ``prefill_group_ms``, or its ``prefill_ms`` when it has none (for
    timers that wrap another one)."""
    price = getattr(timer, "prefill_group_ms", None)
    if price is None:
        return timer.prefill_ms(batch, mean_isl, mean_prefix)
    value: float = price(batch, mean_isl, mean_prefix, group_tokens)
    return value
