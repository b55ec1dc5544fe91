"""Pass 3: cross-layer validate.

Requires: a :class:`ResolvedConfig` (geometry resolved for every role).
Establishes: every shared rule of :mod:`servesim.rules` holds on the resolved values,
for every role; the result is a :class:`ValidatedConfig`. All diagnostics are
collected before failing.

Example: Kimi K3 requesting ``block_size = 128`` resolves to 1536, so
``prefix_match_unit = 128`` with speculation fails here even though 128 equals the
requested block size.
"""

from __future__ import annotations

import attrs

from servesim.compiler.context import CompileContext
from servesim.compiler.model.resolved import ResolvedConfig, ValidatedConfig
from servesim.errors import CompileError
from servesim.rules import check_payload


def validate(cfg: ResolvedConfig, ctx: CompileContext) -> ValidatedConfig:
    p = cfg.payload
    diags = check_payload(p, ctx.registry.backends)
    if diags:
        raise CompileError([attrs.evolve(d, stage="validate") for d in diags])
    return ValidatedConfig(cfg)
