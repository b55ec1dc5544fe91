"""PEP 517 backend: setuptools, plus what the optional compiled build needs.

``SERVESIM_MYPYC=1`` (see setup.py) compiles the replay kernel with mypyc, which
type-checks the package first: the build environment then needs mypy and the package's
own dependencies. A pure-Python build (the default) needs setuptools only.
"""

from __future__ import annotations

import os
import sys

from setuptools.build_meta import *  # noqa: F403 - the rest of the backend, unchanged

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _compiled_build_requires() -> list[str]:
    if os.environ.get("SERVESIM_MYPYC", "0") != "1":
        return []
    with open("pyproject.toml", "rb") as f:
        project = tomllib.load(f)["project"]
    return ["mypy>=1.18", *project["dependencies"]]


# Not delegated: setuptools would run setup.py to find setup_requires (there are none),
# and setup.py needs mypyc before these requirements are installed.
def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    return _compiled_build_requires()


def get_requires_for_build_editable(config_settings=None):  # type: ignore[no-untyped-def]
    return _compiled_build_requires()
