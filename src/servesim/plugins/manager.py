"""Plugin manager factory and the engine registry built from it. No global manager."""

from __future__ import annotations

import os
from collections.abc import Iterable
from types import ModuleType

import pluggy

from servesim.engines.base import Engine
from servesim.errors import Diagnostic, ServesimError
from servesim.plugins import hookspecs

ENTRY_POINT_GROUP = "servesim"
DISABLE_AUTOLOAD_ENV = "SERVESIM_DISABLE_PLUGIN_AUTOLOAD"


class PluginError(ServesimError):
    """A plugin is broken (raised in a hook, registered a duplicate name, ...)."""


def get_plugin_manager(*, load_entrypoints: bool = True,
                       plugins: Iterable[object | ModuleType] = ()) -> pluggy.PluginManager:
    """A fresh manager with the built-ins, ``plugins``, and (unless disabled) entry points."""
    from servesim.plugins import builtin

    pm = pluggy.PluginManager("servesim")
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name="servesim.builtin")
    for plugin in plugins:
        pm.register(plugin)
    if load_entrypoints and not os.environ.get(DISABLE_AUTOLOAD_ENV):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as exc:
            raise PluginError([Diagnostic(code="plugin-load-failed", path=(),
                                          message=f"loading a '{ENTRY_POINT_GROUP}' entry-point "
                                          f"plugin failed: {type(exc).__name__}: {exc}")]) from exc
    pm.check_pending()
    return pm


class EngineRegistry:
    """Engines by name, collected from ``servesim_register_engines`` of every plugin."""

    def __init__(self, engines: dict[str, tuple[type[Engine], str]]) -> None:
        self._engines = engines

    @classmethod
    def collect(cls, pm: pluggy.PluginManager) -> EngineRegistry:
        engines: dict[str, tuple[type[Engine], str]] = {}
        for impl in pm.hook.servesim_register_engines.get_hookimpls():
            plugin_name = impl.plugin_name
            try:
                classes: list[type[Engine]] = list(impl.function())  # type: ignore[call-overload]
            except Exception as exc:
                raise PluginError([Diagnostic(
                    code="plugin-hook-failed", path=(),
                    message=f"plugin {plugin_name!r} raised in servesim_register_engines: "
                    f"{type(exc).__name__}: {exc}")]) from exc
            for engine_cls in classes or ():
                name = getattr(engine_cls, "NAME", None)
                if not isinstance(name, str) or not name:
                    raise PluginError([Diagnostic(
                        code="plugin-engine-name", path=(),
                        message=f"plugin {plugin_name!r} registered {engine_cls!r} without a "
                        "NAME")])
                if name in engines:
                    other = engines[name][1]
                    raise PluginError([Diagnostic(
                        code="duplicate-engine", path=(),
                        message=f"engine name {name!r} is registered by both {other!r} and "
                        f"{plugin_name!r}")])
                engines[name] = (engine_cls, plugin_name)
        return cls(engines)

    def names(self) -> list[str]:
        return sorted(self._engines)

    def get(self, name: str) -> Engine | None:
        entry = self._engines.get(name)
        return entry[0]() if entry else None

    def origin(self, name: str) -> str:
        return self._engines[name][1]

    def items(self) -> list[tuple[str, type[Engine], str]]:
        return [(n, c, o) for n, (c, o) in sorted(self._engines.items())]
