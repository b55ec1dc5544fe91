"""The config schema documents every key: what it means, its default, its limits, examples.

Editors (Taplo, VS Code's Even Better TOML) show these from ``servesim schema config``. The
defaults are the resolve pass's own: both read the field metadata of ``parsed.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs
import jsonschema
import pytest

from servesim.compiler import SourceText, compile_source
from servesim.compiler.model import parsed
from servesim.compiler.model.parsed import ParsedConfig
from servesim.schemas import generate, load_schema

SCHEMA = load_schema("config")
MINIMAL = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
           "[engine.workers.aggregated]\n")


def properties(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(table, key, property schema) of every config key, the root's included."""
    tables = {"ParsedConfig": schema, **schema["$defs"]}
    for table, sub in tables.items():
        for name, prop in sub.get("properties", {}).items():
            yield table, name, prop


def config_classes() -> Iterator[type]:
    seen: list[type] = []
    todo: list[type] = [ParsedConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.append(cls)
        yield cls
        for f in attrs.fields(cls):
            todo += [c for c in vars(parsed).values()
                     if isinstance(c, type) and attrs.has(c) and c.__name__ in str(f.type)]


KEYS = sorted(f"{table}.{name}" for table, name, _ in properties(SCHEMA))


def test_the_schema_documents_every_key_of_the_config() -> None:
    assert len(KEYS) > 100
    undocumented = [f"{table}.{name}" for table, name, prop in properties(SCHEMA)
                    if not prop.get("description", "").strip()]
    assert undocumented == []
    tables = [name for name, sub in SCHEMA["$defs"].items()
              if sub.get("properties") and not sub.get("description")]
    assert tables == []


def test_every_key_with_a_default_states_it_or_how_it_is_derived() -> None:
    missing = []
    for cls in config_classes():
        props = SCHEMA["$defs"].get(cls.__name__, SCHEMA)["properties"]
        for f in attrs.fields(cls):
            prop, meta = props[f.name], f.metadata
            if meta.get("derived"):
                ok = "default" not in prop and f"Default: {meta['derived']}" in prop["description"]
            elif meta.get("default") is not None:
                ok = prop.get("default") == meta["default"]
            else:
                ok = "default" not in prop
            if not ok:
                missing.append(f"{cls.__name__}.{f.name}")
    assert missing == []


def test_scalar_keys_have_examples_and_numbers_their_limits() -> None:
    lacking = [f"{table}.{name}" for table, name, prop in properties(SCHEMA)
               if "$ref" not in prop and prop.get("type") != "object" and not prop.get("examples")]
    assert lacking == []
    unbounded = [f"{table}.{name}" for table, name, prop in properties(SCHEMA)
                 if prop.get("type") in ("integer", "number")
                 and not ({"minimum", "exclusiveMinimum"} & set(prop) and "maximum" in prop)]
    assert unbounded == []


@pytest.mark.parametrize("key", KEYS)
def test_defaults_and_examples_are_valid_values_of_their_key(key: str) -> None:
    table, name = key.split(".")
    prop = (SCHEMA if table == "ParsedConfig" else SCHEMA["$defs"][table])["properties"][name]
    validator = jsonschema.Draft202012Validator({**prop, "$defs": SCHEMA["$defs"]})
    values = ([prop["default"]] if "default" in prop else []) + prop.get("examples", [])
    for value in values:
        assert list(validator.iter_errors(value)) == [], value


def test_the_resolve_pass_applies_the_defaults_the_schema_states() -> None:
    payload = compile_source(SourceText(text=MINIMAL, name="minimal.toml"))
    role = payload.roles["aggregated"]
    defs = SCHEMA["$defs"]
    for table in ("Parallelism", "Scheduler"):
        for name, prop in defs[table]["properties"].items():
            if "default" in prop:
                assert getattr(role, name) == prop["default"], f"{table}.{name}"
    assert role.prefix_caching is defs["KvCache"]["properties"]["prefix_caching"]["default"]
    assert role.timing.type == defs["Timing"]["properties"]["type"]["default"]
    workload = payload.workload
    for section, table in (("source", "Source"), ("load", "Load")):
        for name, value in attrs.asdict(getattr(workload, section)).items():
            prop = defs[table]["properties"].get(name, {})
            if "default" in prop and name != "output_range_ratio":
                assert value == prop["default"], f"{table}.{name}"
    requests = defs["Stop"]["properties"]["requests"]["description"]
    assert f"Default: {workload.stop.requests} for a synthetic source" in requests


def test_a_changed_default_changes_what_the_resolve_pass_applies() -> None:
    """One declaration: the field metadata is what the resolver reads."""
    field = attrs.fields_dict(parsed.Scheduler)["prefill_schedule_interval"]
    declared = field.metadata
    object.__setattr__(field, "metadata", {**declared, "default": 3})  # (attrs freezes it)
    try:
        payload = compile_source(SourceText(text=MINIMAL, name="minimal.toml"))
        schema = generate("config")
    finally:
        object.__setattr__(field, "metadata", declared)
    assert payload.roles["aggregated"].prefill_schedule_interval == 3
    assert schema["$defs"]["Scheduler"]["properties"]["prefill_schedule_interval"]["default"] == 3


def test_the_cli_prints_the_documented_schema(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from servesim.cli import main

    assert main(["schema", "config"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["$defs"]["KvCache"]["properties"]["prefix_caching"] == {
        "type": "boolean", "default": True, "examples": [False],
        "description": "reuse the KV blocks of complete prompt prefixes"}
    engine = printed["$defs"]["Engine"]["properties"]["engine"]["description"]
    assert engine.count("registered:") == 1
