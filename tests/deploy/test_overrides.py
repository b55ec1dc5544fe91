"""``--set KEY=VALUE`` on every command that takes a config: TOML-typed values, dotted keys,
validated like the file, errors naming the key."""

from __future__ import annotations

import json

import pytest

from servesim.compiler.overrides import (
    apply_overrides,
    parse_override,
    parse_value,
    split_values,
)
from servesim.errors import CompileError

from .conftest import run


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("0.5", 0.5), ("true", True), ('"8"', "8"), ("h100_sxm", "h100_sxm"),
    ("[1, 2]", [1, 2]), ('{ type = "fixed", blocks = 10 }', {"type": "fixed", "blocks": 10}),
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
])
def test_values_are_toml_typed_and_bare_words_are_strings(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_a_dotted_key_may_quote_a_part_and_creates_missing_tables() -> None:
    key, value = parse_override('a."b.c".d=3')
    assert key == ("a", "b.c", "d")
    doc = {"a": {"x": 1}}
    assert apply_overrides(doc, [(key, value)]) == {"a": {"x": 1, "b.c": {"d": 3}}}
    assert doc == {"a": {"x": 1}}  # the parsed document is not changed in place


def test_commas_split_values_outside_brackets_and_quotes() -> None:
    assert split_values('1,2,[3,4],"a,b"') == ["1", "2", "[3,4]", '"a,b"']


def test_set_changes_what_inspect_and_compile_see(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", "tiny.toml", "--format", "json",
                         "--set", "engine.workers.aggregated.parallelism.tensor=2",
                         "--set", "engine.hardware=h100_sxm")
    assert (code, err) == (0, "")
    role = json.loads(out)["roles"]["aggregated"]
    assert (role["tensor"], role["hardware"]) == (2, "h100_sxm")
    code, out, _ = run(capsys, "compile", "tiny.toml", "--set",
                       "engine.workers.aggregated.parallelism.tensor=4")
    assert code == 0 and json.loads(out)["roles"]["aggregated"]["tensor"] == 4


def test_a_later_set_wins_and_replay_and_validate_take_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "replay", "tiny.toml", "--format", "json",
                       "--set", "traffic.stop.requests=2", "--set", "traffic.stop.requests=3")
    assert code == 0 and json.loads(out)["num_requests"] == 3
    assert run(capsys, "validate", "tiny.toml", "--set", "engine.backend=sglang")[0] == 0


@pytest.mark.parametrize(("setting", "where", "code"), [
    ("engine.workers.aggregated.parallelism.tensr=2",
     "engine.workers.aggregated.parallelism.tensr", "unknown-key"),
    ("engine.workers.aggregated.parallelism.tensor=two",
     "engine.workers.aggregated.parallelism.tensor", "wrong-type"),
    ("engine.workers.aggregated.parallelism.tensor=-1",
     "engine.workers.aggregated.parallelism.tensor", ""),
    ("engine.workers.aggregated.parallelism.tensor=nan",
     "engine.workers.aggregated.parallelism.tensor", "wrong-type"),
    ("engine.workers.aggregated.parallelism.tensor=3",
     "engine.workers.aggregated.parallelism.tensor", "indivisible-heads"),
    ("engine.hardware=h1000", "engine.hardware", "unknown-hardware"),
    ("engine.model.size=2", "engine.model.size", "bad-override"),
    ("engine.=2", "--set engine.=2", "bad-override"),
    ("engine.backend", "--set engine.backend", "bad-override"),
    ("engine.backend=", "--set engine.backend=", "bad-override"),
    ("=3", "--set =3", "bad-override"),
])
def test_a_bad_setting_is_an_input_error_naming_the_key(
        capsys: pytest.CaptureFixture[str], setting: str, where: str, code: str) -> None:
    for command in ("validate", "inspect", "compile", "replay"):
        exit_code, _, err = run(capsys, command, "tiny.toml", "--set", setting)
        assert exit_code == 1, command
        assert err.startswith(f"error: {where}: ") and f"[{code}" in err
        assert "Traceback" not in err


def test_set_on_a_payload_file_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "compile", "tiny.toml", "-o", "p.json")[0] == 0
    code, _, err = run(capsys, "replay", "p.json", "--set", "traffic.stop.requests=2")
    assert code == 1 and "--set changes a TOML config" in err


def test_a_table_in_the_way_is_reported_by_path() -> None:
    with pytest.raises(CompileError) as info:
        apply_overrides({"a": [1]}, [(("a", "b"), 1)])
    assert info.value.diagnostics[0].where == "a.b"
