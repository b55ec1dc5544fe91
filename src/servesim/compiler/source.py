"""Read a config: bytes -> TOML mapping. Syntax errors become ``file:line:col`` diagnostics."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import attrs

from servesim import codes
from servesim.compiler.overrides import Override, apply_overrides
from servesim.errors import CompileError, ServesimError, error
from servesim.files import Unreadable, read_bounded

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

MAX_CONFIG_BYTES = 4 * 1024 * 1024
_LOCATION = re.compile(r"\(at line (\d+), column (\d+)\)")


@attrs.frozen
class SourceText:
    """A config document and where it came from (``name`` is shown in diagnostics)."""

    text: str
    name: str = "<config>"
    base_dir: Path | None = None  # relative trace paths resolve against this
    # ``--set KEY=VALUE`` changes, applied to the document before it is parsed
    overrides: tuple[Override, ...] = ()

    @classmethod
    def from_path(cls, path: str | Path, overrides: tuple[Override, ...] = ()) -> SourceText:
        p = Path(path)
        data = read_input(p, "a TOML file", CompileError)
        return attrs.evolve(cls.from_bytes(data, name=str(p), base_dir=p.resolve().parent),
                            overrides=overrides)

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "<config>",
                   base_dir: Path | None = None) -> SourceText:
        try:
            text = data.decode("utf-8-sig")  # a BOM from Windows editors is not an error
        except UnicodeDecodeError as exc:
            raise CompileError([error(codes.NOT_UTF8, (), f"not UTF-8 text (byte {exc.start})",
                                      location=name, stage="parse")]) from None
        return cls(text=text, name=name, base_dir=base_dir)


def read_input(path: Path, what: str, failure: type[ServesimError]) -> bytes:
    """The bytes of an input file (``what``: "a TOML file", "a JSON payload"): a regular
    file of at most :data:`MAX_CONFIG_BYTES`; one that is not raises ``failure`` located at
    the path."""
    try:
        return read_bounded(path, what, MAX_CONFIG_BYTES)
    except Unreadable as exc:
        raise failure([error(exc.code, (), exc.message, location=str(path),
                             stage="parse")]) from None


def load_toml(source: SourceText) -> dict[str, Any]:
    """Parse TOML text; raise :class:`CompileError` with ``file:line:col`` on bad syntax."""
    if not source.text.strip():
        raise CompileError([error(codes.EMPTY_CONFIG, (), "the file is empty; a config needs at "
                                  "least an [engine] table with model, hardware and workers",
                                  location=source.name, stage="parse")])
    try:
        return apply_overrides(tomllib.loads(source.text), source.overrides)
    except tomllib.TOMLDecodeError as exc:
        msg = str(exc)
        m = _LOCATION.search(msg)
        line = getattr(exc, "lineno", None) or (int(m.group(1)) if m else None)
        col = getattr(exc, "colno", None) or (int(m.group(2)) if m else None)
        text = getattr(exc, "msg", None) or _LOCATION.sub("", msg).strip()
        where = f"{source.name}:{line}:{col}" if line else source.name
        diag = error(codes.TOML_SYNTAX, (), f"invalid TOML: {text}", location=where,
                     stage="parse")
        if source.text.lstrip().startswith("{"):
            diag = attrs.evolve(diag, hint="this looks like a JSON payload: `servesim replay` "
                                "takes one, the other commands a TOML config")
        raise CompileError([diag]) from None
    except RecursionError:
        raise CompileError([error(codes.TOML_SYNTAX, (), "invalid TOML: nesting too deep",
                                  location=source.name, stage="parse")]) from None
