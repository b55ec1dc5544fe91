"""Hook specifications: the contract between servesim and its plugins.

A plugin is a module (or object) with functions marked ``@servesim.hookimpl`` whose
names match the specs below. Built-in engines register through the same hooks
(:mod:`servesim.plugins.builtin`). External packages are found through the
``servesim`` entry-point group::

    [project.entry-points.servesim]
    my_engine = "my_engine.plugin"

servesim calls hooks with keyword arguments only; an implementation may accept a
subset of the arguments a spec lists. Arguments may be added to a spec over time,
never removed or renamed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from servesim.engines.base import Engine

hookspec = pluggy.HookspecMarker("servesim")
hookimpl = pluggy.HookimplMarker("servesim")


@hookspec
def servesim_register_engines() -> list[type[Engine]]:
    """Return the engine classes this plugin provides.

    Called once when an :class:`~servesim.plugins.manager.EngineRegistry` is built.
    Each class must set a unique ``NAME`` (the value a payload's ``engine`` field
    holds). Two plugins registering the same name is a fatal error naming both.

    :return: a list of :class:`~servesim.engines.base.Engine` subclasses.
    """
    raise NotImplementedError
