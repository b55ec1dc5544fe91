"""The resolved stage: the payload every later stage runs with, and where each value came from."""

from __future__ import annotations

from typing import Any, Literal

import attrs
import cattrs

from servesim.compiler.model.parsed import ParsedConfig
from servesim.payload import Payload, drop_none, payload_to_dict

Origin = Literal["authored", "defaulted", "derived"]


@attrs.frozen
class Provenance:
    """How a resolved value was obtained; ``formula`` explains a derived one."""

    origin: Origin
    formula: str | None = None


@attrs.frozen
class ResolvedConfig:
    """Stage 2 output: the payload (every value resolved, before the engine's ``lower``)
    and its provenance.

    ``provenance`` maps a dotted config path (``engine.workers.decode.kv_cache.block_size``)
    to how its value was obtained. ``metadata`` carries per-role sizing details
    (state-cache inference inputs, capacity breakdown) that are reported, not run.
    """

    parsed: ParsedConfig
    payload: Payload
    provenance: dict[str, Provenance] = attrs.field(factory=dict)
    metadata: dict[str, Any] = attrs.field(factory=dict)

    def to_data(self) -> dict[str, Any]:
        """JSON-ready form: the payload's values, their provenance and the metadata."""
        data = payload_to_dict(self.payload)
        conv = cattrs.Converter()
        return {
            "engine": data["engine"], "mode": data["mode"],
            # a plugin engine's [engine.options], defaults applied (absent when it has none)
            **({"engine_options": data["engine_options"]} if data["engine_options"] else {}),
            "roles": data["roles"], "kv_transfer": data["kv_transfer"],
            "workload": data["workload"], "sla": data["sla"],
            "gpu_hour_usd": data["gpu_hour_usd"],
            "provenance": {k: drop_none(conv.unstructure(v))
                           for k, v in sorted(self.provenance.items())},
            "metadata": self.metadata,
        }


@attrs.frozen
class ValidatedConfig:
    """Stage 3 output: a ResolvedConfig every shared rule accepted."""

    resolved: ResolvedConfig

    def to_data(self) -> dict[str, Any]:
        return self.resolved.to_data()
