"""Speculative decoding: how many tokens one verification step emits.

N-gram prompt lookup and MTP share this sampler (spec §5.7). A verification step always
yields the target model's own token; draft ``i`` is then accepted with the conditional
probability ``acceptance_rates[i]`` (given every earlier draft was accepted), and the
first rejection ends the burst. Rates of exactly 0 and 1 are deterministic (``random()``
lies in ``[0, 1)``). No draft model, draft KV or lookup cost is modelled.

The stream is seeded per rank (``seed + rank offset``) so a replay is reproducible and
two ranks do not draw the same bursts.

Each sampler counts its verification steps by drafts proposed and tokens emitted;
:func:`acceptance_report` sums them over a run into the report's acceptance statistics,
named as ``vllm bench serve`` names them: ``spec_decode_num_drafts`` (steps that proposed
at least one draft), ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens``,
``spec_decode_acceptance_rate`` (accepted / drafted, in %), ``spec_decode_acceptance_length``
(mean tokens a step emits, ``1 + accepted / steps``) and
``spec_decode_per_position_acceptance_rates`` (position ``i``: the share of the steps that
proposed a draft there whose draft was accepted; ``r1``, ``r1*r2``, ... in expectation).
A step near the end of a request proposes only the drafts it could still use.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any


class BurstSampler:
    """Seeded sampler of burst lengths (``1 .. num_speculative_tokens + 1``)."""

    __slots__ = ("_draw", "num_speculative_tokens", "rates", "steps")

    def __init__(self, rates: Sequence[float], seed: int, offset: int = 0) -> None:
        self.rates = tuple(float(r) for r in rates)
        self.num_speculative_tokens = len(self.rates)
        # the generator's bound ``random``, looked up once (a lookup per draw cost a third
        # of a burst's sampling)
        self._draw: Callable[[], float] = random.Random(seed + offset).random
        # steps[drafts * (k + 2) + burst]: the steps that proposed ``drafts`` and emitted
        # ``burst`` tokens (k = num_speculative_tokens)
        self.steps = [0] * ((self.num_speculative_tokens + 1) * (self.num_speculative_tokens + 2))

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
        draw = self._draw
        rates = self.rates
        for i in range(drafts):
            if draw() < rates[i]:
                burst += 1
            else:
                break
        steps = self.steps
        index = drafts * (self.num_speculative_tokens + 2) + burst
        steps[index] = steps[index] + 1  # (``+=`` on an item is a generic in-place add)
        return burst


def acceptance_report(samplers: Iterable[BurstSampler | None]) -> dict[str, Any]:
    """The acceptance statistics of a run's samplers; {} without speculative decoding."""
    drafted: list[int] = []
    accepted: list[int] = []
    steps = 0
    any_sampler = False
    for sampler in samplers:
        if sampler is None:
            continue
        any_sampler = True
        k = sampler.num_speculative_tokens
        drafted += [0] * (k - len(drafted))
        accepted += [0] * (k - len(accepted))
        for index, count in enumerate(sampler.steps):
            drafts, burst = divmod(index, k + 2)
            if not count or not drafts:
                continue
            steps += count
            for i in range(drafts):
                drafted[i] += count
            for i in range(burst - 1):
                accepted[i] += count
    if not any_sampler:
        return {}
    draft_tokens, accepted_tokens = sum(drafted), sum(accepted)
    return {
        "spec_decode_num_drafts": steps,
        "spec_decode_draft_tokens": draft_tokens,
        "spec_decode_accepted_tokens": accepted_tokens,
        "spec_decode_acceptance_rate":
            100.0 * accepted_tokens / draft_tokens if draft_tokens else 0.0,
        "spec_decode_acceptance_length": 1.0 + accepted_tokens / steps if steps else 0.0,
        "spec_decode_per_position_acceptance_rates":
            [a / d if d else 0.0 for a, d in zip(accepted, drafted, strict=True)],
    }
