"""Plugin manager factory and the registry built from it. No global manager.

:func:`get_plugin_manager` builds a fresh :class:`pluggy.PluginManager` with the
built-ins, explicit plugins and (unless disabled) the ``servesim`` entry points.
:meth:`EngineRegistry.collect` asks every plugin for its engines, backends, timing
providers, routers and trace formats. Anything a third-party plugin raises - in a hook, or
later in what it registered - becomes a :class:`PluginError` naming the plugin, its package
and the hook.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, Literal

import attrs
import pluggy

from servesim import codes, limits
from servesim.engines.base import Engine
from servesim.errors import Diagnostic, PluginError, ServesimError, plugin_bug
from servesim.plugins import hookspecs
from servesim.timing.base import prefill_group_ms

if TYPE_CHECKING:
    from servesim.backends import Backend
    from servesim.engines.kernel.requests import RequestSpec
    from servesim.engines.routing import Router, RouterFactory, WorkerState
    from servesim.payload import RoleArgs
    from servesim.timing.base import StepTimer
    from servesim.timing.registry import TimerFactory
    from servesim.workloads.formats import TraceLoader

ENTRY_POINT_GROUP = "servesim"
DISABLE_AUTOLOAD_ENV = "SERVESIM_DISABLE_PLUGIN_AUTOLOAD"
TRACEBACK_ENV = "SERVESIM_TRACEBACK"  # "1": the CLI prints what a plugin raised, in full
BUILTIN = "servesim.builtin"
# what third-party code may raise that servesim reports instead of ending with it: a plugin
# calling sys.exit() is a bug in the plugin, like any exception (Ctrl-C still stops servesim)
# (GeneratorExit too: raised by a plugin, it is no request to close a generator of ours)
PLUGIN_FAULTS = (Exception, SystemExit, GeneratorExit)


@attrs.frozen
class PluginSource:
    """Where a registered plugin comes from (shown by ``servesim plugins`` and in errors)."""

    name: str  # the plugin's name in the manager
    kind: Literal["builtin", "entry-point", "module", "object"]
    package: str | None = None  # "dist-name version" of an entry-point plugin

    def describe(self) -> str:
        if self.kind == "builtin":
            from servesim.version import __version__

            return f"servesim {__version__} (built-in)"
        if self.kind == "entry-point":
            return f"{self.package} (entry point {self.name!r})"
        if self.kind == "module":
            return f"module {self.name}"
        return "object registered in-process"

    def label(self) -> str:
        """``'name' (package x.y)`` for messages."""
        if self.kind == "entry-point":
            return f"{self.name!r} (package {self.package})"
        return repr(self.name)


def get_plugin_manager(*, load_entrypoints: bool = True,
                       plugins: Iterable[object | ModuleType] = ()) -> pluggy.PluginManager:
    """A fresh manager with the built-ins, ``plugins``, and (unless disabled) entry points."""
    from servesim.plugins import builtin

    pm = pluggy.PluginManager("servesim")
    pm.add_hookspecs(hookspecs)
    pm.register(builtin, name=BUILTIN)
    for plugin in plugins:
        name = getattr(plugin, "__name__", None) or repr(plugin)
        if isinstance(plugin, ModuleType) and pm.has_plugin(plugin.__name__):
            continue  # the same module given twice (or also loaded as an entry point)
        try:
            pm.register(plugin)
        except PLUGIN_FAULTS as exc:
            raise PluginError([Diagnostic(
                code=codes.PLUGIN_LOAD_FAILED, location=f"plugin {name}",
                message=f"cannot register plugin: {type(exc).__name__}: {exc}")]) from exc
    if load_entrypoints and not os.environ.get(DISABLE_AUTOLOAD_ENV):
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except PLUGIN_FAULTS as exc:
            culprit = _unloaded_entry_point(pm)
            raise PluginError([Diagnostic(
                code=codes.PLUGIN_LOAD_FAILED, location=f"plugin {culprit}",
                message=f"loading the '{ENTRY_POINT_GROUP}' entry-point plugin failed: "
                f"{type(exc).__name__}: {exc}",
                hint=f"uninstall or fix the package, or set {DISABLE_AUTOLOAD_ENV}=1 to "
                "skip entry-point plugins")]) from exc
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        raise PluginError([Diagnostic(
            code=codes.PLUGIN_LOAD_FAILED, location=f"plugin {pm.get_name(exc.plugin)}",
            message=f"cannot register plugin: {exc}",
            hint="a plugin implements only the hooks servesim defines "
                 "(`servesim_register_...`)")]) from exc
    return pm


def _unloaded_entry_point(pm: pluggy.PluginManager) -> str:
    """The first entry point pluggy did not register: the one whose loading failed."""
    import importlib.metadata

    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == ENTRY_POINT_GROUP and not pm.has_plugin(ep.name) \
                    and not pm.is_blocked(ep.name):
                return f"{ep.name!r} (package {dist.metadata['Name']} {dist.version})"
    return "(unknown)"


def plugin_sources(pm: pluggy.PluginManager) -> dict[str, PluginSource]:
    """Every registered plugin's :class:`PluginSource`, by plugin name."""
    dists = {id(plugin): f"{dist.project_name} {dist.version}"
             for plugin, dist in pm.list_plugin_distinfo()}
    out: dict[str, PluginSource] = {}
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        if name == BUILTIN:
            out[name] = PluginSource(name, "builtin")
        elif id(plugin) in dists:
            out[name] = PluginSource(name, "entry-point", dists[id(plugin)])
        elif isinstance(plugin, ModuleType):
            out[name] = PluginSource(name, "module")
        else:
            out[name] = PluginSource(name, "object")
    return out


