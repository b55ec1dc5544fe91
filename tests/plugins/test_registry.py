from __future__ import annotations

import pytest

from servesim.engines.base import Engine, ReplayResult
from servesim.errors import ServesimError
from servesim.plugins import hookimpl
from servesim.plugins.manager import EngineRegistry, get_plugin_manager


class _Echo(Engine):
    NAME = "echo"
    DESCRIPTION = "test engine"

    def replay(self, payload, workload, sink, *, progress=None):  # type: ignore[no-untyped-def]
        return ReplayResult(end_ms=0.0, gpu_seconds={})


class _EchoPlugin:
    @hookimpl
    def servesim_register_engines(self) -> list[type[Engine]]:
        return [_Echo]


class _DuplicateVllm:
    class Clash(_Echo):
        NAME = "vllm"

    @hookimpl
    def servesim_register_engines(self) -> list[type[Engine]]:
        return [self.Clash]


class _Broken:
    @hookimpl
    def servesim_register_engines(self) -> list[type[Engine]]:
        raise RuntimeError("boom")


class _UnknownHook:
    @hookimpl
    def servesim_register_widgets(self) -> list[object]:
        return []


def test_a_plugin_implementing_a_hook_servesim_does_not_define_is_named() -> None:
    with pytest.raises(ServesimError) as info:
        get_plugin_manager(load_entrypoints=False, plugins=[_UnknownHook()])
    (diag,) = info.value.diagnostics
    assert diag.code == "plugin-load-failed"
    assert "unknown hook 'servesim_register_widgets'" in diag.message


def test_builtin_engines_register_through_the_hook() -> None:
    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    assert registry.names() == ["disagg", "vllm"]
    assert registry.origin("vllm") == "servesim.builtin"


def test_a_plugin_engine_is_listed_with_its_plugin_name() -> None:
    pm = get_plugin_manager(load_entrypoints=False, plugins=[_EchoPlugin()])
    registry = EngineRegistry.collect(pm)
    assert "echo" in registry.names()
    engine = registry.get("echo")
    assert isinstance(engine, _Echo)


def test_duplicate_engine_names_are_fatal_and_name_both_plugins() -> None:
    pm = get_plugin_manager(load_entrypoints=False, plugins=[_DuplicateVllm()])
    with pytest.raises(ServesimError) as info:
        EngineRegistry.collect(pm)
    message = str(info.value)
    assert "engine name 'vllm' is registered by both" in message
    assert "servesim.builtin" in message


def test_a_plugin_that_raises_is_reported_with_its_name() -> None:
    pm = get_plugin_manager(load_entrypoints=False, plugins=[_Broken()])
    name = pm.get_name(next(p for p in pm.get_plugins() if isinstance(p, _Broken)))
    with pytest.raises(ServesimError) as info:
        EngineRegistry.collect(pm)
    assert str(info.value).startswith(
        f"plugin {name!r}: raised in servesim_register_engines: RuntimeError: boom "
        "[plugin-error]")


def test_autoload_can_be_disabled_by_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    import pluggy

    monkeypatch.setattr(pluggy.PluginManager, "load_setuptools_entrypoints",
                        lambda self, group, name=None: calls.append(group) or 0)
    monkeypatch.setenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", "1")
    get_plugin_manager()
    assert calls == []
    monkeypatch.delenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD")
    get_plugin_manager()
    assert calls == ["servesim"]


def test_hooks_are_called_through_pluggy_so_an_implementation_may_take_a_subset() -> None:
    # a spec that gains an argument must keep older implementations (which name none of
    # its arguments) working, and hand the argument to those that name it
    import pluggy

    from servesim.plugins.manager import PluginSource, _call_each

    spec = pluggy.HookspecMarker("servesim")

    class Specs:
        @spec
        def servesim_register_engines(self, servesim_version: str) -> list[type[Engine]]:
            raise NotImplementedError

    class Old:
        @hookimpl
        def servesim_register_engines(self) -> list[type[Engine]]:
            return [_Echo]

    class New:
        @hookimpl
        def servesim_register_engines(self, servesim_version: str) -> list[str]:
            return [servesim_version]

    pm = pluggy.PluginManager("servesim")
    pm.add_hookspecs(Specs)
    pm.register(Old(), name="old")
    pm.register(New(), name="new")
    sources = {"old": PluginSource("old", "object"), "new": PluginSource("new", "object")}
    called = list(_call_each(pm, "servesim_register_engines", sources, servesim_version="9.9"))
    assert [(source.name, result) for source, result in called] == [
        ("old", [_Echo]), ("new", ["9.9"])]

