"""What a router is and what it sees: the contract between the engines and routers.

A role's requests are spread over its workers by a *router*, one per role and run
(``[engine.workers.<role>.routing]``). The engine asks it once per request, when the
request reaches the role: at arrival for an aggregated or prefill worker, at the handoff
for a P/D decode worker (at arrival too when the backend reserves destination-first). The
router sees the request and one :class:`WorkerState` per worker of the role, as the
replay has them at that instant, and returns the position of the worker it picks.

A router may keep state between requests (a round-robin counter, a session table, a
seeded random generator): the engine builds a fresh one for every replay, so a run
depends on its payload only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from servesim.engines.kernel.requests import RequestSpec


class WorkerState(Protocol):
    """One worker of the role, read-only, at the instant of the decision.

    Each value is computed when it is read (a router that reads nothing costs nothing):
    ``outstanding_requests`` in O(ranks), the others in O(requests on the worker) or, for
    :meth:`cached_prefix_blocks`, O(prompt blocks) per rank (the prompt's block
    identities are computed once per decision).
    """

    @property
    def index(self) -> int:
        """The worker's position in its pool (0-based), as reports name it."""

    @property
    def block_size(self) -> int:
        """Tokens per KV block on this role's workers."""

    @property
    def outstanding_requests(self) -> int:
        """Requests on the worker not finished there: waiting or running on its ranks (a
        P/D decode worker's also while reserved or queued for a reservation)."""

    @property
    def outstanding_tokens(self) -> int:
        """The prompt plus the generated tokens of those requests: the context they hold,
        or will hold, in the worker's KV cache."""

    @property
    def active_blocks(self) -> int:
        """KV blocks in use on the worker's ranks (referenced by a request: running, or a
        P/D source held or destination reserved); a block shared by several counts once."""

    @property
    def waiting_tokens(self) -> int:
        """Prompt tokens of the requests on the worker that hold no KV blocks yet
        (waiting for admission, or queued for a P/D reservation)."""

    def cached_prefix_blocks(self, request: RequestSpec) -> int:
        """How many leading complete blocks of ``request``'s prompt are in the prefix
        cache of one of the worker's ranks (the best rank), now."""


class Router(Protocol):
    """Picks the worker of each request of one role."""

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        """The position in ``workers`` (the role's workers, in pool order) of the worker
        ``request`` goes to."""


# ``factory(role)``, or ``factory(role, options=...)`` for a router with an ``Options``
# class (see :func:`servesim.engines.routing.with_options`): a fresh router per replay.
RouterFactory = Callable[..., Router]
