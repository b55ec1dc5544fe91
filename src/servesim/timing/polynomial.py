"""``timing.type = "polynomial"``: closed-form curves fitted once, independent of the model.

Prefill is quadratic in the new tokens of the pass; decode is a concave curve in the KV
utilisation of the pool, floored at 1 ms.
"""

from __future__ import annotations

from typing import Final

import attrs

PREFILL_A: Final = 4.209989e-07
PREFILL_B: Final = 1.518344e-02
PREFILL_C: Final = 16.50142
DECODE_A: Final = -25.74
DECODE_B: Final = 54.01
DECODE_C: Final = 5.74


@attrs.frozen(slots=True)
class PolynomialTimer:
    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        t = batch * (mean_isl - mean_prefix)
        if t <= 0:
            return 0.0
        return PREFILL_A * t * t + PREFILL_B * t + PREFILL_C

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        return _decode_ms(batch, active_kv_tokens, total_kv_tokens)

    def decode_steps_ms(self, batch: int, active_kv_tokens: int, total_kv_tokens: int,
                        steps: int) -> list[float]:
        """:meth:`decode_ms` of ``steps`` steady passes (see :class:`StepTimer`)."""
        return [_decode_ms(batch, active_kv_tokens + batch * j, total_kv_tokens)
                for j in range(steps)]


def _decode_ms(batch: int, active_kv_tokens: int, total_kv_tokens: int) -> float:
    # Called once per decode step of a bulk segment: comparisons, not min()/max() calls.
    if batch <= 0:
        return 0.0
    u = active_kv_tokens / total_kv_tokens if total_kv_tokens > 0 else 1.0
    if u > 1.0:
        u = 1.0
    t = DECODE_A * u * u + DECODE_B * u + DECODE_C
    return t if t > 1.0 else 1.0
