"""The hook implementations servesim finds through the ``servesim`` entry point."""

from __future__ import annotations

from collections.abc import Mapping

from servesim import hookimpl
from servesim.engines.base import Engine
from servesim.timing.registry import TimerFactory
from servesim.workloads.formats import TraceLoader, request_format
from servesim_static_batch.engine import StaticBatchEngine
from servesim_static_batch.extras import linear_timer, read_csv


@hookimpl
def servesim_register_engines() -> list[type[Engine]]:
    return [StaticBatchEngine]


@hookimpl
def servesim_register_timing_providers() -> Mapping[str, TimerFactory]:
    return {"linear": linear_timer}


@hookimpl
def servesim_register_trace_formats() -> Mapping[str, TraceLoader]:
    return {"csv": request_format(read_csv)}
