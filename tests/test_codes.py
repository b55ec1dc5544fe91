"""Diagnostic codes are named constants (servesim.codes), all listed in the docs, and the
code base raises no code that is not one of them."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from servesim import codes

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "servesim"
DOCS = ROOT / "docs" / "diagnostics.md"
KEBAB = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)+$")


def declared() -> dict[str, str]:
    return {name: value for name, value in vars(codes).items()
            if name.isupper() and isinstance(value, str)}


# the functions that take a diagnostic code, and the position of that argument
CODE_ARGUMENT = {"error": 0, "_error": 0, "_unknown": 0, "fail": 1}


def code_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String literals where a diagnostic code is written: ``code=...`` keywords, and the
    code argument of the functions that take one (:data:`CODE_ARGUMENT`)."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        args = [k.value for k in node.keywords if k.arg == "code"]
        name = getattr(node.func, "id", getattr(node.func, "attr", None))
        at = CODE_ARGUMENT.get(name or "")
        if at is not None and len(node.args) > at and not (
                isinstance(node.args[at], ast.JoinedStr) and name == "_error"):
            args.append(node.args[at])  # (a calibration _error's first argument is a place)
        out += [(a.lineno, ast.unparse(a)) for a in args
                if isinstance(a, ast.Constant | ast.JoinedStr)]
    return out


def test_each_constant_is_its_own_kebab_case_name() -> None:
    for name, value in declared().items():
        assert KEBAB.match(value), (name, value)
        assert name == value.upper().replace("-", "_"), (name, value)
    assert len(set(declared().values())) == len(declared())


def test_every_code_is_documented_and_every_documented_code_exists() -> None:
    listed = set(re.findall(r"^\| `([a-z0-9-]+)` \|", DOCS.read_text(encoding="utf-8"), re.M))
    assert listed == set(declared().values())


def test_the_code_base_raises_codes_through_the_constants() -> None:
    literals = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        literals += [f"{path.relative_to(SRC)}:{line}: {text}"
                     for line, text in code_literals(tree)]
    assert literals == []


def test_a_code_literal_is_found_where_one_is_written() -> None:
    # the check above can fail: it sees a literal keyword and a literal first argument
    tree = ast.parse('Diagnostic(code="x-y", message="m")\nerror(f"a-{b}", (), "m")\n'
                     'rec.fail(path, "p-q", "m")\n')
    assert code_literals(tree) == [(1, "'x-y'"), (2, "f'a-{b}'"), (3, "'p-q'")]
