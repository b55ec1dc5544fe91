"""The compiler as data: an ordered tuple of named passes.

``run(source, ctx, stop_after="resolve")`` runs the passes in order and returns the
artifact of the last one run; ``on_stage(name, artifact)`` is called after each pass
(``servesim compile --stop-after`` and ``servesim inspect`` use it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from servesim.compiler.context import CompileContext
from servesim.compiler.passes.lower import lower
from servesim.compiler.passes.parse import parse
from servesim.compiler.passes.resolve_geometry import resolve_geometry
from servesim.compiler.passes.validate import validate
from servesim.compiler.source import SourceText
from servesim.errors import ServesimError

Stage = Literal["parse", "resolve", "validate", "lower"]
STAGES: tuple[Stage, ...] = ("parse", "resolve", "validate", "lower")
PIPELINE: tuple[tuple[Stage, Callable[[Any, CompileContext], Any]], ...] = (
    ("parse", parse),
    ("resolve", resolve_geometry),
    ("validate", validate),
    ("lower", lower),
)


def run(source: SourceText, ctx: CompileContext, *, stop_after: Stage = "lower",
        on_stage: Callable[[Stage, Any], None] | None = None) -> Any:
    """Run the passes up to ``stop_after``; a failing pass raises CompileError.

    The passes read the plugins' engines, backends and providers from ``ctx.registry``."""
    artifact: Any = source
    for name, fn in PIPELINE:
        try:
            artifact = fn(artifact, ctx)
        except ServesimError:
            raise
        except Exception as exc:  # a bug: keep the traceback, name the stage
            exc.add_note(f"(in servesim compiler stage {name!r})")
            raise
        if on_stage is not None:
            on_stage(name, artifact)
        if name == stop_after:
            break
    return artifact
