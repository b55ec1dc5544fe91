"""Diagnostics and the exceptions that carry them.

This module imports nothing else from servesim: every layer (compiler, engines,
workloads, CLI) reports user-facing problems as :class:`Diagnostic` values.

A diagnostic renders on one line as ``path: message [code]``, where ``path`` is the
dotted key path from the root of the TOML document (``engine.workers.decode.kv_cache.block_size``)
or a ``file:line`` location for trace and syntax errors. ``code`` is a stable kebab-case
identifier that scripts may match on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, Protocol

import attrs

from servesim import codes

Severity = Literal["error", "warning"]
Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    """Render a key path: ``("engine", "workers", 0)`` -> ``engine.workers[0]``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


@attrs.frozen
class Diagnostic:
    """One problem with the user's input, located by a key path or a file location."""

    code: str
    message: str
    path: Path = ()
    location: str | None = None  # "file:line:col" for syntax and trace errors
    hint: str | None = None
    stage: str | None = None
    severity: Severity = "error"

    @property
    def where(self) -> str:
        return self.location or format_path(self.path) or "<config>"

    def render(self) -> str:
        text = f"{self.where}: {self.message} [{self.code}]"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def __str__(self) -> str:
        return self.render()


class ServesimError(Exception):
    """Base class: the user's input is wrong; ``diagnostics`` says where and why."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics: tuple[Diagnostic, ...] = tuple(diagnostics)
        super().__init__("\n".join(d.render() for d in self.diagnostics))


class CompileError(ServesimError):
    """A compiler pass found problems with the configuration."""


class PayloadError(ServesimError):
    """An engine refused a payload (wrong version, missing fields, a rule violated)."""


class WorkloadError(ServesimError):
    """A trace or workload definition cannot be replayed (e.g. a malformed trace line)."""


class ReplayError(ServesimError):
    """A replay cannot proceed (e.g. a request that can never be scheduled)."""


class PluginError(ServesimError):
    """A plugin is broken (raised in a hook, registered a duplicate name, ...)."""


class _Labelled(Protocol):
    def label(self) -> str: ...


def plugin_bug(source: _Labelled, message: str, where: str = "") -> PluginError:
    """The error reported when plugin code misbehaves (``source``: the plugin, as
    :class:`servesim.plugins.manager.PluginSource` names it; ``where``: its file and line)."""
    return PluginError([Diagnostic(
        code=codes.PLUGIN_ERROR, location=f"plugin {source.label()}", message=message,
        hint=f"this is a bug in the plugin{where}, not in servesim or your input; report it "
        "to the plugin's authors")])


def error(code: str, path: Path, message: str, hint: str | None = None, *,
          location: str | None = None, stage: str | None = None) -> Diagnostic:
    """A diagnostic as rules and passes write it: ``error(codes.X, path, "why", "what to
    do")``; ``location`` instead of a path for a file position."""
    return Diagnostic(code=code, message=message, path=tuple(path), location=location,
                      hint=hint, stage=stage)
