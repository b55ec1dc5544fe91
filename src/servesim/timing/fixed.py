"""``timing.type = "fixed"``: a constant price per non-empty pass half."""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class FixedTimer:
    """Charges ``prefill_ms`` when a pass computes prompt tokens and ``decode_ms`` when it
    emits decode tokens; an empty half (or a prefill with no new tokens) costs nothing."""

    # Stored under short names because the methods own ``prefill_ms``/``decode_ms``;
    # the aliases keep the constructor spelled like the config: FixedTimer(prefill_ms=...).
    prefill: float = attrs.field(alias="prefill_ms")
    decode: float = attrs.field(alias="decode_ms")

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        # A fully cached prompt schedules no new tokens and must cost 0 (spec: "prefill with
        # zero new tokens costs 0"), even though the request took part in the pass.
        if batch <= 0 or mean_isl <= mean_prefix:
            return 0.0
        return self.prefill

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        return self.decode if batch > 0 else 0.0
