"""The one cattrs converter: mapping -> attrs, strictly, with dotted-path diagnostics.

Strictness follows the TOML the user wrote: an integer field takes only an integer
(not a bool, a float or a numeric string), a float field takes an integer or a finite
float, a string field takes only a string, and unknown keys are errors with a
"did you mean" hint. Range limits are checked afterwards from field metadata
(:func:`check_limits`), so every problem in a document is reported at once.
"""

from __future__ import annotations

import difflib
import math
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import (
    AttributeValidationNote,
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
    IterableValidationNote,
)
from cattrs.gen import make_dict_structure_fn

from servesim import backends, codes
from servesim.errors import Diagnostic, Path, format_path

T = TypeVar("T")


class _TypeMismatch(Exception):
    """Raised by the strict hooks; carries a user-facing message."""

    def __init__(self, message: str, code: str = codes.WRONG_TYPE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int):
        return f"integer {value}"
    if isinstance(value, float):
        return f"float {value!r}"
    if isinstance(value, str):
        return f"string {value!r}"
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__


def _int(value: Any, _: Any = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _TypeMismatch(f"expected an integer, got {_describe(value)}")
    return value


def _float(value: Any, _: Any = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _TypeMismatch(f"expected a number, got {_describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise _TypeMismatch(f"expected a finite number, got {value!r}", codes.NOT_FINITE)
    return float(value)


def _str(value: Any, _: Any = None) -> str:
    if not isinstance(value, str):
        raise _TypeMismatch(f"expected a string, got {_describe(value)}")
    return value


def _bool(value: Any, _: Any = None) -> bool:
    if not isinstance(value, bool):
        raise _TypeMismatch(f"expected true or false, got {_describe(value)}")
    return value


def _literal_values(tp: Any) -> tuple[Any, ...]:
    return get_args(tp)


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _union_members(tp: Any) -> list[Any]:
    return [a for a in get_args(tp) if a is not type(None)]


def _choices(values: tuple[Any, ...]) -> str:
    return ", ".join(f'"{v}"' if isinstance(v, str) else repr(v) for v in values)


def _structure_literal(value: Any, tp: Any) -> Any:
    allowed = _literal_values(tp)
    if isinstance(value, str) and value in allowed:
        return value
    raise _TypeMismatch(f"expected one of {_choices(allowed)}, got {_describe(value)}",
                        codes.BAD_CHOICE)


def _backend_name(known: Mapping[str, Any]) -> Callable[[Any, Any], backends.BackendName]:
    """The hook reading a backend's name: one of ``known`` (a registry's backends)."""
    allowed = tuple(known)

    def hook(value: Any, _: Any = None) -> backends.BackendName:
        if isinstance(value, str) and value in allowed:
            return backends.BackendName(value)
        raise _TypeMismatch(f"expected one of {_choices(allowed)}, got {_describe(value)}",
                            codes.BAD_CHOICE)

    return hook


def _structure_scalar_union(value: Any, tp: Any) -> Any:
    """``int | Literal["auto"]`` and friends: a keyword or a number."""
    members = _union_members(tp)
    words: tuple[Any, ...] = ()
    for m in members:
        if get_origin(m) is Literal:
            words += _literal_values(m)
    if isinstance(value, str):
        if value in words:
            return value
    elif int in members and not isinstance(value, bool) and isinstance(value, int):
        return value
    elif float in members and not isinstance(value, bool) and isinstance(value, (int, float)):
        return _float(value)
    kinds = " or ".join(["an integer"] * (int in members) + ["a number"] * (float in members))
    raise _TypeMismatch(f"expected {kinds} or {_choices(words)}, got {_describe(value)}")


def _is_scalar_union(tp: Any) -> bool:
    if not _is_union(tp):
        return False
    members = _union_members(tp)
    return len(members) > 1 and all(m in (int, float) or get_origin(m) is Literal for m in members)


def _is_number_or_table(tp: Any) -> bool:
    """``float | dict[str, float]``: one number, or a table of them by name."""
    if not _is_union(tp):
        return False
    members = _union_members(tp)
    return len(members) == 2 and any(m in (int, float) for m in members) and any(
        get_origin(m) is dict for m in members)


def _is_scalar_or_table(tp: Any) -> bool:
    """``int | SomeTable``: a number, or a table structured as the attrs class (a length
    that is fixed or drawn from a distribution)."""
    if not _is_union(tp):
        return False
    members = _union_members(tp)
    tables = [m for m in members if attrs.has(m)]
    return len(tables) == 1 and len(members) == 2 and (int in members or float in members)


def _structure_scalar_or_table(conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    def hook(value: Any, tp: Any) -> Any:
        members = _union_members(tp)
        if isinstance(value, dict):
            return conv.structure(value, next(m for m in members if attrs.has(m)))
        if int in members and not isinstance(value, bool) and isinstance(value, int):
            return value
        if float in members and not isinstance(value, bool) and isinstance(value, (int, float)):
            return _float(value)
        kind = "an integer" if int in members else "a number"
        raise _TypeMismatch(f"expected {kind} or a table, got {_describe(value)}")

    return hook


def make_converter(known_backends: Mapping[str, Any] = backends.BUILTIN,
                   ) -> cattrs.Converter:
    """servesim's strict converter; ``engine.backend`` must name one of ``known_backends``."""
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    conv.register_structure_hook(int, _int)
    conv.register_structure_hook(float, _float)
    conv.register_structure_hook(str, _str)
    conv.register_structure_hook(bool, _bool)
    conv.register_structure_hook(backends.BackendName, _backend_name(known_backends))
    conv.register_structure_hook_func(lambda t: get_origin(t) is Literal, _structure_literal)
    conv.register_structure_hook_func(_is_scalar_union, _structure_scalar_union)

    def dict_hook(value: Any, tp: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _TypeMismatch(f"expected a table, got {_describe(value)}")
        args = get_args(tp)
        if len(args) != 2 or args[1] is Any:
            return dict(value)
        out, errors = {}, []
        for key, v in value.items():
            try:
                out[key] = conv.structure(v, args[1])
            except Exception as exc:  # collected below with the key
                exc.__notes__ = [*getattr(exc, "__notes__", []), AttributeValidationNote(
                    f"@ key {key}", key, args[1])]
                errors.append(exc)
        if errors:
            raise ClassValidationError(f"While structuring {tp}", errors, dict)
        return out

    conv.register_structure_hook_func(lambda t: t is dict or get_origin(t) is dict, dict_hook)

    def number_or_table(value: Any, tp: Any) -> Any:
        table, number = sorted(_union_members(tp), key=lambda m: get_origin(m) is not dict)
        if isinstance(value, dict):
            return dict_hook(value, table)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _TypeMismatch(f"expected a number or a table of numbers, got "
                                f"{_describe(value)}")
        return conv.structure(value, number)

    conv.register_structure_hook_func(_is_number_or_table, number_or_table)

    def list_hook(value: Any, tp: Any) -> list[Any]:
        if not isinstance(value, list):
            raise _TypeMismatch(f"expected an array, got {_describe(value)}")
        item = get_args(tp)[0]
        out, errors = [], []
        for i, v in enumerate(value):
            try:
                out.append(conv.structure(v, item))
            except Exception as exc:  # collected below with the index
                exc.__notes__ = [*getattr(exc, "__notes__", []), IterableValidationNote(
                    f"@ index {i}", i, item)]
                errors.append(exc)
        if errors:
            raise IterableValidationError(f"While structuring {tp}", errors, tp)
        return tuple(out) if get_origin(tp) is tuple else out  # type: ignore[return-value]

    conv.register_structure_hook_func(
        lambda t: get_origin(t) is list or (get_origin(t) is tuple and get_args(t)[-1:] == (
            Ellipsis,)), list_hook)

    def attrs_hook_factory(cl: Any) -> Any:
        # cattrs' generated hook fails on a scalar with "'int' object is not iterable"
        inner = make_dict_structure_fn(cl, conv)

        def hook(value: Any, tp: Any) -> Any:
            if not isinstance(value, dict):
                raise _TypeMismatch(f"expected a table, got {_describe(value)}")
            return inner(value, tp)

        return hook

    conv.register_structure_hook_factory(attrs.has, attrs_hook_factory)
    conv.register_structure_hook_func(_is_tagged_union, _structure_tagged_union(conv))
    conv.register_structure_hook_func(_is_scalar_or_table, _structure_scalar_or_table(conv))
    return conv


def _tags(cls: Any) -> tuple[Any, ...]:
    """The ``type`` values an attrs class of a tagged union answers to."""
    return get_args(typing.get_type_hints(cls).get("type"))


def _is_tagged_union(tp: Any) -> bool:
    """A union of attrs classes told apart by a ``type`` key (a workload's source, load)."""
    if not _is_union(tp):
        return False
    members = _union_members(tp)
    return len(members) > 1 and all(attrs.has(m) and _tags(m) for m in members)


def _structure_tagged_union(conv: cattrs.Converter) -> Callable[[Any, Any], Any]:
    def hook(value: Any, tp: Any) -> Any:
        if not isinstance(value, dict):
            raise _TypeMismatch(f"expected a table, got {_describe(value)}")
        members = {tag: m for m in _union_members(tp) for tag in _tags(m)}
        tag = value.get("type", next(iter(members)))  # absent: the first member's
        if not isinstance(tag, str) or tag not in members:
            exc = _TypeMismatch(f"expected one of {_choices(tuple(members))}, got "
                                f"{_describe(tag)}", codes.BAD_CHOICE)
            exc.__notes__ = [AttributeValidationNote("@ key type", "type", str)]
            raise ClassValidationError(f"While structuring {tp}", [exc], dict)
        return conv.structure(value, members[tag])

    return hook


def _edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance: a swap of two neighbours is one typo."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def closest(word: str, candidates: list[str]) -> str | None:
    """The candidate a typo most likely meant: fewest edits, then the same length, then
    difflib similarity (``modle`` means ``model``, not ``mode``)."""
    if not candidates:
        return None
    best = min(candidates, key=lambda c: (_edit_distance(word, c), abs(len(c) - len(word)),
                                          -difflib.SequenceMatcher(None, word, c).ratio()))
    if _edit_distance(word, best) <= max(2, len(word) // 3):
        return best
    close = difflib.get_close_matches(word, candidates, n=1)
    return close[0] if close else None


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in attrs.fields(cls)] if attrs.has(cls) else []


def _walk(exc: BaseException, path: Path, cls: Any) -> Iterator[Diagnostic]:
    if isinstance(exc, ForbiddenExtraKeysError):
        known = _field_names(exc.cl)
        for key in sorted(exc.extra_fields):
            close = closest(key, known)
            hint = f"did you mean '{close}'?" if close else None
            allowed = ", ".join(known)
            yield Diagnostic(
                code=codes.UNKNOWN_KEY,
                message=f"unknown key '{key}' (allowed here: {allowed})",
                path=(*path, key),
                hint=hint,
            )
        return
    if isinstance(exc, (ClassValidationError, IterableValidationError)):
        sub_cls = getattr(exc, "cl", None)
        for sub in exc.exceptions:
            sub_path = path
            for note in getattr(sub, "__notes__", []):
                if isinstance(note, AttributeValidationNote):
                    sub_path = (*path, note.name)
                elif isinstance(note, IterableValidationNote):
                    sub_path = (*path, int(note.index))
            yield from _walk(sub, sub_path, sub_cls)
        return
    if isinstance(exc, _TypeMismatch):
        yield Diagnostic(code=exc.code, message=exc.message, path=path)
        return
    if isinstance(exc, KeyError):
        key = exc.args[0] if exc.args else "?"
        yield Diagnostic(code=codes.MISSING_KEY, message=f"required key '{key}' is missing",
                         path=path)
        return
    if isinstance(exc, TypeError) and "missing" in str(exc):
        yield Diagnostic(code=codes.MISSING_KEY, message=str(exc), path=path)
        return
    yield Diagnostic(code=codes.INVALID_VALUE, message=str(exc) or type(exc).__name__, path=path)


def structure(conv: cattrs.Converter, data: Any, cls: type[T], root: Path = ()) -> tuple[
        T | None, list[Diagnostic]]:
    """Structure ``data`` into ``cls``; on failure return every problem as a Diagnostic."""
    if not isinstance(data, dict):
        return None, [Diagnostic(code=codes.WRONG_TYPE,
                                 message=f"expected a table, got {_describe(data)}", path=root)]
    try:
        return conv.structure(data, cls), []
    except ClassValidationError as exc:
        diags = list(_walk(exc, root, cls))
        return None, _dedupe(diags)


def _dedupe(diags: list[Diagnostic]) -> list[Diagnostic]:
    seen: set[tuple[str, str]] = set()
    out = []
    for d in diags:
        key = (format_path(d.path), d.message)
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def structure_options(cls: type, data: Any, path: Path, owner: str) -> tuple[Any, list[Diagnostic]]:
    """A plugin's options table (``[engine.options]``, a timing type's ``options``) as an
    instance of its attrs ``Options`` class ``cls``, defaults applied and limits checked; or
    ``None`` and diagnostics located under ``path``. ``owner`` names whose options they are.
    """
    if data is None:
        data = {}
    if isinstance(data, dict) and data and not attrs.fields(cls):
        return None, [Diagnostic(code=codes.UNKNOWN_KEY, path=(*path, key),
                                 message=f"unknown key '{key}' ({owner} has no options)")
                      for key in data]
    options, diags = structure(make_converter(), data, cls, path)
    if options is None:
        return None, diags
    diags = check_limits(options, path)
    return (None, diags) if diags else (options, [])


def check_limits(obj: Any, root: Path = (),
                 path_of: Callable[[str], Path] | None = None) -> list[Diagnostic]:
    """Check ``lo``/``hi`` metadata of every set numeric field in an attrs tree.

    ``path_of(field_name)`` names where a top-level field lives when that is not
    ``root + (field_name,)`` (a payload role's fields live under config sections).
    """
    out: list[Diagnostic] = []
    for f in attrs.fields(type(obj)):
        value = getattr(obj, f.name)
        path = path_of(f.name) if path_of is not None else (*root, f.name)
        if attrs.has(type(value)):
            out.extend(check_limits(value, path))
        else:
            out.extend(check_limits_of_field(f, value, path))
    return out


def check_limits_of_field(f: Any, value: Any, path: Path) -> list[Diagnostic]:
    """Bounds of one field's value (each item of a list or tuple, each value of a dict)."""
    lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
    if value is None or (lo is None and hi is None):
        return []
    out = []
    items: list[tuple[Any, Any]] = [(None, value)]
    if isinstance(value, (list, tuple)):
        items = list(enumerate(value))
    elif isinstance(value, dict):  # a table of numbers by name
        items = list(value.items())
    for idx, v in items:
        if isinstance(v, (str, bool)) or not isinstance(v, (int, float)):
            continue
        p = path if idx is None else (*path, idx)
        if isinstance(v, float) and not math.isfinite(v):
            out.append(Diagnostic(code=codes.NOT_FINITE,
                                  message=f"expected a finite number, got {v}",
                                  path=p))
            continue
        bad_lo = lo is not None and (v <= lo if f.metadata.get("lo_open") else v < lo)
        if bad_lo or (hi is not None and v > hi):
            out.append(Diagnostic(code=codes.OUT_OF_RANGE, message=_range_message(f.metadata, v),
                                  path=p))
    return out


def _num(x: float) -> str:
    if isinstance(x, float) and x.is_integer() and abs(x) < 1e15:
        x = int(x)
    if isinstance(x, int) and x >= 2**20:
        if x & (x + 1) == 0:
            return f"2^{(x + 1).bit_length() - 1}-1"
        if x & (x - 1) == 0:
            return f"2^{x.bit_length() - 1}"
    return str(x)


def _range_message(meta: typing.Mapping[str, Any], v: float) -> str:
    lo, hi, lo_open = meta.get("lo"), meta.get("hi"), meta.get("lo_open")
    got = _num(v)
    if lo is not None and hi is not None:
        left = "(" if lo_open else "["
        return f"must be in {left}{_num(lo)}, {_num(hi)}], got {got}"
    if lo is not None:
        return f"must be {'>' if lo_open else '>='} {_num(lo)}, got {got}"
    return f"must be <= {_num(hi or 0)}, got {got}"
