"""The built-in engines, registered through the same hook third-party plugins use."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from servesim.engines.base import Engine, Progress, ReplayResult, Sink
from servesim.engines.kernel.requests import Workload
from servesim.payload import Payload
from servesim.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from servesim.backends import Backend
    from servesim.engines.routing import RouterFactory
    from servesim.timing.registry import TimerFactory
    from servesim.workloads.formats import TraceLoader


class VllmEngine(Engine):
    """vLLM-style continuous batching on aggregated workers (spec §5)."""

    NAME = "vllm"
    MODES = ("aggregated",)
    DESCRIPTION = "vLLM-style continuous batching, chunked prefill, prefix caching"
    # False: the reference step-by-step replay (same report; see engines.kernel.passes)
    bulk_decode: bool = True

    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        from servesim.engines.vllm.engine import replay_aggregated

        role = payload.roles["aggregated"]
        stats = replay_aggregated(role, workload, sink, progress=progress,
                                  bulk_decode=self.bulk_decode, timer=self.timer(role),
                                  policy=self.backend(role), router=self.router(role))
        seconds = stats.end_ms / 1000.0
        return ReplayResult(end_ms=stats.end_ms, gpu_seconds={"aggregated": seconds * role.gpus},
                            passes=stats.passes, extra={**stats.speculation, **stats.host})


class DisaggEngine(Engine):
    """Prefill/decode disaggregation with KV transfer (spec §6)."""

    NAME = "disagg"
    MODES = ("disaggregated",)
    DESCRIPTION = "prefill pool -> KV transfer -> decode pool"
    bulk_decode: bool = True

    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        from servesim.engines.disagg.engine import replay_payload_roles

        return replay_payload_roles(payload, workload, sink, progress=progress,
                                    bulk_decode=self.bulk_decode, engine=self)


@hookimpl
def servesim_register_engines() -> list[type[Engine]]:
    return [VllmEngine, DisaggEngine]


@hookimpl
def servesim_register_backends() -> list[type[Backend]]:
    from servesim.backends import BUILTIN_BACKENDS

    return list(BUILTIN_BACKENDS)


@hookimpl
def servesim_register_timing_providers() -> Mapping[str, TimerFactory]:
    from servesim.timing.registry import PROVIDERS

    return PROVIDERS


@hookimpl
def servesim_register_routers() -> Mapping[str, RouterFactory]:
    from servesim.engines.routing import ROUTERS

    return ROUTERS


@hookimpl
def servesim_register_trace_formats() -> Mapping[str, TraceLoader]:
    from servesim.workloads.formats import BUILTIN_FORMATS

    return BUILTIN_FORMATS
