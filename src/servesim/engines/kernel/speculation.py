"""Speculative decoding: how many tokens one verification step emits.

N-gram prompt lookup and MTP share this sampler (spec §5.7). A verification step always
yields the target model's own token; draft ``i`` is then accepted with the conditional
probability ``acceptance_rates[i]`` (given every earlier draft was accepted), and the
first rejection ends the burst. Rates of exactly 0 and 1 are deterministic (``random()``
lies in ``[0, 1)``). No draft model, draft KV or lookup cost is modelled.

The stream is seeded per rank (``seed + rank offset``) so a replay is reproducible and
two ranks do not draw the same bursts.
"""

from __future__ import annotations

import random
from collections.abc import Sequence


class BurstSampler:
    """Seeded sampler of burst lengths (``1 .. num_speculative_tokens + 1``)."""

    __slots__ = ("_random", "num_speculative_tokens", "rates")

    def __init__(self, rates: Sequence[float], seed: int, offset: int = 0) -> None:
        self.rates = tuple(float(r) for r in rates)
        self.num_speculative_tokens = len(self.rates)
        self._random = random.Random(seed + offset)

    @property
    def expected_burst(self) -> float:
        """Mean tokens per verification step: ``1 + r1 + r1*r2 + ...``."""
        total, p = 1.0, 1.0
        for r in self.rates:
            p *= r
            total += p
        return total

    def sample(self, limit: int | None = None) -> int:
        """One burst length, never above ``limit`` (the tokens the request may still take).

        Only the drafts that could still be used are drawn, so the stream a request sees
        depends on its remaining length, deterministically.
        """
        drafts = self.num_speculative_tokens
        if limit is not None and limit - 1 < drafts:
            drafts = max(limit - 1, 0)
        burst = 1
        draw = self._random.random
        rates = self.rates
        for i in range(drafts):
            if draw() < rates[i]:
                burst += 1
            else:
                break
        return burst
