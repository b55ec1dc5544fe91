"""The compiled build of the replay kernel (everything else is in pyproject.toml).

``pip install .`` (or ``-e .``) compiles the modules of ``servesim.build_info.COMPILED`` to C
extensions with mypyc, the compiler mypy ships (a build requirement): the same source,
type annotations enforced at run time, the replay loop's Python overhead removed. Where it
cannot (no C compiler or Python headers, no mypyc), or with ``SERVESIM_MYPYC=0``, the
package is pure Python, with a one-line notice; ``SERVESIM_MYPYC=1`` makes a failed
compiled build an error instead. Both builds give identical results.

The build records what it did in ``servesim/_build.json`` (see ``servesim.build_info``),
which ``servesim --version`` reports and which keeps compiled modules that no longer match
their source, or that another environment built into a shared checkout, from running.
"""

from __future__ import annotations

import os
import runpy
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "src" / "servesim"
INFO = runpy.run_path(str(PACKAGE / "build_info.py"))  # (imports nothing of servesim)
# set by build_backend.build_editable: the extensions go beside the source
IN_PLACE = os.environ.get("SERVESIM_BUILD_IN_PLACE") == "1"


def notice(text: str) -> None:
    sys.stderr.write(f"servesim: {text}\n")


def cannot_compile() -> str:
    """Why this machine cannot build the compiled kernel ("" if it can)."""
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed"
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    with tempfile.TemporaryDirectory() as tmp:
        probe = Path(tmp) / "probe.c"
        probe.write_text("#include <Python.h>\nint probe(void) { return 0; }\n")
        try:
            compiler.compile([str(probe)], output_dir=tmp,
                             include_dirs=[sysconfig.get_paths()["include"]])
        except Exception as exc:  # (distutils' errors, of either distutils module)
            problem = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return f"no working C compiler with the Python headers: {problem}"
    return ""


def kernel() -> tuple[list[Any], str]:
    """The extension modules to build, and why there are none."""
    choice = os.environ.get("SERVESIM_MYPYC", "")
    extensions: list[Any] = []
    why = "SERVESIM_MYPYC=0" if choice == "0" else cannot_compile()
    if not why:
        extensions, why = compiled_kernel()
    if why and choice == "1":
        raise SystemExit(f"servesim: SERVESIM_MYPYC=1, but the compiled kernel cannot be "
                         f"built: {why}")
    if why:
        notice(f"pure-Python build ({why}): replays run about twice as slow as compiled")
    return extensions, why


def compiled_kernel() -> tuple[list[Any], str]:
    """mypyc's extension modules, or none and why."""
    from mypyc.build import mypycify

    sources = [str(INFO["source_of"](m, PACKAGE).relative_to(HERE)) for m in INFO["COMPILED"]]
    try:
        return mypycify(sources, opt_level="3", group_name="servesim_native"), ""
    except SystemExit:  # its type check failed (the errors are above)
        return [], "mypyc found errors in the source"


def write_record(folder: Path, data: dict[str, Any]) -> None:
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / INFO["RECORD"]).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")


def drop_in_place_extensions(package: Path = PACKAGE, keep: tuple[str, ...] = ()) -> None:
    """An editable build removes the compiled modules an earlier one left beside the
    source, for any Python (they would shadow it), but those of ``keep`` (the modules it
    compiles again): every module of the package, so one that left the compiled set is
    not shadowed either; and, keeping none, their shared library."""
    kept = {INFO["source_of"](m, package) for m in keep}
    built = [(source.parent, source.stem) for source in package.rglob("*.py")
             if source not in kept]
    if not keep:
        built.append((package.parent, "servesim_native__mypyc"))
    for folder, stem in built:
        for path in folder.glob(f"{stem}.*"):
            if path.suffix in (".so", ".pyd"):
                path.unlink()


class BuildPy(build_py):
    """A wheel's ``_build.json``: pure (the compiled build's overwrites it)."""

    def run(self) -> None:
        super().run()
        if not IN_PLACE:
            write_record(Path(self.build_lib) / "servesim",
                         INFO["record"](PACKAGE, compiled=False, why=WHY))


class BuildExt(build_ext):
    """The compiled kernel's ``_build.json``, once its extensions are built."""

    def run(self) -> None:
        super().run()
        folder = PACKAGE if IN_PLACE else Path(self.build_lib) / "servesim"
        write_record(folder, INFO["record"](PACKAGE, compiled=True, in_place=IN_PLACE))


if __name__ == "__main__" and os.environ.get("SERVESIM_METADATA_ONLY") == "1":
    setup()  # the metadata only: nothing to compile
elif __name__ == "__main__":  # (as setuptools runs it; tests import the functions)
    EXTENSIONS, WHY = kernel()
    if IN_PLACE:
        drop_in_place_extensions(keep=INFO["COMPILED"] if EXTENSIONS else ())
    if IN_PLACE and not EXTENSIONS:
        write_record(PACKAGE, INFO["record"](PACKAGE, compiled=False, why=WHY))
    setup(ext_modules=EXTENSIONS, cmdclass={"build_py": BuildPy, "build_ext": BuildExt})
