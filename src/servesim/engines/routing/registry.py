"""A role's routing section, checked against the registered routers, and its router.

``[engine.workers.<role>.routing]`` names a router by ``type`` (default ``round_robin``);
its other keys are that router's options, structured by the router's ``Options`` class.
:func:`routing_args` is the one check, run by the compiler's parse pass and again by
:func:`make_router` when a payload is replayed.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

import attrs
import cattrs

from servesim import codes
from servesim.engines.routing.base import Router, RouterFactory
from servesim.engines.routing.builtin import DEFAULT_ROUTER, ROUTERS
from servesim.errors import Diagnostic, Path, ReplayError
from servesim.payload import RoleArgs, RoutingArgs
from servesim.timing.registry import options_class


def routing_path(role: str) -> Path:
    return ("engine", "workers", role, "routing")


def unknown_router(name: str, known: Mapping[str, Any], path: Path) -> Diagnostic:
    names = sorted(known)
    close = difflib.get_close_matches(name, names, n=1)
    return Diagnostic(code=codes.UNKNOWN_ROUTER, path=(*path, "type"),
                      message=f"unknown router {name!r} (registered: {', '.join(names)})",
                      hint=f"did you mean {close[0]!r}?" if close else
                      "is the plugin that provides it installed? `servesim plugins` lists them")


def routing_args(table: Mapping[str, Any], routers: Mapping[str, RouterFactory],
                 path: Path) -> tuple[RoutingArgs | None, list[Diagnostic]]:
    """A routing table (``type`` and the router's options) as the payload carries it,
    options with their defaults applied; or ``None`` and diagnostics under ``path``."""
    name, options, diags = _structured(table, routers, path)
    if diags:
        return None, diags
    return RoutingArgs(type=name, options=cattrs.Converter().unstructure(options)), []


def make_router(role: RoleArgs, routers: Mapping[str, RouterFactory] = ROUTERS) -> Router:
    """A fresh router for one replay of ``role`` (round-robin when the role names none),
    from ``routers`` (a plugin registry's; the built-ins by default)."""
    routing = role.routing or RoutingArgs()
    name, options, problems = _structured({"type": routing.type, **routing.options}, routers,
                                          routing_path(role.worker_type))
    if problems:
        raise ReplayError(problems)
    factory = routers[name]
    if options_class(factory) is None:
        return factory(role)
    return factory(role, options=options)


def _structured(table: Mapping[str, Any], routers: Mapping[str, RouterFactory],
                path: Path) -> tuple[str, Any, list[Diagnostic]]:
    """The router a table names and its options instance, or diagnostics."""
    from servesim.converter import structure_options

    name = table.get("type", DEFAULT_ROUTER)
    if not isinstance(name, str):
        return "", None, [Diagnostic(code=codes.WRONG_TYPE, path=(*path, "type"),
                                     message="expected a router name (a string), got "
                                     f"{type(name).__name__} {name!r:.40}")]
    factory = routers.get(name)
    if factory is None:
        return name, None, [unknown_router(name, routers, path)]
    data = {k: v for k, v in table.items() if k != "type"}
    options, diags = structure_options(options_class(factory) or _NoOptions, data, path,
                                       f"router {name!r}")
    return name, options, diags


@attrs.frozen
class _NoOptions:
    """A router without options: its table holds ``type`` only."""
