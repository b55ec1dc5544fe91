"""The config compiler: parse -> resolve geometry -> validate -> lower."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from servesim.compiler.context import CompileContext
from servesim.compiler.pipeline import STAGES, Stage, run
from servesim.compiler.source import SourceText
from servesim.payload import Payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager

__all__ = ["STAGES", "CompileContext", "SourceText", "compile_file", "compile_source",
           "compile_text"]


def default_registry() -> EngineRegistry:
    return EngineRegistry.collect(get_plugin_manager())


def compile_source(source: SourceText, *, registry: EngineRegistry | None = None,
                   stop_after: Stage = "lower",
                   on_stage: Callable[[Stage, Any], None] | None = None) -> Any:
    """Run the pipeline; returns the artifact of ``stop_after`` (a Payload by default)."""
    ctx = CompileContext(registry=registry if registry is not None else default_registry(),
                         base_dir=source.base_dir)
    return run(source, ctx, stop_after=stop_after, on_stage=on_stage)


def compile_file(path: str | Path, *, registry: EngineRegistry | None = None) -> Payload:
    """Compile a TOML file into a payload; raise CompileError with diagnostics."""
    result: Payload = compile_source(SourceText.from_path(path), registry=registry)
    return result


def compile_text(text: str, *, name: str = "<config>", base_dir: Path | None = None,
                 registry: EngineRegistry | None = None) -> Payload:
    """Compile TOML text into a payload; raise CompileError with diagnostics."""
    result: Payload = compile_source(SourceText(text=text, name=name, base_dir=base_dir),
                                     registry=registry)
    return result
