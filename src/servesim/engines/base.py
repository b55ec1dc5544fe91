"""The Engine interface every replay engine (built-in or third-party) implements.

An engine accepts a :class:`~servesim.payload.Payload` (re-checking it with the shared
rules of :mod:`servesim.rules` through :meth:`Engine.validate_payload`) and replays its
workload in virtual time, handing every terminal request to a sink as a
:class:`~servesim.engines.kernel.requests.RequestRecord`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from servesim.engines.kernel.requests import RequestRecord, Workload
from servesim.errors import Diagnostic
from servesim.payload import Payload
from servesim.rules import check_deployment


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


class Engine(abc.ABC):
    """A replay engine. Subclasses set ``NAME`` and ``MODES`` and implement :meth:`replay`."""

    NAME: ClassVar[str]
    MODES: ClassVar[tuple[str, ...]] = ("aggregated",)
    DESCRIPTION: ClassVar[str] = ""

    def validate_payload(self, payload: Payload) -> list[Diagnostic]:
        """The shared rules plus this engine's own; an empty list accepts the payload."""
        out = check_deployment(payload.mode, payload.roles, payload.kv_transfer)
        if payload.mode not in self.MODES:
            out.append(Diagnostic(code="engine-mode", path=("engine", "mode"), stage="lower",
                                  message=f"engine {self.NAME!r} does not run {payload.mode} "
                                  f"deployments (it runs: {', '.join(self.MODES)})"))
        return out

    @abc.abstractmethod
    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        """Replay ``workload`` on the deployment of ``payload``; stream records to ``sink``."""
