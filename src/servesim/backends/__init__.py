"""Backend policies: one object per serving backend (vLLM, SGLang, TensorRT-LLM, plugins').

:class:`Backend` is the base a backend subclasses. The built-ins are registered through the
``servesim_register_backends`` hook like any plugin's; :func:`policy` finds the policy of
an ``engine.backend`` value among the backends it is given (a plugin registry's
``backends``, which the compiler and the engines pass explicitly), the built-ins by
default.
"""

from __future__ import annotations

from collections.abc import Mapping
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
]

DEFAULT_BACKEND = "vllm"
# a config's ``engine.backend``: the converter accepts the name of a registered backend
BackendName = NewType("BackendName", str)
BUILTIN_BACKENDS: tuple[type[Backend], ...] = (Vllm, Sglang, Trtllm)
BUILTIN: Mapping[str, Backend] = MappingProxyType({cls.NAME: cls() for cls in BUILTIN_BACKENDS})


def policy(name: str, backends: Mapping[str, Backend] = BUILTIN) -> Backend | None:
    """The policy of backend ``name`` among ``backends``, or None if it is not one."""
    return backends.get(name)


def policy_of(name: str, backends: Mapping[str, Backend] = BUILTIN) -> Backend:
    """The policy of backend ``name``, which the caller knows is among ``backends`` (the
    parse pass and the payload check refuse any other)."""
    found = backends.get(name)
    if found is None:
        raise KeyError(f"no backend named {name!r} is registered (registered: "
                       f"{', '.join(backends)})")
    return found
