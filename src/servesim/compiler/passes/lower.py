"""Pass 4: lower.

Requires: a :class:`ValidatedConfig`.
Establishes: a versioned :class:`Payload` for the engine the config selects
(``engine.engine``, default by mode) with its structured options, passed through the
engine's ``lower`` and accepted by its payload check (the same shared rules plus anything
engine-specific).
The engine is looked up in the plugin registry, so the compiler names no engine class.
"""

from __future__ import annotations

from servesim import codes
from servesim.compiler.context import CompileContext
from servesim.compiler.model.resolved import ValidatedConfig
from servesim.errors import CompileError, Diagnostic, plugin_bug
from servesim.payload import Payload


def lower(cfg: ValidatedConfig, ctx: CompileContext) -> Payload:
    payload = cfg.resolved.payload
    name = payload.engine
    engine = ctx.registry.get(name)
    if engine is None:
        raise CompileError([Diagnostic(
            code=codes.UNKNOWN_ENGINE, path=("engine", "engine"), stage="lower",
            message=f"no engine named {name!r} is registered (registered: "
            f"{', '.join(sorted(ctx.registry.names())) or 'none'})")])
    hook = type(engine).__qualname__
    with ctx.registry.guard(name, f"{hook}.lower"):
        lowered = engine.lower(payload)
    if not isinstance(lowered, Payload):
        raise plugin_bug(ctx.registry.source_of(name), f"{hook}.lower returned "
                         f"{lowered!r:.60}; it returns a servesim.payload.Payload")
    diags = ctx.registry.diagnostics(name, f"{hook}.validate_payload",
                                     lambda: engine.validate_payload(lowered))
    if diags:
        raise CompileError(diags)
    return lowered
