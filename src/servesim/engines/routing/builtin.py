"""The built-in routers: ``round_robin`` (the default), ``least_loaded``,
``session_affinity`` and ``kv_aware``.

``kv_aware`` follows NVIDIA Dynamo's KV router: each worker's cost, in KV blocks, is ::

    cost(w) = overlap_weight * prefill_blocks(w) + decode_blocks(w)
    prefill_blocks(w) = (input_tokens - block_size * cached_prefix_blocks(w)) / block_size
    decode_blocks(w)  = active_blocks(w) + waiting_tokens(w) / block_size

``prefill_blocks`` is the prompt still to compute on ``w`` after the prefix its ranks hold
now; ``decode_blocks`` the KV the worker's requests hold plus the prompts queued on it
(so requests routed at the same instant see each other). With ``temperature = 0`` the
cheapest worker wins, the lowest position among equal costs; with ``temperature > 0``
worker ``w`` is drawn with probability proportional to
``exp(-(cost(w) - min) / ((max - min) * temperature))`` (costs normalised to [0, 1] as
Dynamo does; all equal: uniform), from a generator seeded with ``seed``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Literal

import attrs

from servesim import limits
from servesim.engines.base import option
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.routing.base import Router, RouterFactory, WorkerState
from servesim.payload import RoleArgs
from servesim.timing.registry import with_options

DEFAULT_ROUTER = "round_robin"
WEIGHT_MAX = 1e6


class RoundRobin:
    """Worker 0, 1, ..., n-1, 0, ... in arrival order; reads no worker state."""

    def __init__(self) -> None:
        self.next = 0

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        chosen = self.next
        self.next = (chosen + 1) % len(workers)
        return chosen


@attrs.frozen
class LeastLoadedOptions:
    by: Literal["requests", "tokens"] = option(
        "requests", help="what counts as load: outstanding requests, or their tokens "
        "(prompt plus generated)")


class LeastLoaded:
    """The worker with the fewest outstanding requests (or tokens); the first of them."""

    def __init__(self, by: str = "requests") -> None:
        self.tokens = by == "tokens"

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        return argmin([w.outstanding_tokens if self.tokens else w.outstanding_requests
                       for w in workers])


@attrs.frozen
class SessionAffinityOptions:
    fallback: Literal["least_loaded", "round_robin"] = option(
        "least_loaded", help="how a session's first turn (and a request without a session) "
        "is placed")


class SessionAffinity:
    """Every turn of a session on the worker that served its first turn; the first turn
    (and a request without a session) placed by the fallback router."""

    def __init__(self, fallback: Router) -> None:
        self.fallback = fallback
        self.home: dict[str, int] = {}

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        session = request.session_id
        chosen = self.home.get(session) if session is not None else None
        if chosen is None:
            chosen = self.fallback.route(request, workers)
            if session is not None:
                self.home[session] = chosen
        return chosen


@attrs.frozen
class KvAwareOptions:
    overlap_weight: float = option(
        1.0, lo=0.0, hi=WEIGHT_MAX,
        help="weight of the prompt blocks still to prefill against the decode load "
        "(0: load balancing only)")
    temperature: float = option(
        0.0, lo=0.0, hi=WEIGHT_MAX,
        help="0: the cheapest worker; above 0: softmax sampling over normalised costs")
    seed: int = option(42, lo=0, hi=limits.U64_MAX, help="seed of the sampling "
                       "(temperature > 0)")


class KvAware:
    """Dynamo's KV router cost (see the module docstring)."""

    def __init__(self, options: KvAwareOptions) -> None:
        self.weight = options.overlap_weight
        self.temperature = options.temperature
        self.rng = random.Random(options.seed)

    def costs(self, request: RequestSpec, workers: Sequence[WorkerState]) -> list[float]:
        out = []
        for w in workers:
            bs = w.block_size
            prefill = (request.input_length - bs * w.cached_prefix_blocks(request)) / bs
            decode = w.active_blocks + w.waiting_tokens / bs
            out.append(self.weight * prefill + decode)
        return out

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        costs = self.costs(request, workers)
        if self.temperature == 0.0:
            return argmin(costs)
        return softmax_sample(costs, self.temperature, self.rng.random())


def argmin(values: Sequence[float]) -> int:
    """The position of the smallest value, the first of equal ones."""
    best = 0
    for i in range(1, len(values)):
        if values[i] < values[best]:
            best = i
    return best


def softmax_sample(costs: Sequence[float], temperature: float, u: float) -> int:
    """The position drawn by ``u`` (uniform in [0, 1)) from the softmax of the negated
    costs normalised to [0, 1] and divided by ``temperature``."""
    lo, hi = min(costs), max(costs)
    if lo == hi:
        weights = [1.0] * len(costs)
    else:
        scale = (hi - lo) * temperature
        weights = [math.exp(-(c - lo) / scale) for c in costs]
    target = u * sum(weights)
    acc = 0.0
    for i, weight in enumerate(weights):
        acc += weight
        if target < acc:
            return i
    return len(costs) - 1


def _round_robin(role: RoleArgs) -> Router:
    """Requests in turn over the workers (the default)."""
    return RoundRobin()


@with_options(LeastLoadedOptions)
def _least_loaded(role: RoleArgs, options: LeastLoadedOptions) -> Router:
    """The worker with the fewest outstanding requests or tokens."""
    return LeastLoaded(options.by)


@with_options(SessionAffinityOptions)
def _session_affinity(role: RoleArgs, options: SessionAffinityOptions) -> Router:
    """A session's turns on the worker of its first turn."""
    fallback: Router = RoundRobin() if options.fallback == "round_robin" else LeastLoaded()
    return SessionAffinity(fallback)


@with_options(KvAwareOptions)
def _kv_aware(role: RoleArgs, options: KvAwareOptions) -> Router:
    """Dynamo's KV router: prefix overlap against decode load."""
    return KvAware(options)


ROUTERS: Mapping[str, RouterFactory] = MappingProxyType({
    "round_robin": _round_robin, "least_loaded": _least_loaded,
    "session_affinity": _session_affinity, "kv_aware": _kv_aware})
