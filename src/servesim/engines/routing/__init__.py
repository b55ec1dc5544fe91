"""Request routing across the workers of a role (``[engine.workers.<role>.routing]``).

Routers are registered like engines and timing providers, through the
``servesim_register_routers`` hook; the built-ins are ``round_robin`` (the default),
``least_loaded``, ``session_affinity`` and ``kv_aware`` (:mod:`.builtin`). A router sees
the request and a read-only :class:`WorkerState` per worker (:mod:`.base`).
"""

from __future__ import annotations

from servesim.engines.routing.base import Router, RouterFactory, WorkerState
from servesim.engines.routing.builtin import DEFAULT_ROUTER, ROUTERS
from servesim.engines.routing.registry import make_router, routing_args
from servesim.timing.registry import with_options

__all__ = ["DEFAULT_ROUTER", "ROUTERS", "Router", "RouterFactory", "WorkerState",
           "make_router", "routing_args", "with_options"]
