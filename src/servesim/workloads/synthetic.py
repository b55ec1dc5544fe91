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
from array import array
from collections.abc import Callable, Iterator

import attrs

from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import Segment, extend_prompt, generated_key
from servesim.workloads.lengths import LengthDistribution, make_sampler
from servesim.workloads.spec import DEFAULT_POISSON_SEED, SessionSource, SyntheticSource

PREFIX_KEY = 0
DEFAULT_SEED = DEFAULT_POISSON_SEED  # of lengths a hand-written payload draws unseeded
Rows = Callable[[LengthDistribution, str], "array[int]"]


def no_rows(d: LengthDistribution, name: str) -> array[int]:
    raise AssertionError("an empirical length needs the rows of its file")


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
    """A one-turn unit: request ``index`` of a synthetic workload, its lengths drawn."""

    source: SyntheticSource
    index: int
    input_length: int
    output_length: int

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        cached = self.source.cached_prefix_tokens
        prompt = (
            Segment(PREFIX_KEY, cached, repeat=False),
            Segment(1 + self.index, self.input_length - cached, repeat=False),
        )
        return RequestSpec(request_id=self.index, arrival_ms=arrival_ms or 0.0, prompt=prompt,
                           input_length=self.input_length, output_length=self.output_length)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        return None


def synthetic_requests(source: SyntheticSource, rows: Rows = no_rows
                       ) -> Iterator[SyntheticRequest]:
    """Requests in index order, their lengths drawn in that order (same seed, same
    lengths, whatever the load)."""
    seed = DEFAULT_SEED if source.seed is None else source.seed
    draw_input = make_sampler(source.input_tokens, seed, "input", rows)
    draw_output = make_sampler(source.output_tokens, seed, "output", rows)
    ratio = source.output_range_ratio or 0.0
    i = 0
    while True:
        isl = draw_input()
        osl = draw_output()
        if isinstance(source.output_tokens, int):
            osl = spread_length(osl, ratio, i)
        yield SyntheticRequest(source, i, isl, osl)
        i += 1


def shared_prefix_tokens(source: SessionSource, first_input: int | None = None) -> int:
    """Tokens of a session's first prompt (``first_input`` tokens, default the fixed
    ``new_input_tokens_per_turn``) shared within its prefix group."""
    n = first_input if first_input is not None else source.new_input_tokens_per_turn
    assert isinstance(n, int)
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
    inputs: tuple[int, ...]  # new input tokens of each turn
    outputs: tuple[int, ...]  # output tokens of each turn

    def _key(self, request_id: int) -> int:
        return 1 + self.source.prefix_groups + request_id

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        src = self.source
        rid = self.index * src.turns
        n = self.inputs[0]
        segments = []
        if self.group is not None:
            segments.append(Segment(1 + self.group, self.shared_tokens, repeat=False))
        segments.append(Segment(self._key(rid), n - self.shared_tokens if self.group is not None
                                else n, repeat=False))
        return RequestSpec(request_id=rid, arrival_ms=arrival_ms or 0.0,
                           prompt=segments, input_length=n, output_length=self.outputs[0],
                           session_id=f"session_{self.index}", turn_index=0)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        src = self.source
        turn = previous.turn_index + 1
        if turn >= src.turns:
            return None
        rid = previous.request_id + 1
        n = self.inputs[turn]
        prompt = extend_prompt(previous.prompt, (
            Segment(generated_key(previous.request_id), previous.output_length, repeat=False),
            Segment(self._key(rid), n, repeat=False),
        ))
        return RequestSpec(request_id=rid, arrival_ms=end_ms + src.inter_turn_delay_ms,
                           prompt=prompt,
                           input_length=previous.input_length + previous.output_length + n,
                           output_length=self.outputs[turn],
                           session_id=previous.session_id, turn_index=turn,
                           extends=previous.request_id)


def synthetic_sessions(source: SessionSource, seed: int, rows: Rows = no_rows
                       ) -> Iterator[SyntheticSession]:
    """Sessions in index order; prefix groups drawn from an RNG seeded by ``seed``, the
    turns' lengths drawn when the session starts (from ``source.seed``, else ``seed``)."""
    rng = random.Random(f"{seed}:prefix-groups")
    length_seed = seed if source.seed is None else source.seed
    draw_input = make_sampler(source.new_input_tokens_per_turn, length_seed, "input", rows)
    draw_output = make_sampler(source.output_tokens_per_turn, length_seed, "output", rows)
    turns = range(source.turns)
    s = 0
    while True:
        inputs = tuple(draw_input() for _ in turns)
        outputs = tuple(draw_output() for _ in turns)
        shared = shared_prefix_tokens(source, inputs[0])
        group = rng.randrange(source.prefix_groups) if shared > 0 else None
        yield SyntheticSession(source, s, group, shared, inputs, outputs)
        s += 1
