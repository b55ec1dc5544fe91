"""The build selection: what the install decides (setup.py), what it records, and which
kernel runs (compiled modules that are stale or another environment's never do)."""

from __future__ import annotations

import json
import os
import runpy
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import Any

import pytest

from servesim import build_info
from servesim.build_info import COMPILED, RECORD, Kernel, SourceGuard, kernel, record

REPO = Path(__file__).resolve().parents[1]
SUFFIX = EXTENSION_SUFFIXES[0]


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package folder with the source of every compiled module."""
    root = tmp_path / "servesim"
    for module in COMPILED:
        path = build_info.source_of(module, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"NAME = {module!r}\n", encoding="utf-8")
    return root


def compile_fake(package: Path, modules: tuple[str, ...] = COMPILED) -> None:
    """Stand-ins for the compiled modules (the checks never load them)."""
    for module in modules:
        source = build_info.source_of(module, package)
        source.with_name(module.rsplit(".", 1)[1] + SUFFIX).write_bytes(b"")


def write(package: Path, data: Any) -> None:
    (package / RECORD).write_text(json.dumps(data), encoding="utf-8")


def test_a_pure_install_says_why(package: Path) -> None:
    write(package, record(package, compiled=False, why="no working C compiler"))
    assert kernel(package) == Kernel(False, "not compiled at install: no working C compiler")
    (package / RECORD).unlink()
    assert kernel(package) == Kernel(False, "not compiled at install")


def test_compiled_modules_that_match_their_record_run(package: Path) -> None:
    compile_fake(package)
    write(package, record(package, compiled=True))
    assert kernel(package) == Kernel(True)
    write(package, record(package, compiled=True, in_place=True))  # this environment's
    assert kernel(package) == Kernel(True)


def test_a_source_edited_since_the_build_is_run_from_source(package: Path) -> None:
    compile_fake(package)
    write(package, record(package, compiled=True))
    build_info.source_of("servesim.engines.kernel.core", package).write_text("NAME = 'new'\n")
    assert kernel(package) == Kernel(
        False, "servesim/engines/kernel/core.py changed since it was compiled", ignored=True)


def test_another_environments_compiled_modules_are_not_used(package: Path) -> None:
    compile_fake(package)
    write(package, {**record(package, compiled=True, in_place=True),
                    "environment": "/elsewhere/.venv"})
    assert kernel(package) == Kernel(
        False, "its compiled modules in the checkout were built by /elsewhere/.venv",
        ignored=True)


@pytest.mark.parametrize(("built", "why"), [
    (None, "no record of this build of its compiled modules (reinstall)"),
    (["not", "an", "object"], "no record of this build of its compiled modules (reinstall)"),
    ({"kernel": "pure", "why": "SERVESIM_MYPYC=0"},
     "no record of this build of its compiled modules (reinstall)"),
    ({"kernel": "compiled", "python": ".cpython-99-other.so"},
     "no record of this build of its compiled modules (reinstall)"),
])
def test_compiled_modules_no_record_vouches_for_are_not_used(
        package: Path, built: Any, why: str) -> None:
    compile_fake(package)
    if built is not None:
        write(package, built)
    assert kernel(package) == Kernel(False, why, ignored=True)


def test_a_partly_compiled_kernel_is_not_used(package: Path) -> None:
    compile_fake(package, COMPILED[:-1])
    write(package, record(package, compiled=True))
    assert kernel(package) == Kernel(
        False, f"{COMPILED[-1]} is not compiled (reinstall)", ignored=True)


def test_a_kernel_compiled_for_another_python_says_so(package: Path) -> None:
    write(package, {**record(package, compiled=True), "python": ".cpython-99-other.so"})
    assert kernel(package) == Kernel(
        False, "compiled at install for .cpython-99-other.so, not for this Python")


def test_the_guard_imports_ignored_modules_from_source_with_one_notice(
        package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compile_fake(package)
    write(package, {**record(package, compiled=True, in_place=True), "environment": "/x"})
    guard = SourceGuard(package)
    core = "servesim.engines.kernel.core"
    spec = guard.find_spec(core)
    assert spec is not None and spec.origin == str(build_info.source_of(core, package))
    assert guard.find_spec("servesim.engines.kernel.tokens") is not None
    assert guard.find_spec("servesim.cli") is None  # not a compiled module
    assert capsys.readouterr().err == (
        "servesim: running the replay kernel from source: its compiled modules in the "
        "checkout were built by /x; `pip install -e .` compiles it again\n")


def test_the_guard_leaves_a_sound_compiled_kernel_to_the_import_system(
        package: Path, capsys: pytest.CaptureFixture[str]) -> None:
    compile_fake(package)
    write(package, record(package, compiled=True))
    assert SourceGuard(package).find_spec("servesim.engines.kernel.core") is None
    assert capsys.readouterr().err == ""


def test_the_running_kernel_is_the_one_the_version_names() -> None:
    from servesim.engines.kernel import core

    compiled = core.__file__ is not None and core.__file__.endswith(SUFFIX)
    assert build_info.GUARD.kernel.compiled == compiled
    assert build_info.GUARD in sys.meta_path


# --- setup.py ------------------------------------------------------------------------------

@pytest.fixture
def setup_py(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """setup.py's functions (run under another name: no build)."""
    monkeypatch.delenv("SERVESIM_MYPYC", raising=False)
    return runpy.run_path(str(REPO / "setup.py"), run_name="setup_functions")


