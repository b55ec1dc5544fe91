"""The committed JSON Schemas: fresh, well-formed, and in agreement with the examples."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from servesim.compiler.source import tomllib
from servesim.schemas import FILES, generate, load_schema

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples" / "configs").glob("*.toml"))
REGENERATE = "python -m servesim.schemas"


@pytest.mark.parametrize("which", sorted(FILES))
def test_committed_schema_is_fresh(which: str) -> None:
    assert load_schema(which) == generate(which), (
        f"src/servesim/schemas/{FILES[which]} is stale (the attrs classes changed); "
        f"regenerate it with: {REGENERATE}")


@pytest.mark.parametrize("which", sorted(FILES))
def test_committed_schema_is_a_valid_json_schema(which: str) -> None:
    jsonschema.Draft202012Validator.check_schema(load_schema(which))


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_configs_match_the_config_schema(example: Path) -> None:
    data = tomllib.loads(example.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator(load_schema("config")).validate(data)


def test_config_schema_rejects_what_the_compiler_rejects() -> None:
    validator = jsonschema.Draft202012Validator(load_schema("config"))
    doc = {"engine": {"model": "m", "hardware": "h", "workers": {"aggregated": {
        "kv_cache": {"blok_size": 4, "block_size": 0}}}}}
    messages = sorted(e.message for e in validator.iter_errors(doc))
    assert messages == ["0 is less than the minimum of 1",
                        "Additional properties are not allowed ('blok_size' was unexpected)"]
    missing = sorted(e.message for e in validator.iter_errors({"engine": {"model": "m"}}))
    assert missing == ["'hardware' is a required property", "'workers' is a required property"]
