"""The Engine interface every replay engine (built-in or third-party) implements.

An engine accepts a :class:`~servesim.payload.Payload` (re-checking it with the shared
rules of :mod:`servesim.rules` through :meth:`Engine.validate_payload`) and replays its
workload in virtual time, handing every terminal request to a sink as a
:class:`~servesim.engines.kernel.requests.RequestRecord`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from servesim import codes
from servesim.backends import BUILTIN as BUILTIN_BACKENDS
from servesim.backends import Backend, policy_of
from servesim.engines.kernel.requests import RequestRecord, Workload
from servesim.errors import Diagnostic
from servesim.payload import Payload, RoleArgs
from servesim.rules import check_payload
from servesim.timing.base import StepTimer
from servesim.timing.registry import PROVIDERS, TimerFactory, make_timer

if TYPE_CHECKING:
    from servesim.engines.routing.base import Router, RouterFactory


@attrs.frozen
class ReplayResult:
    """What a replay returns besides the records it streamed to the sink."""

    end_ms: float
    gpu_seconds: dict[str, float]  # per role: worker busy-or-alive seconds x GPUs
    passes: int = 0
    # Engine-specific report keys (e.g. per-role worker seconds), added to the report.
    extra: dict[str, Any] = attrs.field(factory=dict)


Sink = Callable[[RequestRecord], None]
Progress = Callable[[float], None]


OPTIONS_PATH: tuple[str, ...] = ("engine", "options")


def option(default: Any = attrs.NOTHING, *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, help: str | None = None, **kw: Any) -> Any:
    """A field of an engine's ``Options`` class: default, numeric range and help text.

    The range is checked like every servesim limit (``engine.options.<key>: must be in
    [lo, hi], got x [out-of-range]``); ``help`` becomes the key's description in
    ``servesim schema config``.
    """
    return attrs.field(default=default, metadata={"lo": lo, "hi": hi, "lo_open": lo_open,
                                                  "help": help}, **kw)


@attrs.frozen
class NoOptions:
    """An engine without options of its own: ``[engine.options]`` must be empty."""


class Engine(abc.ABC):
    """A replay engine. Subclasses set ``NAME`` and ``MODES`` and implement :meth:`replay`.

    ``Options`` is an attrs class: the schema of the engine's ``[engine.options]`` table
    (every field needs a default). The compiler structures the table with servesim's
    strict converter and writes the result, defaults applied, to ``payload.engine_options``;
    :meth:`options` reads it back.
    """

    NAME: ClassVar[str]
    MODES: ClassVar[tuple[str, ...]] = ("aggregated",)
    DESCRIPTION: ClassVar[str] = ""
    Options: ClassVar[type[Any]] = NoOptions
    # What the engine replays with, handed to it by the plugin registry that made it (the
    # built-ins for an engine made directly): the registered backends' policies, timing
    # providers and routers. Read them through :meth:`timer`, :meth:`backend` and
    # :meth:`router`.
    backends: Mapping[str, Backend] = BUILTIN_BACKENDS
    timing_providers: Mapping[str, TimerFactory] = PROVIDERS
    routers: Mapping[str, RouterFactory] | None = None  # None: the built-in routers

    def timer(self, role: RoleArgs) -> StepTimer:
        """The step timer ``role`` asks for, from the registered timing providers."""
        return make_timer(role, self.timing_providers, self.backends)

    def router(self, role: RoleArgs) -> Router:
        """A fresh router of ``role``'s workers (its routing section; round-robin without
        one), from the registered routers."""
        from servesim.engines.routing.registry import make_router

        return make_router(role) if self.routers is None else make_router(role, self.routers)

    def backend(self, role: RoleArgs) -> Backend:
        """The policy of ``role``'s backend (the payload check refused an unknown one)."""
        return policy_of(role.backend, self.backends)

    @classmethod
    def structure_options(cls, data: Any) -> tuple[Any, list[Diagnostic]]:
        """``data`` as an ``Options`` instance, or ``None`` and ``engine.options`` diagnostics."""
        from servesim.converter import structure_options

        return structure_options(cls.Options, data, OPTIONS_PATH,
                                 f"engine {getattr(cls, 'NAME', cls.__name__)!r}")

    def options(self, payload: Payload) -> Any:
        """The payload's engine options as an ``Options`` instance (PayloadError if wrong)."""
        from servesim.errors import PayloadError

        options, diags = self.structure_options(payload.engine_options)
        if diags:
            raise PayloadError(diags)
        return options

    def check_options(self, options: Any) -> list[Diagnostic]:
        """Rules between option values (types and ranges are already checked); override."""
        return []

    def lower(self, payload: Payload) -> Payload:
        """The compiler's last step for this engine: return ``payload``, possibly evolved.

        Runs after the shared rules passed; ``payload.engine_options`` holds the
        structured options with defaults applied. The default returns it unchanged.
        """
        return payload

    def validate_payload(self, payload: Payload) -> list[Diagnostic]:
        """The shared rules plus this engine's own; an empty list accepts the payload.

        Runs at compile time (after :meth:`lower`) and again when a payload is replayed,
        so a hand-written payload is held to the same rules. Overrides should extend
        ``super().validate_payload(payload)``.
        """
        out = check_payload(payload, self.backends)
        if payload.mode not in self.MODES:
            out.append(Diagnostic(code=codes.ENGINE_MODE, path=("engine", "mode"), stage="lower",
                                  message=f"engine {self.NAME!r} does not run {payload.mode} "
                                  f"deployments (it runs: {', '.join(self.MODES)})"))
        options, diags = self.structure_options(payload.engine_options)
        out.extend(diags)
        if options is not None:
            out.extend(self.check_options(options))
        return out

    @abc.abstractmethod
    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        """Replay ``workload`` on the deployment of ``payload``; stream records to ``sink``."""
