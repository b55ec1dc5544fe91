"""JSON Schemas of the config and the payload, generated from the attrs classes.

The committed files are what ``servesim schema`` prints and what TOML editors use;
``tests/test_schemas.py`` fails when they are stale and names the regeneration command::

    python -m servesim.schemas
"""

from __future__ import annotations

import json
import types
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin, get_type_hints

import attrs

if TYPE_CHECKING:
    from servesim.plugins.manager import EngineRegistry

FILES = {"config": "config.schema.json", "payload": "payload.v1.schema.json"}


def load_schema(which: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(FILES[which]).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def generate(which: str, registry: EngineRegistry | None = None) -> dict[str, Any]:
    """The schema of ``which``; the config's engine options come from ``registry``.

    The committed files are generated with the built-in plugins only (``registry=None``).
    """
    from servesim.compiler.model.parsed import ParsedConfig
    from servesim.payload import SCHEMA_VERSION, Payload

    root = ParsedConfig if which == "config" else Payload
    defs: dict[str, Any] = {}
    # TOML has no null: an optional config key is simply absent. A payload is JSON and
    # writes absent optional values as null.
    schema = _class_schema(root, defs, nullable=which == "payload")
    title = "servesim config" if which == "config" else f"servesim payload v{SCHEMA_VERSION}"
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
           **schema, "$defs": defs}
    if which == "payload":
        out["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    else:
        add_engine_options(out, registry)
    return out


def add_engine_options(schema: dict[str, Any], registry: EngineRegistry | None = None) -> None:
    """Constrain ``engine.options`` by the selected engine's ``Options`` (in place).

    ``$defs["options.<engine>"]`` is each registered engine's options schema, applied
    with ``if engine == <name> then options: <schema>``.
    """
    if registry is None:
        from servesim.plugins.manager import EngineRegistry, get_plugin_manager

        registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    defs = schema["$defs"]
    engine = defs["Engine"]
    props = engine["properties"]
    documented = props["engine"]["description"].split("; registered: ")[0]  # (applied twice)
    props["engine"]["description"] = f"{documented}; registered: {', '.join(registry.names())}"
    props["backend"] = {**props["backend"], "enum": list(registry.backends)}
    props["backend"].pop("type", None)
    branches = []
    for name, cls, _plugin in registry.items():
        defs[f"options.{name}"] = _class_schema(cls.Options, defs, defaults=True)
        branches.append({"if": {"properties": {"engine": {"const": name}},
                                "required": ["engine"]},
                         "then": {"properties": {"options": {"$ref": f"#/$defs/options.{name}"}}}})
    engine["allOf"] = branches


def _class_schema(cls: type, defs: dict[str, Any], *, defaults: bool = False,
                  nullable: bool = False) -> dict[str, Any]:
    """An attrs class as an object schema. Each property states what the field's metadata
    declares: ``help`` (the description), ``lo``/``hi`` (the range), ``default`` (with
    ``derived``: how a default that is no fixed value is found) and ``examples``.
    ``defaults``: also state the attrs defaults (an engine's ``Options``)."""
    hints = get_type_hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in attrs.fields(cls):
        s = _type_schema(hints[f.name], defs, nullable)
        _bounds(s, f.metadata)
        props[f.name] = {**s, **_documented(f, defaults)}
        if f.default is attrs.NOTHING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _bounds(s: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """The ``lo``/``hi`` metadata on every numeric branch of ``s`` (items of an array)."""
    lo, hi = meta.get("lo"), meta.get("hi")
    target = s.get("items", s) if s.get("type") == "array" else s
    for branch in target.get("anyOf", [target]):
        if branch.get("type") == "object":  # a table of numbers by name
            branch = branch.get("additionalProperties") or {}
        if branch.get("type") in ("integer", "number"):
            if lo is not None:
                branch["exclusiveMinimum" if meta.get("lo_open") else "minimum"] = lo
            if hi is not None:
                branch["maximum"] = hi


def _documented(f: attrs.Attribute[Any], defaults: bool) -> dict[str, Any]:
    """A field's ``description``, ``default`` and ``examples``."""
    meta = f.metadata
    out: dict[str, Any] = {}
    description = meta.get("help") or ""
    default = meta.get("default")
    if defaults and isinstance(f.default, (bool, int, float, str)):
        default = f.default
    if meta.get("derived"):
        description += f". Default: {meta['derived']}"
    elif default is not None:
        out["default"] = default
    if description:
        out["description"] = description
    if meta.get("examples"):
        out["examples"] = list(meta["examples"])
    return out


def _type_schema(tp: Any, defs: dict[str, Any], nullable: bool) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        schemas = [_type_schema(m, defs, nullable) for m in members]
        if nullable and len(members) < len(get_args(tp)):
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin is list or (origin is tuple and get_args(tp)[-1] is Ellipsis):
        return {"type": "array", "items": _type_schema(get_args(tp)[0], defs, nullable)}
    if origin is dict:
        _key, value = get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(value, defs, nullable)}
    if attrs.has(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}
            defs[tp.__name__] = _class_schema(tp, defs, nullable=nullable)
        return {"$ref": f"#/$defs/{tp.__name__}"}
    simple = {int: "integer", float: "number", str: "string", bool: "boolean"}
    if tp in simple:
        return {"type": simple[tp]}
    return {}


def write_all(folder: Path | None = None) -> list[Path]:
    folder = folder or Path(__file__).parent
    written = []
    for which, name in FILES.items():
        path = folder / name
        path.write_text(json.dumps(generate(which), indent=2, sort_keys=True) + "\n",
                        encoding="utf-8")
        written.append(path)
    return written
