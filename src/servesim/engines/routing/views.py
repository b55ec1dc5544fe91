"""The routers' view of a pool of pass workers (each a
:class:`~servesim.engines.routing.base.WorkerState`).

A view reads its worker only when a router asks, and first brings the worker to where the
stepwise replay has it at this instant (the engine's ``touch``: a steady decode segment in
flight is applied up to now), so a routing decision is the same with and without the bulk
advance. A router that reads nothing (round-robin) touches nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from servesim.engines.kernel.passes import PassWorker
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import BlockIds, block_ids
from servesim.engines.routing.base import Router


class WorkerView:
    """One worker as a router sees it (see :class:`~servesim.engines.routing.base.WorkerState`)."""

    __slots__ = ("_pool", "_worker")

    def __init__(self, pool: RoutedPool, worker: PassWorker) -> None:
        self._pool = pool
        self._worker = worker

    @property
    def index(self) -> int:
        return self._worker.index

    @property
    def block_size(self) -> int:
        return self._worker.ranks[0].block_size

    def _ranks(self) -> list[Any]:
        self._pool.touched = True
        self._pool.touch(self._worker)
        return self._worker.ranks

    @property
    def outstanding_requests(self) -> int:
        return sum(rank.load for rank in self._ranks())

    @property
    def outstanding_tokens(self) -> int:
        return sum(seq.prompt_len + seq.generated for rank in self._ranks()
                   for seq in _seqs(rank)) + sum(
            flight.spec.input_length for rank in self._ranks()
            for flight in getattr(rank, "handoffs", ()))

    @property
    def active_blocks(self) -> int:
        return sum(rank.pool.num_active for rank in self._ranks())

    @property
    def waiting_tokens(self) -> int:
        return sum(spec.input_length for rank in self._ranks() for spec in _queued(rank))

    def cached_prefix_blocks(self, request: RequestSpec) -> int:
        hashes = self._pool.hashes(request, self.block_size)
        return max(rank.pool.cached_prefix(hashes) for rank in self._ranks())


def _seqs(rank: Any) -> Iterator[Any]:
    """The requests on a rank: waiting, running, and a P/D decode rank's reserved and
    materialized destinations."""
    yield from rank.waiting
    yield from rank.running
    yield from getattr(rank, "reserved", ())
    yield from getattr(rank, "materialized", ())


def _queued(rank: Any) -> Iterator[RequestSpec]:
    """The requests of a rank that hold no KV yet: waiting, and P/D handoffs queued for a
    reservation."""
    for seq in rank.waiting:
        yield seq.spec
    for flight in getattr(rank, "handoffs", ()):
        yield flight.spec


class RoutedPool:
    """A pool's workers behind its router: :meth:`route` picks the worker of a request."""

    def __init__(self, router: Router, workers: Sequence[PassWorker],
                 touch: Callable[[Any], None]) -> None:
        self.router = router
        self.workers = workers
        self.touch = touch
        self.views = [WorkerView(self, w) for w in workers]
        self.touched = False  # the last decision read state that ends steady segments
        self._hashed: tuple[RequestSpec | None, int, BlockIds] = (None, 0, BlockIds())

    def route(self, request: RequestSpec) -> Any:
        """The worker ``request`` goes to."""
        self.touched = False
        return self.workers[self.router.route(request, self.views)]

    def hashes(self, request: RequestSpec, block_size: int) -> BlockIds:
        """The identities of ``request``'s complete prompt blocks (computed once per
        decision)."""
        spec, size, hashes = self._hashed
        if spec is not request or size != block_size:
            hashes = BlockIds()
            block_ids(request.prompt, block_size, hashes, request.input_length)
            self._hashed = (request, block_size, hashes)
        return hashes