def plugin_failure(source: PluginSource, hook: str, exc: BaseException) -> PluginError:
    """The error reported when plugin code raises: plugin, package, hook, innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    error = plugin_bug(source, f"raised in {hook}: {type(exc).__name__}: {exc}", where)
    d = error.diagnostics[0]
    error = PluginError([attrs.evolve(d, hint=f"{d.hint} ({TRACEBACK_ENV}=1 shows the "
                                      "full traceback)")])
    error.__cause__ = exc
    return error


@contextmanager
def reported_as(source: PluginSource | None, hook: str) -> Iterator[None]:
    """Turn an exception from third-party code into a :class:`PluginError`.

    A :class:`ServesimError` (diagnostics the plugin raised on purpose) passes through; the
    built-ins are not wrapped, so a bug in servesim keeps its traceback.
    """
    if source is None or source.kind == "builtin":
        yield
        return
    try:
        yield
    except ServesimError:
        raise
    except PLUGIN_FAULTS as exc:
        raise plugin_failure(source, hook, exc) from exc


def _call_each(pm: pluggy.PluginManager, hook: str, sources: Mapping[str, PluginSource],
               **kwargs: Any) -> Iterator[tuple[PluginSource, Any]]:
    """Call ``hook`` through pluggy with keyword arguments, one plugin at a time in
    registration order (built-ins first), so that what a plugin raises names that plugin.

    pluggy hands each implementation the arguments it names, so an implementation written
    against an older spec (a subset of today's arguments) keeps working.
    """
    impls = getattr(pm.hook, hook).get_hookimpls()
    for impl in impls:
        source = sources.get(impl.plugin_name, PluginSource(impl.plugin_name, "object"))
        alone = pm.subset_hook_caller(hook, [i.plugin for i in impls if i is not impl])
        with reported_as(source, hook):
            results = alone(**kwargs)
        for result in results:
            if result is not None:
                yield source, result


# what two plugins registered under one name: its kind, as messages name it, and the code
DUPLICATE_CODES = {"engine": codes.DUPLICATE_ENGINE, "backend": codes.DUPLICATE_BACKEND,
                   "timing provider": codes.DUPLICATE_TIMING_PROVIDER,
                   "router": codes.DUPLICATE_ROUTER,
                   "trace format": codes.DUPLICATE_TRACE_FORMAT}


def _duplicate(kind: str, name: str, first: PluginSource, second: PluginSource) -> PluginError:
    return PluginError([Diagnostic(
        code=DUPLICATE_CODES[kind], location=f"plugin {second.label()}",
        message=f"{kind} name {name!r} is registered by both {first.label()} and "
        f"{second.label()}", hint="uninstall one of the packages, or disable autoloading "
        f"({DISABLE_AUTOLOAD_ENV}=1) and pick plugins with --plugin")])


def _subclasses(pm: pluggy.PluginManager, hook: str, base: type[Any],
                sources: Mapping[str, PluginSource]) -> Iterator[tuple[PluginSource, Any]]:
    """The ``base`` subclasses each plugin's ``hook`` returns, checked to be a list of them."""
    for source, classes in _call_each(pm, hook, sources):
        if not isinstance(classes, list | tuple):
            raise _bad_registration(source, hook, f"returned {classes!r:.60}, expected a "
                                    f"list of {base.__name__} subclasses")
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, base)):
                article = "an" if base.__name__[0] in "AEIOU" else "a"
                raise _bad_registration(source, hook, f"returned {cls!r}, not {article} "
                                        f"{base.__name__} subclass")
            yield source, cls


