"""PEP 517 backend: setuptools, plus what the compiled build of the replay kernel needs.

setup.py compiles the kernel with mypyc, which type-checks the package first: the build
environment needs mypy and the package's own dependencies, unless ``SERVESIM_MYPYC=0``
asks for the pure-Python build (which needs setuptools only). An editable build is told
so (``SERVESIM_BUILD_IN_PLACE``): its compiled modules go beside the source. Preparing
the metadata compiles nothing (``SERVESIM_METADATA_ONLY``).
"""

from __future__ import annotations

import os
import sys

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 - the rest of the backend, unchanged

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def _compiled_build_requires() -> list[str]:
    if os.environ.get("SERVESIM_MYPYC") == "0":
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


def build_editable(wheel_directory, config_settings=None,  # type: ignore[no-untyped-def]
                   metadata_directory=None):
    os.environ["SERVESIM_BUILD_IN_PLACE"] = "1"
    return build_meta.build_editable(wheel_directory, config_settings, metadata_directory)


def prepare_metadata_for_build_wheel(metadata_directory,  # type: ignore[no-untyped-def]
                                     config_settings=None):
    os.environ["SERVESIM_METADATA_ONLY"] = "1"
    return build_meta.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def prepare_metadata_for_build_editable(metadata_directory,  # type: ignore[no-untyped-def]
                                        config_settings=None):
    os.environ["SERVESIM_METADATA_ONLY"] = "1"
    return build_meta.prepare_metadata_for_build_editable(metadata_directory, config_settings)
