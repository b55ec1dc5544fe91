"""Backend policies: one object per serving backend (vLLM, SGLang, TensorRT-LLM, plugins').

:class:`Backend` is the base a backend subclasses. The built-ins are registered through the
``servesim_register_backends`` hook like any plugin's; :func:`policy` finds the policy of
an ``engine.backend`` value among the backends of the compile or replay in progress (the
registry's, set with :func:`use_backends`), or among the built-ins outside one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import NewType

from servesim.backends.base import DEFAULT_TOKEN_BUDGET, Backend
from servesim.backends.sglang import Sglang
from servesim.backends.trtllm import Trtllm
from servesim.backends.vllm import Vllm

__all__ = [
    "BUILTIN",
    "BUILTIN_BACKENDS",
    "DEFAULT_BACKEND",
    "DEFAULT_TOKEN_BUDGET",
    "Backend",
    "BackendName",
    "policy",
    "policy_of",
    "registered",
    "use_backends",
]

DEFAULT_BACKEND = "vllm"
# a config's ``engine.backend``: the converter accepts the name of a registered backend
BackendName = NewType("BackendName", str)
BUILTIN_BACKENDS: tuple[type[Backend], ...] = (Vllm, Sglang, Trtllm)
BUILTIN: Mapping[str, Backend] = MappingProxyType({cls.NAME: cls() for cls in BUILTIN_BACKENDS})

# The backends registered for the compile or replay in progress (set by the compiler
# pipeline and servesim.replay); a context variable, so concurrent runs do not mix.
_ACTIVE: ContextVar[Mapping[str, Backend] | None] = ContextVar("servesim_backends",
                                                               default=None)


@contextmanager
def use_backends(backends: Mapping[str, Backend]) -> Iterator[None]:
    """Within the block, :func:`policy` looks up ``backends`` (a plugin registry's)."""
    token = _ACTIVE.set(backends)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def registered() -> Mapping[str, Backend]:
    """The backends in force, by name, in registration order (built-ins first)."""
    return _ACTIVE.get() or BUILTIN


def policy(name: str) -> Backend | None:
    """The policy of backend ``name``, or None if no such backend is registered."""
    return registered().get(name)


def policy_of(name: str) -> Backend:
    """The policy of backend ``name``, which the caller knows is registered (the parse
    pass and the payload check refuse any other)."""
    found = registered().get(name)
    if found is None:
        raise KeyError(f"no backend named {name!r} is registered (registered: "
                       f"{', '.join(registered())})")
    return found
