"""The step-time provider interface a scheduler prices its passes with."""

from __future__ import annotations

from typing import Protocol


class StepTimer(Protocol):
    """Duration of the two sequential halves of one engine pass, in milliseconds.

    A scheduler calls :meth:`prefill_ms` once per pass with the requests that computed
    prompt tokens in it and :meth:`decode_ms` once with the requests that emit a token.
    An empty half (``batch == 0``) must cost ``0.0``. Both must be pure functions of
    their arguments: the built-in engines price runs of steady decode passes ahead of
    time, in bulk, and rely on the same arguments giving the same float.
    """

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        """``batch`` prefilling requests; mean context after and before this pass's chunk."""
        ...

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        """``batch`` decoding requests holding ``active_kv_tokens`` of ``total_kv_tokens``."""
        ...
