"""Optional compiled build of the replay kernel (everything else is in pyproject.toml).

With ``SERVESIM_MYPYC=1`` in the environment, ``pip install .`` (or ``-e .``) compiles the
modules below to C extensions with mypyc, the compiler mypy ships: the same source, type
annotations enforced at run time, the replay loop's Python overhead removed. Without it
(the default) the package is pure Python. Both give identical results; the test suite runs
on either. After editing a compiled module in an editable install, reinstall (or delete
its ``.so`` next to the source), or the stale extension keeps shadowing the edit.
"""

from __future__ import annotations

import os

from setuptools import setup

# The modules a replay spends its time in. A compiled class can be subclassed by an
# interpreted one only if it allows it (``mypyc_attr(allow_interpreted_subclasses=True)``,
# as the replay loops do for plugins and tests); other subclasses compile with their base
# (disagg.ranks with ranks.scheduler).
COMPILED = [
    "src/servesim/engines/kernel/blocks.py",
    "src/servesim/engines/kernel/events.py",
    "src/servesim/engines/kernel/core.py",
    "src/servesim/engines/kernel/metrics.py",
    "src/servesim/engines/kernel/passes.py",
    "src/servesim/engines/kernel/speculation.py",
    "src/servesim/engines/kernel/replay.py",
    "src/servesim/engines/kernel/tokens.py",
    "src/servesim/engines/ranks/scheduler.py",
    "src/servesim/engines/ranks/token_ratio.py",
    "src/servesim/engines/vllm/engine.py",
    "src/servesim/engines/disagg/engine.py",
    "src/servesim/engines/disagg/ranks.py",
    "src/servesim/timing/polynomial.py",
    "src/servesim/workloads/driver.py",
    "src/servesim/workloads/mooncake.py",
    "src/servesim/workloads/trace.py",
]


def ext_modules() -> list:
    if os.environ.get("SERVESIM_MYPYC", "0") != "1":
        return []
    from mypyc.build import mypycify

    return mypycify(COMPILED, opt_level="3", group_name="servesim_native")


setup(ext_modules=ext_modules())
