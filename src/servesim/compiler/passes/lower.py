"""Pass 4: lower.

Requires: a :class:`ValidatedConfig`.
Establishes: a versioned :class:`Payload` for the engine the config selects
(``engine.engine``, default by mode) with its structured options, passed through the
engine's ``lower`` and accepted by its payload check (the same shared rules plus anything
engine-specific).
The engine is looked up in the plugin registry, so the compiler names no engine class.
"""

from __future__ import annotations

from servesim import __version__
from servesim.compiler.context import CompileContext
from servesim.compiler.model.resolved import ValidatedConfig
from servesim.errors import CompileError, Diagnostic
from servesim.payload import Payload
from servesim.plugins.manager import plugin_bug


def lower(cfg: ValidatedConfig, ctx: CompileContext) -> Payload:
    r = cfg.resolved
    provenance = {
        "state_cache": {name: meta.get("state_cache", {"source": "disabled"})
                        for name, meta in r.metadata.items()},
        "capacity": {name: meta["capacity"] for name, meta in r.metadata.items()
                     if "capacity" in meta},
    }
    payload = Payload(engine=r.engine, mode=r.mode, roles=dict(r.roles), workload=r.workload,
                      kv_transfer=r.kv_transfer, sla=r.sla, provenance=provenance,
                      engine_options=dict(r.engine_options), gpu_hour_usd=dict(r.gpu_hour_usd),
                      servesim_version=__version__)
    if ctx.registry is not None:
        engine = ctx.registry.get(r.engine)
        if engine is None:
            raise CompileError([Diagnostic(
                code="unknown-engine", path=("engine", "engine"), stage="lower",
                message=f"no engine named {r.engine!r} is registered (registered: "
                f"{', '.join(sorted(ctx.registry.names())) or 'none'})")])
        name = type(engine).__qualname__
        with ctx.registry.guard(r.engine, f"{name}.lower"):
            lowered = engine.lower(payload)
        if not isinstance(lowered, Payload):
            raise plugin_bug(ctx.registry.source_of(r.engine), f"{name}.lower returned "
                             f"{lowered!r:.60}; it returns a servesim.payload.Payload")
        payload = lowered
        diags = ctx.registry.diagnostics(r.engine, f"{name}.validate_payload",
                                         lambda: engine.validate_payload(payload))
        if diags:
            raise CompileError(diags)
    return payload
