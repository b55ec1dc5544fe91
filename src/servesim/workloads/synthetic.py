"""Synthetic requests and synthetic sessions.

Token identities (all *distinct* segments, so every token is unique unless shared on
purpose):

- key 0: the ``cached_prefix_tokens`` prefix every synthetic request shares;
- keys ``1 .. prefix_groups``: the shared prefix of each session prefix group;
- key ``1 + prefix_groups + request_id``: a request's own new input.

A session turn's prompt is the previous turn's prompt, then the previous turn's output
(``generated_key(previous_request_id)``, ``output_tokens_per_turn`` long), then the turn's
new input.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator

import attrs

from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key
from servesim.workloads.spec import SessionSource, SyntheticSource

PREFIX_KEY = 0


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def spread_length(length: int, ratio: float, index: int) -> int:
    """Request ``index``'s length when lengths spread over ``length x (1 -/+ ratio)``:
    ``u = frac(index x 2654435761 / 2**32)`` (Knuth's multiplicative hash, which visits
    [0, 1) evenly) places it in the range; at least one token unless ``length`` is 0."""
    if ratio <= 0 or length <= 0:
        return length
    u = ((index * 2654435761) % 4294967296) / 4294967296.0
    return max(1, round(length * (1 + ratio * (2 * u - 1))))


@attrs.define(slots=True)
class SyntheticRequest:
    """A one-turn unit: request ``index`` of a synthetic workload."""

    source: SyntheticSource
    index: int

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        src = self.source
        prompt = (
            Segment(PREFIX_KEY, src.cached_prefix_tokens, repeat=False),
            Segment(1 + self.index, src.input_tokens - src.cached_prefix_tokens, repeat=False),
        )
        output = spread_length(src.output_tokens, src.output_range_ratio or 0.0, self.index)
        return RequestSpec(request_id=self.index, arrival_ms=arrival_ms or 0.0, prompt=prompt,
                           input_length=src.input_tokens, output_length=output)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        return None


def synthetic_requests(source: SyntheticSource) -> Iterator[SyntheticRequest]:
    i = 0
    while True:
        yield SyntheticRequest(source, i)
        i += 1


def shared_prefix_tokens(source: SessionSource) -> int:
    """Tokens of a session's first prompt shared within its prefix group."""
    n = source.new_input_tokens_per_turn
    if source.shared_prefix_ratio <= 0 or source.prefix_groups <= 0:
        return 0
    block = source.block_size or 1
    blocks = -(-n // block)
    return min(n, _round_half_up(blocks * source.shared_prefix_ratio) * block)


@attrs.define(slots=True)
class SyntheticSession:
    """Session ``index``: ``turns`` requests with ids ``index * turns + k``."""

    source: SessionSource
    index: int
    group: int | None
    shared_tokens: int

    def _key(self, request_id: int) -> int:
        return 1 + self.source.prefix_groups + request_id

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        src = self.source
        rid = self.index * src.turns
        n = src.new_input_tokens_per_turn
        segments = []
        if self.group is not None:
            segments.append(Segment(1 + self.group, self.shared_tokens, repeat=False))
        segments.append(Segment(self._key(rid), n - self.shared_tokens if self.group is not None
                                else n, repeat=False))
        return RequestSpec(request_id=rid, arrival_ms=arrival_ms or 0.0,
                           prompt=segments, input_length=n,
                           output_length=src.output_tokens_per_turn,
                           session_id=f"session_{self.index}", turn_index=0)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        src = self.source
        turn = previous.turn_index + 1
        if turn >= src.turns:
            return None
        rid = previous.request_id + 1
        n = src.new_input_tokens_per_turn
        prompt = (
            *previous.prompt,
            Segment(generated_key(previous.request_id), previous.output_length, repeat=False),
            Segment(self._key(rid), n, repeat=False),
        )
        return RequestSpec(request_id=rid, arrival_ms=end_ms + src.inter_turn_delay_ms,
                           prompt=prompt,
                           input_length=previous.input_length + previous.output_length + n,
                           output_length=src.output_tokens_per_turn,
                           session_id=previous.session_id, turn_index=turn)


def synthetic_sessions(source: SessionSource, seed: int) -> Iterator[SyntheticSession]:
    """Sessions in index order; prefix groups drawn from an RNG seeded by ``seed``."""
    shared = shared_prefix_tokens(source)
    rng = random.Random(f"{seed}:prefix-groups")
    s = 0
    while True:
        group = rng.randrange(source.prefix_groups) if shared > 0 else None
        yield SyntheticSession(source, s, group, shared)
        s += 1
