"""The import direction of the package: lower layers never import upper ones."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "servesim"


def loaded_by(module: str, prefixes: tuple[str, ...]) -> list[str]:
    """The servesim modules under ``prefixes`` that importing ``module`` loads."""
    code = (f"import sys, {module}; print(sorted(m for m in sys.modules "
            f"if m.startswith({prefixes!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    return list(ast.literal_eval(out.strip()))


@pytest.mark.parametrize(("module", "forbidden"), [
    ("servesim.compiler.pipeline", ("servesim.plugins", "servesim.cli")),
    ("servesim.workloads", ("servesim.compiler", "servesim.plugins", "servesim.cli")),
    ("servesim.payload", ("servesim.compiler", "servesim.plugins", "servesim.cli")),
])
def test_a_layer_loads_nothing_above_it(module: str, forbidden: tuple[str, ...]) -> None:
    assert loaded_by(module, forbidden) == []


def test_no_inner_module_imports_the_package_for_its_version() -> None:
    """``servesim/__init__`` is the public surface; the version lives in servesim.version."""
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "__init__.py" and path.parent == SRC:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "servesim" and any(
                    a.name == "__version__" for a in node.names):
                offenders.append(str(path.relative_to(SRC)))
    assert offenders == []


def test_the_compiler_passes_never_import_the_plugins_package() -> None:
    offenders = []
    for path in (SRC / "compiler").rglob("*.py"):
        if path == SRC / "compiler" / "__init__.py":
            continue  # compile_source's default registry, built at call time
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom) else
                     [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.relative_to(SRC)}: {n}" for n in names
                          if n.startswith("servesim.plugins")]
    assert offenders == []
