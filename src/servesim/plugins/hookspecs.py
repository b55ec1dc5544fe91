"""Hook specifications: the contract between servesim and its plugins.

A plugin is a module (or object) with functions marked ``@servesim.hookimpl`` whose
names match the specs below. Built-in engines, backends, timing providers, routers and
trace formats register through the same hooks (:mod:`servesim.plugins.builtin`). External
packages are found through the ``servesim`` entry-point group::

    [project.entry-points.servesim]
    my_engine = "my_engine.plugin"

``SERVESIM_DISABLE_PLUGIN_AUTOLOAD=1`` turns entry-point loading off; ``servesim
--plugin MODULE`` registers a module explicitly.

servesim calls hooks with keyword arguments only; an implementation may accept a
subset of the arguments a spec lists. Arguments may be added to a spec over time,
never removed or renamed.

Every registration hook is called once, when a registry is built
(:meth:`servesim.plugins.manager.EngineRegistry.collect`), for every plugin. A name
registered by two plugins is a fatal ``duplicate-*`` error naming both plugins and
their packages; an exception raised by a hook (or later by what it registered: an
engine's ``lower``/``validate_payload``/``replay``, a timing factory, a router, a trace
loader)
is reported as a ``plugin-error`` diagnostic naming the plugin and the hook, not as
a servesim crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from servesim.backends import Backend
    from servesim.engines.base import Engine
    from servesim.engines.routing import RouterFactory
    from servesim.timing.registry import TimerFactory
    from servesim.workloads.formats import TraceLoader

hookspec = pluggy.HookspecMarker("servesim")
hookimpl = pluggy.HookimplMarker("servesim")


@hookspec
def servesim_register_engines() -> list[type[Engine]]:
    """Return the engine classes this plugin provides.

    An engine is a subclass of :class:`~servesim.engines.base.Engine`:

    - ``NAME``: the value of ``engine.engine`` in a config and of ``engine`` in a
      payload; unique across all plugins.
    - ``MODES``: the deployment modes it replays (``"aggregated"``,
      ``"disaggregated"``).
    - ``Options``: an attrs class, the schema of the engine's own ``[engine.options]``
      table. It is structured with servesim's strict converter, so a wrong key or type
      reads ``engine.options.<key>: ... [code]``; ``limits`` in field metadata (see
      :func:`servesim.engines.base.option`) are range-checked; the schema appears in
      ``servesim schema config``.
    - ``lower(payload)``: the last compiler step, may return an evolved payload.
    - ``validate_payload(payload)``: the shared rules plus the engine's own; runs at
      compile time and again when a payload is replayed.
    - ``replay(payload, workload, sink, progress=)``: the virtual-time replay.

    :return: a list of :class:`~servesim.engines.base.Engine` subclasses.
    """
    raise NotImplementedError


@hookspec
def servesim_register_backends() -> list[type[Backend]]:
    """Return the serving backend policies this plugin provides.

    A backend is a subclass of :class:`~servesim.backends.Backend` (usually of a built-in
    one, :mod:`servesim.backends.vllm`, ``.sglang``, ``.trtllm``), instantiated once:

    - ``NAME``: the value of ``engine.backend`` in a config and of ``backend`` in a
      payload; unique across all plugins.
    - the defaults the compiler resolves (``default_block_size``,
      ``default_memory_fraction``, ``default_token_budget()``, ...) and the memory formula
      (``kv_budget()``);
    - the scheduler's admission and victim policy and pass composition (``no_evict``,
      ``new_token_ratio``, ``separate_prefill``), the default timing's pricing of prompt
      passes (``standalone_prefill_pricing``) and the P/D handoff order
      (``destination_first``);
    - its rules (``rules()``, ``own_rules()``), run at compile time and when a payload is
      replayed.

    See ``docs/backends.md``.

    :return: a list of :class:`~servesim.backends.Backend` subclasses.
    """
    raise NotImplementedError


@hookspec
def servesim_register_timing_providers() -> Mapping[str, TimerFactory]:
    """Return step-time providers by ``timing.type`` name.

    A factory is called with the role's :class:`~servesim.payload.RoleArgs` when a
    replay starts (``factory(role)``, and by keyword the ``options`` and ``backend`` it
    names: its own options, see :func:`servesim.timing.with_options`, and the role's
    backend policy) and returns a
    :class:`~servesim.timing.base.StepTimer`. It may raise
    :class:`~servesim.errors.ReplayError` with diagnostics located at
    ``engine.workers.<role>.timing``. The names become valid values of
    ``[engine.workers.<role>.timing] type``.

    :return: a mapping ``{type name: factory}``.
    """
    raise NotImplementedError


@hookspec
def servesim_register_routers() -> Mapping[str, RouterFactory]:
    """Return request routers by ``routing.type`` name.

    A factory is called with the role's :class:`~servesim.payload.RoleArgs` when a replay
    starts, and by keyword with ``options`` if it has an ``Options`` class (an attrs
    class whose fields, each with a default, are the other keys of
    ``[engine.workers.<role>.routing]``; see :func:`servesim.engines.routing.with_options`).
    It returns a fresh :class:`~servesim.engines.routing.Router`, whose
    ``route(request, workers)`` is called once per request of the role, when the request
    reaches it, with the :class:`~servesim.engines.kernel.requests.RequestSpec` and one
    read-only :class:`~servesim.engines.routing.WorkerState` per worker (in pool order),
    and returns the position of the chosen worker. The names become valid values of
    ``[engine.workers.<role>.routing] type``.

    :return: a mapping ``{type name: factory}``.
    """
    raise NotImplementedError


@hookspec
def servesim_register_trace_formats() -> Mapping[str, TraceLoader]:
    """Return trace loaders by ``traffic.source.format`` name.

    A loader is called with a :class:`~servesim.workloads.formats.TraceFile` (the
    resolved path, the block size, whether the load replays timestamps, the speedup,
    the request cap) and returns a :class:`~servesim.workloads.formats.TraceReader`:
    ``sessions()`` yields the trace's sessions in file order (called at the start of
    every replay), ``close()`` releases files. A malformed row should raise
    :class:`~servesim.errors.WorkloadError` located ``file:line``.
    :func:`servesim.workloads.formats.request_format` turns a plain function that
    yields requests into a loader.

    :return: a mapping ``{format name: loader}``.
    """
    raise NotImplementedError
