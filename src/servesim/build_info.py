"""Which build of servesim runs: the replay kernel compiled with mypyc, or pure Python.

The install compiles the modules of :data:`COMPILED` when it can (``setup.py``) and writes
what it did to ``servesim/_build.json``: compiled or pure and why, the Python it compiled
for, the hash of each module's source, and for an editable install (its compiled modules
beside the source) the environment that built them. Before a compiled module is imported,
:class:`SourceGuard` checks that record: compiled modules whose source changed since, or
that another environment built in a shared checkout, or that no record vouches for, are
not used; every module of :data:`COMPILED` is then imported from its source (the compiled
ones call each other directly: all or none), with a one-line notice on stderr.

Imports nothing of servesim: ``servesim/__init__`` installs the guard, and ``setup.py``
reads :data:`COMPILED` and :func:`record` from this file alone.
"""

from __future__ import annotations

import functools
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from pathlib import Path

# The modules a replay spends its time in, compiled by setup.py. A compiled class can be
# subclassed by an interpreted one only if it allows it
# (``mypyc_attr(allow_interpreted_subclasses=True)``, as the replay loops do for plugins
# and tests); other subclasses compile with their base (disagg.ranks with ranks.scheduler).
COMPILED = (
    "servesim.engines.kernel.blocks",
    "servesim.engines.kernel.runmap",
    "servesim.engines.kernel.events",
    "servesim.engines.kernel.core",
    "servesim.engines.kernel.metrics",
    "servesim.engines.kernel.passes",
    "servesim.engines.kernel.speculation",
    "servesim.engines.kernel.replay",
    "servesim.engines.kernel.requests",
    "servesim.engines.kernel.sla",
    "servesim.engines.kernel.tokens",
    "servesim.engines.ranks.scheduler",
    "servesim.engines.ranks.token_ratio",
    "servesim.engines.routing.views",
    "servesim.engines.vllm.engine",
    "servesim.engines.disagg.engine",
    "servesim.engines.disagg.ranks",
    "servesim.timing.decode_price",
    "servesim.timing.polynomial",
    "servesim.workloads.driver",
    "servesim.workloads.mooncake",
    "servesim.workloads.trace",
)
RECORD = "_build.json"  # beside this file
PACKAGE = os.path.dirname(os.path.abspath(__file__))


def source_of(module: str, package: Path | str = PACKAGE) -> Path:
    """The ``.py`` file of ``module`` (a name in :data:`COMPILED`)."""
    from pathlib import Path

    return Path(package).joinpath(*module.split(".")[1:]).with_suffix(".py")


def digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def record(package: Path, *, compiled: bool, why: str = "", in_place: bool = False
           ) -> dict[str, Any]:
    """What an install writes to ``_build.json``: ``why`` a pure build is pure."""
    if not compiled:
        return {"kernel": "pure", "why": why}
    return {"kernel": "compiled", "python": EXTENSION_SUFFIXES[0],
            "environment": sys.prefix if in_place else None,
            "sources": {m: digest(source_of(m, package)) for m in COMPILED}}


class Kernel(NamedTuple):
    """Whether the compiled kernel runs; if not, why; ``ignored``: compiled modules are
    there but not used (the notice says so)."""

    compiled: bool
    why: str = ""
    ignored: bool = False


def kernel(package: Path | str = PACKAGE) -> Kernel:
    """The kernel the modules of :data:`COMPILED` load as, from the build record."""
    import json
    from pathlib import Path

    package = Path(package)
    suffix = EXTENSION_SUFFIXES[0]
    present = [m for m in COMPILED
               if source_of(m, package).with_name(m.rsplit(".", 1)[1] + suffix).exists()]
    try:
        built = json.loads((package / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        built = {}
    built = built if isinstance(built, dict) else {}
    if not present:
        if built.get("kernel") == "pure" and built.get("why"):
            return Kernel(False, f"not compiled at install: {built['why']}")
        if built.get("kernel") == "compiled":
            return Kernel(False, f"compiled at install for {built.get('python')}, not for "
                          "this Python")
        return Kernel(False, "not compiled at install")
    problem = _problem(built, present, package)
    return Kernel(False, problem, ignored=True) if problem else Kernel(True)


def _problem(built: dict[str, Any], present: list[str], package: Path) -> str:
    """Why the compiled modules ``present`` must not run ("" if they may)."""
    if built.get("kernel") != "compiled" or built.get("python") != EXTENSION_SUFFIXES[0]:
        return "no record of this build of its compiled modules (reinstall)"
    environment = built.get("environment")
    if environment is not None and environment != sys.prefix:
        return f"its compiled modules in the checkout were built by {environment}"
    missing = [m for m in COMPILED if m not in present]
    if missing:
        return f"{missing[0]} is not compiled (reinstall)"
    sources = built.get("sources", {})
    for module in COMPILED:
        path = source_of(module, package)
        if path.exists() and sources.get(module) != digest(path):
            return f"{path.relative_to(package.parent)} changed since it was compiled"
    return ""


class SourceGuard:
    """A meta path finder: the modules of :data:`COMPILED` from their source when their
    compiled modules must not run (:func:`kernel`, decided at the first such import)."""

    def __init__(self, package: Path | str = PACKAGE) -> None:
        self.package = package

    @functools.cached_property
    def kernel(self) -> Kernel:
        found = kernel(self.package)
        if found.ignored:
            sys.stderr.write(f"servesim: running the replay kernel from source: {found.why}; "
                             "`pip install -e .` compiles it again\n")
        return found

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> ModuleSpec | None:
        if fullname not in COMPILED or not self.kernel.ignored:
            return None
        import importlib.util

        return importlib.util.spec_from_file_location(fullname,
                                                      source_of(fullname, self.package))


GUARD = SourceGuard()


def install() -> None:
    """Put the guard first in ``sys.meta_path`` (once)."""
    if GUARD not in sys.meta_path:
        sys.meta_path.insert(0, GUARD)


def build() -> str:
    """``compiled build (mypyc); CPython 3.11.7``, or ``pure-Python build (why); ...``."""
    import platform

    found = GUARD.kernel
    kind = "compiled build (mypyc)" if found.compiled else f"pure-Python build ({found.why})"
    return f"{kind}; {platform.python_implementation()} {platform.python_version()}"

