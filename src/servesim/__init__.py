"""servesim: a GPU-free simulator of LLM serving deployments.

The public surface: compile a config (:func:`compile_file`, :func:`compile_text`),
replay a payload (:func:`replay`, or :func:`replay_payload` with its options: both
return a :class:`ReplayOutcome`), and write engine plugins (:data:`hookimpl`,
:class:`Engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servesim import build_info
from servesim.version import __version__

# compiled modules that are stale, or another environment's, never shadow the source
build_info.install()

__all__ = [
    "CompileError",
    "Diagnostic",
    "Engine",
    "Payload",
    "ReplayOutcome",
    "__version__",
    "compile_file",
    "compile_text",
    "hookimpl",
    "replay",
    "replay_payload",
]

_EXPORTS = {
    "CompileError": "servesim.errors",
    "Diagnostic": "servesim.errors",
    "Engine": "servesim.engines.base",
    "Payload": "servesim.payload",
    "compile_file": "servesim.compiler",
    "compile_text": "servesim.compiler",
    "hookimpl": "servesim.plugins.hookspecs",
    "ReplayOutcome": "servesim.replay",
    "replay": "servesim.replay",
    "replay_payload": "servesim.replay",
}

if TYPE_CHECKING:
    from servesim.compiler import compile_file, compile_text
    from servesim.engines.base import Engine
    from servesim.errors import CompileError, Diagnostic
    from servesim.payload import Payload
    from servesim.plugins.hookspecs import hookimpl
    from servesim.replay import ReplayOutcome, replay, replay_payload


def __getattr__(name: str) -> Any:
    """Import the public names lazily: ``import servesim`` stays cheap."""
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'servesim' has no attribute {name!r}")
