"""What every pass may consult besides its input: the plugin registry, the config's folder.

The compiler owns the :class:`Registry` interface it reads; the plugin manager's
``EngineRegistry`` implements it, so the compiler never imports the plugins package.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from servesim.engines.base import Engine
    from servesim.errors import Diagnostic


class PluginLabel(Protocol):
    def label(self) -> str: ...


class Registry(Protocol):
    """The engines, backends, timing providers, routers and trace formats plugins
    registered, by name."""

    @property
    def backends(self) -> Mapping[str, Any]: ...

    @property
    def timing_providers(self) -> Mapping[str, Any]: ...

    @property
    def trace_formats(self) -> Mapping[str, Any]: ...

    @property
    def routers(self) -> Mapping[str, Any]: ...

    def names(self) -> list[str]: ...

    def get(self, name: str) -> Engine | None: ...

    def engine_class(self, name: str) -> type[Engine] | None: ...

    def guard(self, engine: str, hook: str) -> AbstractContextManager[None]:
        """Report an exception raised by the engine's ``hook`` as the plugin's error."""

    def diagnostics(self, engine: str, hook: str, call: Callable[[], Any]
                    ) -> list[Diagnostic]:
        """What ``call`` (the engine's ``hook``) returns, guarded and checked."""

    def source_of(self, engine: str) -> PluginLabel:
        """The plugin that registered ``engine`` (named in errors)."""


@attrs.frozen
class CompileContext:
    registry: Registry
    base_dir: Path | None = None  # relative trace paths resolve against the config's folder
