"""``--set KEY=VALUE``: change one value of a config from the command line.

``KEY`` is a dotted TOML key path (``engine.workers.aggregated.parallelism.tensor``; a
part with dots or spaces in quotes, as in TOML); ``VALUE`` is a TOML value (``8``,
``0.9``, ``true``, ``"vllm"``, ``[1, 2]``, ``{ type = "fixed", blocks = 100 }``), and a
word TOML cannot read as a value is taken as a string (``engine.hardware=h100_sxm``).
The changed document then goes through the compiler like the file itself, so a wrong key
or value gets the diagnostic the same line in the file would get.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

from servesim import codes
from servesim.errors import CompileError, Diagnostic

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

Override = tuple[tuple[str, ...], Any]
HINT = ("write KEY=VALUE with KEY a dotted config path and VALUE a TOML value, e.g. "
        "--set engine.workers.aggregated.parallelism.tensor=4")


def _error(text: str, message: str, hint: str = HINT) -> CompileError:
    return CompileError([Diagnostic(code=codes.BAD_OVERRIDE, location=f"--set {text}",
                                    message=message, hint=hint)])


def parse_key(text: str, key: str) -> tuple[str, ...]:
    """The parts of a dotted TOML key (``a."b.c".d`` -> ``("a", "b.c", "d")``)."""
    try:
        if "\n" in key or "\r" in key:
            raise ValueError
        table: Any = tomllib.loads(f"{key} = 0")
        if len(table) != 1:
            raise ValueError
    except (tomllib.TOMLDecodeError, ValueError):
        raise _error(text, f"{key.strip()!r} is not a dotted config key") from None
    parts: list[str] = []
    while isinstance(table, dict):
        (name, table), = table.items()
        parts.append(name)
    return tuple(parts)


def parse_value(text: str) -> Any:
    """A TOML value, or the text itself when TOML cannot read it as one (a bare word)."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text.strip()


def split_values(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, braces and quotes (``1,2,[3,4]`` ->
    ``["1", "2", "[3,4]"]``): the values of one key of a sweep."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def split_assignment(text: str) -> tuple[tuple[str, ...], str]:
    """``KEY=VALUE`` -> (key parts, the value's text)."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise _error(text, "expected KEY=VALUE")
    if not value.strip():
        raise _error(text, f"no value for {key.strip()}",
                     'give a value after "=" (an empty string is "")')
    return parse_key(text, key), value


def parse_override(text: str) -> Override:
    """One ``--set KEY=VALUE``."""
    key, value = split_assignment(text)
    return key, parse_value(value)


def apply_overrides(data: dict[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """A copy of the TOML document ``data`` with each override set, in order (a later one
    wins); missing tables on the way are created."""
    out = _copy(data)
    for key, value in overrides:
        table = out
        for depth, part in enumerate(key[:-1]):
            nxt = table.setdefault(part, {})
            if not isinstance(nxt, dict):
                where = ".".join(key[:depth + 1])
                raise CompileError([Diagnostic(
                    code=codes.BAD_OVERRIDE, path=key,
                    message=f"cannot set a key inside {where}: it is a "
                    f"{type(nxt).__name__}, not a table",
                    hint=f"set {where} itself, or a key of a table")])
            table = nxt
        table[key[-1]] = value
    return out


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def format_key(key: Sequence[str]) -> str:
    """A key path as the user writes it (parts with dots or spaces quoted)."""
    return ".".join(p if p and all(c.isalnum() or c in "_-" for c in p) else f'"{p}"'
                    for p in key)