def test_the_install_opts_out_of_the_compiled_build_with_a_notice(
        setup_py: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SERVESIM_MYPYC", "0")
    assert setup_py["kernel"]() == ([], "SERVESIM_MYPYC=0")
    assert capsys.readouterr().err == ("servesim: pure-Python build (SERVESIM_MYPYC=0): "
                                       "replays run about twice as slow as compiled\n")


def test_without_a_c_compiler_the_install_is_pure_or_fails_when_asked(
        setup_py: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mypyc.build")
    monkeypatch.setenv("CC", os.devnull + "/no-such-cc")
    why = setup_py["cannot_compile"]()
    assert why.startswith("no working C compiler with the Python headers: ")
    assert "no-such-cc" in why  # (how distutils words it varies with its version)
    assert setup_py["kernel"]() == ([], why)
    assert capsys.readouterr().err == (f"servesim: pure-Python build ({why}): replays run "
                                       "about twice as slow as compiled\n")
    monkeypatch.setenv("SERVESIM_MYPYC", "1")
    with pytest.raises(SystemExit, match="SERVESIM_MYPYC=1, but the compiled kernel cannot "
                       "be built: no working C compiler"):
        setup_py["kernel"]()


def test_a_pure_editable_install_removes_the_compiled_kernel_beside_the_source(
        setup_py: dict[str, Any], package: Path) -> None:
    compile_fake(package)
    core = build_info.source_of("servesim.engines.kernel.core", package)
    other_python = core.with_name("core.cpython-399-other.so")
    shared = package.parent / f"servesim_native__mypyc{SUFFIX}"
    mine = [core.with_name("notes.so.txt"), package.parent / "other.so"]
    for path in (other_python, shared, *mine):
        path.write_bytes(b"")
    setup_py["drop_in_place_extensions"](package)
    left = sorted(p.name for p in package.parent.rglob("*") if p.is_file())
    assert left == sorted([p.name for p in mine]
                          + [build_info.source_of(m, package).name for m in COMPILED])


def test_a_compiled_editable_install_removes_modules_that_left_the_compiled_set(
        setup_py: dict[str, Any], package: Path) -> None:
    compile_fake(package)
    gone = package / "engines" / "kernel" / "turns.py"  # compiled by an earlier build
    gone.write_text("NAME = 'turns'\n", encoding="utf-8")
    gone.with_name("turns" + SUFFIX).write_bytes(b"")
    shared = package.parent / f"servesim_native__mypyc{SUFFIX}"
    shared.write_bytes(b"")
    setup_py["drop_in_place_extensions"](package, keep=COMPILED)
    assert not gone.with_name("turns" + SUFFIX).exists()
    assert shared.exists()
    for module in COMPILED:
        source = build_info.source_of(module, package)
        assert source.with_name(source.stem + SUFFIX).exists()


@pytest.mark.parametrize("data", [b"", b'{"kernel": "compiled", "sour', b"\xff\xfe\x00", b"null"])
def test_an_empty_or_damaged_record_is_no_record(package: Path, data: bytes) -> None:
    compile_fake(package)
    (package / RECORD).write_bytes(data)  # empty, truncated, not UTF-8, not an object
    assert kernel(package) == Kernel(
        False, "no record of this build of its compiled modules (reinstall)", ignored=True)
