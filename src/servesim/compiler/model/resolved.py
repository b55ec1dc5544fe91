"""ResolvedConfig: every value the engines will run with, and where each came from."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from servesim.compiler.model.parsed import ParsedConfig
from servesim.payload import GpuPriceArgs, KvTransferArgs, RoleArgs, SlaArgs

Origin = Literal["authored", "defaulted", "derived"]


@attrs.frozen
class Provenance:
    """How a resolved value was obtained; ``formula`` explains a derived one."""

    origin: Origin
    formula: str | None = None


@attrs.frozen
class ResolvedConfig:
    """Stage 2 output: per-role engine arguments with resolved geometry.

    ``provenance`` maps a dotted config path (``engine.workers.decode.kv_cache.block_size``)
    to how its value was obtained. ``metadata`` carries per-role sizing details
    (state-cache inference inputs, capacity breakdown) that are reported, not run.
    """

    parsed: ParsedConfig
    engine: str
    mode: Literal["aggregated", "disaggregated"]
    roles: dict[str, RoleArgs]
    workload: dict[str, Any]
    kv_transfer: KvTransferArgs | None = None
    sla: SlaArgs | None = None
    provenance: dict[str, Provenance] = attrs.field(factory=dict)
    metadata: dict[str, Any] = attrs.field(factory=dict)
    engine_options: dict[str, Any] = attrs.field(factory=dict)  # the engine's, defaults applied
    gpu_hour_usd: dict[str, GpuPriceArgs] = attrs.field(factory=dict)  # by the roles' hardware


@attrs.frozen
class ValidatedConfig:
    """Stage 3 output: a ResolvedConfig every shared rule accepted."""

    resolved: ResolvedConfig
