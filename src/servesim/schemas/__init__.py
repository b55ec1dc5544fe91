"""JSON Schemas of the config and the payload, generated from the attrs classes.

The committed files are what ``servesim schema`` prints and what TOML editors use;
``tests/test_schemas.py`` fails when they are stale and names the regeneration command::

    python -m servesim.schemas
"""

from __future__ import annotations

import json
import types
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import attrs

FILES = {"config": "config.schema.json", "payload": "payload.v1.schema.json"}


def load_schema(which: str) -> dict[str, Any]:
    text = resources.files(__name__).joinpath(FILES[which]).read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def generate(which: str) -> dict[str, Any]:
    from servesim.compiler.model.parsed import ParsedConfig
    from servesim.payload import SCHEMA_VERSION, Payload

    root = ParsedConfig if which == "config" else Payload
    defs: dict[str, Any] = {}
    schema = _class_schema(root, defs)
    title = "servesim config" if which == "config" else f"servesim payload v{SCHEMA_VERSION}"
    out = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
           **schema, "$defs": defs}
    if which == "payload":
        out["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    return out


def _class_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints = get_type_hints(cls)
    props: dict[str, Any] = {}
    required = []
    for f in attrs.fields(cls):
        s = _type_schema(hints[f.name], defs)
        lo, hi = f.metadata.get("lo"), f.metadata.get("hi")
        target = s.get("items", s) if s.get("type") == "array" else s
        for branch in target.get("anyOf", [target]):
            if branch.get("type") in ("integer", "number"):
                if lo is not None:
                    branch["exclusiveMinimum" if f.metadata.get("lo_open") else "minimum"] = lo
                if hi is not None:
                    branch["maximum"] = hi
        props[f.name] = s
        if f.default is attrs.NOTHING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if cls.__doc__:
        out["description"] = " ".join(cls.__doc__.split())
    if required:
        out["required"] = required
    return out


def _type_schema(tp: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _type_schema(members[0], defs)
        return {"anyOf": [_type_schema(m, defs) for m in members]}
    if origin is Literal:
        return {"enum": list(get_args(tp))}
    if origin is list or (origin is tuple and get_args(tp)[-1] is Ellipsis):
        return {"type": "array", "items": _type_schema(get_args(tp)[0], defs)}
    if origin is dict:
        _key, value = get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(value, defs)}
    if attrs.has(tp):
        if tp.__name__ not in defs:
            defs[tp.__name__] = {}
            defs[tp.__name__] = _class_schema(tp, defs)
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
