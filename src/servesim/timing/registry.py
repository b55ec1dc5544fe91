"""Build the step timer a role's ``timing`` arguments ask for.

Providers are looked up by ``timing.type`` in a read-only table; a new provider (the
analytical default model, measured tables) is one more entry with the same signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import attrs

from servesim import backends, codes
from servesim.backends import Backend
from servesim.errors import Diagnostic, ReplayError
from servesim.payload import RoleArgs
from servesim.rules import role_path, timing_values
from servesim.timing.base import StepTimer
from servesim.timing.fixed import FixedTimer
from servesim.timing.polynomial import PolynomialTimer

# ``factory(role)``, or ``factory(role, options)`` for a provider with an ``Options`` class
TimerFactory = Callable[..., StepTimer]
OptionsT = TypeVar("OptionsT")


def with_options(options: type) -> Callable[[OptionsT], OptionsT]:
    """Give a timing provider its own options: ``@with_options(MyOptions)`` on a factory
    ``factory(role, options)`` (the parameter named ``options``: it is passed by keyword).
    ``MyOptions`` is an attrs class whose fields (each with a default; ranges with
    :func:`servesim.engines.base.option`) are the keys of
    ``[engine.workers.<role>.timing.options]``."""

    def mark(factory: OptionsT) -> OptionsT:
        factory.Options = options  # type: ignore[attr-defined]
        return factory

    return mark


def _names(factory: TimerFactory, parameter: str) -> bool:
    """Whether ``factory`` takes a keyword ``parameter`` (a wrapper is seen through)."""
    try:
        return parameter in inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read: it takes the role only
        return False


def options_class(factory: Callable[..., Any]) -> type | None:
    """The ``Options`` class of a factory (a timing provider's, a router's), or None for
    one that takes none."""
    cls = getattr(factory, "Options", None)
    return cls if isinstance(cls, type) and attrs.has(cls) else None


def provider_options(factory: TimerFactory, kind: str, data: Any,
                     path: tuple[str, ...]) -> tuple[Any, list[Diagnostic]]:
    """``data`` (a role's ``timing.options``) structured by the provider's ``Options``;
    diagnostics located under ``path``."""
    from servesim.converter import structure_options

    return structure_options(options_class(factory) or _NoOptions, data, path,
                             f"timing type {kind!r}")


@attrs.frozen
class _NoOptions:
    """A provider without options: its ``options`` table must be empty."""


def _timing_path(role: RoleArgs, key: str) -> tuple[str, ...]:
    return ("engine", "workers", role.worker_type, "timing", key)


def _checked(role: RoleArgs) -> RoleArgs:
    """``role``, once its timing values pass the shared rule (a direct caller may hand in
    a role no compile or payload check has seen)."""
    problems = list(timing_values(role, role_path(role.worker_type)))
    if problems:
        raise ReplayError(problems)
    return role


def _fixed(role: RoleArgs) -> StepTimer:
    t = _checked(role).timing
    assert t.prefill_ms is not None and t.decode_ms is not None
    return FixedTimer(prefill_ms=float(t.prefill_ms), decode_ms=float(t.decode_ms))


def _polynomial(role: RoleArgs) -> StepTimer:
    return PolynomialTimer()


def _default(role: RoleArgs, backend: Backend) -> StepTimer:
    from servesim.timing.analytical import timer_from_role

    return timer_from_role(role, backend=backend)


def _measured(role: RoleArgs, backend: Backend) -> StepTimer:
    from servesim.timing.measured import measured_timer

    return measured_timer(role, backend)


def _table(role: RoleArgs) -> StepTimer:
    from servesim.timing.table import TableTimer

    path = _checked(role).timing.path
    assert path is not None
    key = _timing_path(role, "path")
    try:
        timer = TableTimer(path, key=key)
    except ReplayError as exc:
        hint = "check " + ".".join(key)
        raise ReplayError([attrs.evolve(d, hint=d.hint or hint)
                           for d in exc.diagnostics]) from None
    # the passes this role runs: a table without their rows could price none of them
    needed = {"prefill": ("prefill",), "decode": ("decode",)}.get(
        role.worker_type, ("prefill", "decode"))
    missing = timer.missing(needed)
    if missing:
        raise ReplayError([Diagnostic(
            code=codes.TIMING_TABLE_RANGE, path=key,
            message=f"the table has no {' or '.join(missing)} rows, but the "
            f"{role.worker_type} workers run {' and '.join(needed)} passes",
            hint="add rows with prefill_tokens > 0 (prefill) and prefill_tokens = 0 (decode)")])
    return timer


PROVIDERS: Mapping[str, TimerFactory] = MappingProxyType(
    {"default": _default, "fixed": _fixed, "measured": _measured, "polynomial": _polynomial,
     "table": _table}
)


def make_timer(role: RoleArgs, providers: Mapping[str, TimerFactory] = PROVIDERS,
               known: Mapping[str, Backend] = backends.BUILTIN) -> StepTimer:
    """The step timer of ``role`` from ``providers`` (a plugin registry's
    ``timing_providers``; the built-ins by default), ``known`` being the registered
    backends; a :class:`ReplayError` if its provider is unavailable.

    The factory is called with the role and, by keyword, what it names of ``options`` (its
    own, see :func:`with_options`) and ``backend`` (the role's backend policy)."""
    factory = providers.get(role.timing.type)
    if factory is None:
        message = f"unknown timing type {role.timing.type!r}; expected one of " + ", ".join(
            sorted(providers)
        )
        raise ReplayError(
            [Diagnostic(code=codes.TIMING_UNAVAILABLE, message=message,
                        path=_timing_path(role, "type"))]
        )
    path = _timing_path(role, "options")
    options, problems = provider_options(factory, role.timing.type, role.timing.options, path)
    if problems:
        raise ReplayError(problems)
    offered = {"options": options, "backend": backends.policy(role.backend, known)}
    timer = factory(role, **{k: v for k, v in offered.items() if _names(factory, k)})
    if role.timing.calibration is None:
        return timer
    from servesim.timing.calibration import CalibratedTimer

    return CalibratedTimer(timer, role.timing.calibration)
