"""The config compiler: parse -> resolve geometry -> validate -> lower."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesim.compiler.context import CompileContext, Registry
from servesim.compiler.source import SourceText

if TYPE_CHECKING:
    from servesim.compiler.pipeline import STAGES, Stage
    from servesim.payload import Payload

__all__ = ["STAGES", "CompileContext", "SourceText", "compile_file", "compile_source",
           "compile_text"]


def __getattr__(name: str) -> Any:
    """The passes are imported on first use: a module that reads a config's source or
    replays a compiled payload (``servesim replay payload.json``) loads none of them."""
    if name == "STAGES":
        from servesim.compiler.pipeline import STAGES

        return STAGES
    raise AttributeError(f"module 'servesim.compiler' has no attribute {name!r}")


def default_registry() -> Registry:
    """Every installed plugin's registrations: the default of the functions below, for
    callers that pass none (the one place the compiler reaches the plugin manager, at
    call time; the passes see only the :class:`Registry` interface)."""
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager

    return EngineRegistry.collect(get_plugin_manager())


def compile_source(source: SourceText, *, registry: Registry | None = None,
                   stop_after: Stage = "lower",
                   on_stage: Callable[[Stage, Any], None] | None = None) -> Any:
    """Run the pipeline; returns the artifact of ``stop_after`` (a Payload by default)."""
    from servesim.compiler.pipeline import run

    ctx = CompileContext(registry=registry if registry is not None else default_registry(),
                         base_dir=source.base_dir)
    return run(source, ctx, stop_after=stop_after, on_stage=on_stage)


def compile_file(path: str | Path, *, registry: Registry | None = None) -> Payload:
    """Compile a TOML file into a payload; raise CompileError with diagnostics."""
    result: Payload = compile_source(SourceText.from_path(path), registry=registry)
    return result


def compile_text(text: str, *, name: str = "<config>", base_dir: Path | None = None,
                 registry: Registry | None = None) -> Payload:
    """Compile TOML text into a payload; raise CompileError with diagnostics."""
    result: Payload = compile_source(SourceText(text=text, name=name, base_dir=base_dir),
                                     registry=registry)
    return result
