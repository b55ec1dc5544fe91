"""Which build of servesim runs: pure Python, or the replay kernel compiled with mypyc."""

from __future__ import annotations

import platform


def build() -> str:
    """The build (pure Python, or the replay kernel compiled with mypyc) and the Python."""
    from importlib.machinery import EXTENSION_SUFFIXES

    from servesim.engines.kernel import core

    compiled = (core.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))
    kind = "compiled build (mypyc)" if compiled else "pure-Python build"
    return f"{kind}; {platform.python_implementation()} {platform.python_version()}"