def _bad_registration(source: PluginSource, hook: str, message: str) -> PluginError:
    return PluginError([Diagnostic(code=codes.PLUGIN_BAD_REGISTRATION,
                                   location=f"plugin {source.label()}",
                                   message=f"{hook} {message}")])


class EngineRegistry:
    """What the plugins registered: engines, backends, timing providers, routers and trace
    formats, by name.

    Each entry remembers the :class:`PluginSource` that registered it. Third-party timing
    factories, routers and trace loaders are handed out wrapped, so an exception inside
    them is reported with the plugin's name.
    """

    def __init__(self, engines: dict[str, tuple[type[Engine], str]],
                 timing: Mapping[str, tuple[TimerFactory, str]] | None = None,
                 formats: Mapping[str, tuple[TraceLoader, str]] | None = None,
                 sources: Mapping[str, PluginSource] | None = None,
                 backends: Mapping[str, tuple[Backend, str]] | None = None,
                 routers: Mapping[str, tuple[RouterFactory, str]] | None = None) -> None:
        self._engines = engines
        self._backends = dict(backends) if backends is not None else _builtin_backends()
        self._timing = dict(timing or {})
        self._formats = dict(formats or {})
        self._routers = dict(routers) if routers is not None else _builtin_routers()
        self._sources = dict(sources or {})

    @classmethod
    def collect(cls, pm: pluggy.PluginManager) -> EngineRegistry:
        sources = plugin_sources(pm)
        engines: dict[str, tuple[type[Engine], str]] = {}
        hook = "servesim_register_engines"
        for source, engine_cls in _subclasses(pm, hook, Engine, sources):
            with reported_as(source, f"{engine_cls.__qualname__} attributes"):
                name = getattr(engine_cls, "NAME", None)
                modes = getattr(engine_cls, "MODES", None)
                description = getattr(engine_cls, "DESCRIPTION", None)
            if not isinstance(name, str) or not name:
                raise _bad_registration(source, hook, f"registered {engine_cls!r} "
                                        "without a NAME")
            if not isinstance(modes, tuple) or not all(isinstance(m, str) for m in modes) \
                    or not isinstance(description, str):
                raise _bad_registration(source, hook, f"registered {engine_cls!r}, whose "
                                        "MODES is no tuple of strings or DESCRIPTION no "
                                        "string")
            if name in engines:
                raise _duplicate("engine", name, sources[engines[name][1]], source)
            engines[name] = (engine_cls, source.name)
        timing = cls._named(pm, "servesim_register_timing_providers", "timing provider",
                            sources)
        formats = cls._named(pm, "servesim_register_trace_formats", "trace format", sources)
        routers = cls._named(pm, "servesim_register_routers", "router", sources)
        return cls(engines, timing, formats, sources, cls._collect_backends(pm, sources),
                   routers)

    @staticmethod
    def _collect_backends(pm: pluggy.PluginManager, sources: Mapping[str, PluginSource],
                          ) -> dict[str, tuple[Backend, str]]:
        from servesim.backends import Backend

        out: dict[str, tuple[Backend, str]] = {}
        hook = "servesim_register_backends"
        for source, backend_cls in _subclasses(pm, hook, Backend, sources):
            with reported_as(source, f"{backend_cls.__qualname__}()"):
                backend = backend_cls()
                name = backend.NAME
            if not isinstance(name, str) or not name:
                raise _bad_registration(source, hook, f"registered {backend_cls!r} "
                                        "without a NAME")
            if name in out:
                raise _duplicate("backend", name, sources[out[name][1]], source)
            out[name] = (backend, source.name)
        return out

    @staticmethod
    def _named(pm: pluggy.PluginManager, hook: str, kind: str,
               sources: Mapping[str, PluginSource]) -> dict[str, tuple[Any, str]]:
        out: dict[str, tuple[Any, str]] = {}
        for source, mapping in _call_each(pm, hook, sources):
            if not isinstance(mapping, Mapping):
                raise _bad_registration(source, hook, f"returned {type(mapping).__name__}, "
                                        "expected a mapping of name to callable")
            with reported_as(source, hook):  # a mapping of its own may raise while read
                items = list(mapping.items())
            for name, value in items:
                if not isinstance(name, str) or not name or not callable(value):
                    raise _bad_registration(source, hook, f"registered {name!r}: {value!r}; "
                                            "expected a nonempty name and a callable")
                if name in out:
                    raise _duplicate(kind, name, sources[out[name][1]], source)
                out[name] = (value, source.name)
        return out

    # -- engines --------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._engines)

    def get(self, name: str) -> Engine | None:
        entry = self._engines.get(name)
        if entry is None:
            return None
        with self.guard(name, f"{entry[0].__qualname__}()"):
            engine = entry[0]()
        # what the engine replays with: this registry's backends, timing providers, routers
        engine.backends, engine.timing_providers = self.backends, self.timing_providers
        engine.routers = self.routers
        return engine

    def engine_class(self, name: str) -> type[Engine] | None:
        entry = self._engines.get(name)
        return entry[0] if entry else None

    def origin(self, name: str) -> str:
        """The name of the plugin that registered engine ``name``."""
        return self._engines[name][1]

    def source(self, plugin: str) -> PluginSource:
        return self._sources.get(plugin, PluginSource(plugin, "object"))

    def items(self) -> list[tuple[str, type[Engine], str]]:
        return [(n, c, o) for n, (c, o) in sorted(self._engines.items())]

    @contextmanager
    def guard(self, engine: str, hook: str) -> Iterator[None]:
        """Report an exception raised by engine ``engine``'s code in ``hook`` as a PluginError."""
        entry = self._engines.get(engine)
        with reported_as(self.source(entry[1]) if entry else None, hook):
            yield

    def diagnostics(self, engine: str, hook: str, call: Callable[[], Any]) -> list[Diagnostic]:
        """What ``call`` (engine ``engine``'s ``hook``) returns, guarded and checked to be a
        list of diagnostics (see :mod:`servesim.plugins.checked`)."""
        from servesim.plugins.checked import diagnostics

        with self.guard(engine, hook):
            value = call()
        entry = self._engines.get(engine)
        source = self.source(entry[1]) if entry else None
        if source is None or source.kind == "builtin":
            return list(value)
        return diagnostics(source, hook, value)

    def source_of(self, engine: str) -> PluginSource:
        """The :class:`PluginSource` of the plugin that registered engine ``engine``."""
        return self.source(self.origin(engine))

    # -- backends -------------------------------------------------------------------------

    @property
    def backends(self) -> Mapping[str, Backend]:
        """``{engine.backend: policy}`` in registration order (built-ins first)."""
        return MappingProxyType({name: backend for name, (backend, _) in
                                 self._backends.items()})

    def backend_items(self) -> list[tuple[str, Backend, str]]:
        return [(n, b, o) for n, (b, o) in sorted(self._backends.items())]

    # -- timing providers and trace formats -----------------------------------------------

    @property
    def timing_providers(self) -> Mapping[str, TimerFactory]:
        """``{timing.type: factory}``; third-party factories are wrapped (see class doc)."""
        return MappingProxyType({name: self._guarded_timer(name, factory, plugin)
                                 for name, (factory, plugin) in self._timing.items()})

    @property
    def trace_formats(self) -> Mapping[str, TraceLoader]:
        """``{traffic.source.format: loader}``; third-party loaders are wrapped."""
        from servesim.workloads.formats import guarded_loader

        out: dict[str, TraceLoader] = {}
        for name, (loader, plugin) in self._formats.items():
            source = self.source(plugin)
            out[name] = loader if source.kind == "builtin" else guarded_loader(
                loader, partial(reported_as, source), f"trace format {name!r}")
        return MappingProxyType(out)

    @property
    def routers(self) -> Mapping[str, RouterFactory]:
        """``{routing.type: factory}``; third-party routers are wrapped (see class doc)."""
        return MappingProxyType({name: factory if self.source(plugin).kind == "builtin"
                                 else _guarded_router(name, factory, self.source(plugin))
                                 for name, (factory, plugin) in self._routers.items()})

    def router_items(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [(n, f, o) for n, (f, o) in sorted(self._routers.items())]

    def timing_items(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [(n, f, o) for n, (f, o) in sorted(self._timing.items())]

    def format_items(self) -> list[tuple[str, Callable[..., Any], str]]:
        return [(n, f, o) for n, (f, o) in sorted(self._formats.items())]

    def _guarded_timer(self, name: str, factory: TimerFactory, plugin: str) -> TimerFactory:
        from servesim.timing.registry import with_options

        source = self.source(plugin)
        if source.kind == "builtin":
            return factory

        def make(role: RoleArgs, **offered: Any) -> StepTimer:
            with reported_as(source, f"timing provider {name!r}"):
                timer = factory(role, **offered)
            missing = [m for m in ("prefill_ms", "decode_ms") if not callable(
                getattr(timer, m, None))]
            if missing:
                raise plugin_bug(source, f"timing provider {name!r} returned {timer!r:.60}, "
                                 f"which has no {' or '.join(missing)} method; a provider "
                                 "returns a step timer")
            guard = _GuardedFrontEndTimer if hasattr(timer, "request_ms") else _GuardedTimer
            return guard(timer, source, f"timing provider {name!r}")

        make.__wrapped__ = factory  # type: ignore[attr-defined]  # its keywords are the factory's
        with reported_as(source, f"timing provider {name!r} Options"):
            options = getattr(factory, "Options", None)
        return with_options(options)(make) if options is not None else make


def _builtin_backends() -> dict[str, tuple[Backend, str]]:
    """The built-in backends (a registry made by hand, not collected from plugins)."""
    from servesim import backends

    return {name: (backend, BUILTIN) for name, backend in backends.BUILTIN.items()}


def _builtin_routers() -> dict[str, tuple[RouterFactory, str]]:
    from servesim.engines.routing import ROUTERS

    return {name: (factory, BUILTIN) for name, factory in ROUTERS.items()}


def _guarded_router(name: str, factory: RouterFactory, source: PluginSource) -> RouterFactory:
    """A third-party router factory whose routers' exceptions and answers that are no
    worker position name the plugin."""
    from servesim.timing.registry import with_options

    hook = f"router {name!r}"

    def make(role: RoleArgs, **offered: Any) -> Router:
        with reported_as(source, hook):
            router = factory(role, **offered)
        if not callable(getattr(router, "route", None)):
            raise plugin_bug(source, f"{hook} returned {router!r:.60}, which has no route "
                             "method; a router factory returns a router")
        return _GuardedRouter(router, source, hook)

    with reported_as(source, f"{hook} Options"):
        options = getattr(factory, "Options", None)
    return with_options(options)(make) if options is not None else make


class _GuardedRouter:
    """A third-party router: what it raises, or a pick that is no worker position, is the
    plugin's error."""

    __slots__ = ("_hook", "_router", "_source")

    def __init__(self, router: Router, source: PluginSource, hook: str) -> None:
        self._router, self._source, self._hook = router, source, hook

    def route(self, request: RequestSpec, workers: Sequence[WorkerState]) -> int:
        with reported_as(self._source, f"{self._hook} route"):
            chosen = self._router.route(request, workers)
        if isinstance(chosen, bool) or not isinstance(chosen, int) or not (
                0 <= chosen < len(workers)):
            raise plugin_bug(self._source, f"{self._hook} route returned {chosen!r:.40} for "
                             f"request {request.request_id}; it returns a worker position, "
                             f"0 to {len(workers) - 1}")
        return chosen


class _GuardedTimer:
    """A third-party :class:`StepTimer` whose exceptions and invalid prices (not a finite
    number of ms >= 0) name the plugin."""

    __slots__ = ("_hook", "_source", "_timer")

    def __init__(self, timer: StepTimer, source: PluginSource, hook: str) -> None:
        self._timer, self._source, self._hook = timer, source, hook

    def _price(self, method: str, price: Callable[..., Any], *args: Any) -> float:
        try:
            value = price(*args)
        except ServesimError:
            raise
        except PLUGIN_FAULTS as exc:
            raise plugin_failure(self._source, f"{self._hook} {method}", exc) from exc
        if isinstance(value, bool) or not isinstance(value, int | float) or not (
                0.0 <= value <= limits.STEP_MS):
            raise plugin_bug(self._source, f"{self._hook} {method}{args} returned {value!r}; "
                             f"a price must be a number of ms from 0 to {limits.STEP_MS:g}")
        return float(value)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return self._price("prefill_ms", self._timer.prefill_ms, batch, mean_isl, mean_prefix)

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        return self._price("decode_ms", self._timer.decode_ms, batch, active_kv_tokens,
                           mean_context, total_kv_tokens)

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        """The plugin's group price, or its ``prefill_ms`` when it has none."""
        return self._price("prefill_group_ms", partial(prefill_group_ms, self._timer), batch,
                           mean_isl, mean_prefix, group_tokens)


class _GuardedFrontEndTimer(_GuardedTimer):
    """A guarded timer that also has a front-end latency (``request_ms``)."""

    __slots__ = ()

    def request_ms(self, input_tokens: int) -> float:
        try:
            latency: float = self._timer.request_ms(input_tokens)  # type: ignore[attr-defined]
        except ServesimError:
            raise
        except PLUGIN_FAULTS as exc:
            raise plugin_failure(self._source, f"{self._hook} request_ms", exc) from exc
        return latency
