"""Golden files at two levels.

* End to end: every ``examples/configs/<name>.toml`` compiles to
  ``tests/golden/<name>.payload.json``, and every golden validates against the committed
  payload JSON Schema.
* Per pass: ``tests/passes/<stage>/<case>.toml`` (a comment header says what it shows)
  compiled with ``stop_after=<stage>`` gives ``<case>.json`` (the stage's artifact) or,
  when the stage rejects it, ``<case>.txt`` (the rendered diagnostics, all from that stage).

Regenerate after an intended change with ``python -m pytest tests/test_goldens.py
--update-goldens`` and review the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from servesim.compiler import compile_file, compile_source
from servesim.compiler.source import SourceText
from servesim.errors import CompileError
from servesim.payload import dump_payload, load_payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.schemas import load_schema

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
GOLDEN = TESTS / "golden"
PASSES = TESTS / "passes"
EXAMPLES = sorted((REPO / "examples" / "configs").glob("*.toml"))
CASES = sorted(PASSES.glob("*/*.toml"))
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))


def _no_machine_paths(text: str) -> None:
    assert str(REPO) not in text, "goldens must not contain absolute paths of this machine"


# --- end to end -------------------------------------------------------------------------

@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_payload_golden(example: Path, golden: Any) -> None:
    payload = compile_file(example, registry=REGISTRY)
    text = dump_payload(payload, relative_to=str(GOLDEN))
    _no_machine_paths(text)
    golden.check(GOLDEN / f"{example.stem}.payload.json", text)


def test_every_golden_has_an_example() -> None:
    stale = {p.name for p in GOLDEN.glob("*.payload.json")} - {
        f"{p.stem}.payload.json" for p in EXAMPLES}
    assert not stale, f"goldens without an example config (delete them): {sorted(stale)}"


def test_every_example_has_a_golden() -> None:
    missing = [p.stem for p in EXAMPLES if not (GOLDEN / f"{p.stem}.payload.json").exists()]
    assert not missing, ("examples without a payload golden; create them with: "
                         "python -m pytest tests/test_goldens.py --update-goldens")


PAYLOAD_SCHEMA = load_schema("payload")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_payload_golden_validates_against_the_schema(example: Path) -> None:
    path = GOLDEN / f"{example.stem}.payload.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(PAYLOAD_SCHEMA)
    errors = sorted(jsonschema.Draft202012Validator(PAYLOAD_SCHEMA).iter_errors(data),
                    key=lambda e: list(e.absolute_path))
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors]
    # and the engine-side loader reads it back
    assert load_payload(data, name=path.name).engine == data["engine"]


def test_schema_catches_a_broken_payload() -> None:
    data = json.loads((GOLDEN / "qwen3_32b_h200.payload.json").read_text(encoding="utf-8"))
    data["roles"]["aggregated"]["block_size"] = "64"
    data["roles"]["aggregated"]["blocks"] = 1
    messages = sorted(e.message for e in jsonschema.Draft202012Validator(
        PAYLOAD_SCHEMA).iter_errors(data))
    assert messages == ["'64' is not of type 'integer'",
                        "Additional properties are not allowed ('blocks' was unexpected)"]


# --- per pass -----------------------------------------------------------------------------

def _relative_trace(data: Any, folder: Path) -> Any:
    source = data.get("workload", {}).get("source", {}) if isinstance(data, dict) else {}
    if isinstance(source.get("path"), str) and os.path.isabs(source["path"]):
        source["path"] = os.path.relpath(source["path"], folder).replace(os.sep, "/")
    return data


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_pass_golden(case: Path, golden: Any) -> None:
    stage = case.parent.name
    header = case.read_text(encoding="utf-8").splitlines()[0]
    assert header.startswith(f"# {stage}: "), "each case opens with '# <stage>: <what it shows>'"
    source = SourceText(text=case.read_text(encoding="utf-8"), name=case.name,
                        base_dir=case.parent)
    try:
        artifact = compile_source(source, registry=REGISTRY, stop_after=stage)  # type: ignore[arg-type]
    except CompileError as exc:
        assert {d.stage for d in exc.diagnostics} == {stage}, \
            "an error case must be rejected by the stage it is filed under"
        text = "\n".join(d.render() for d in exc.diagnostics) + "\n"
        other = case.with_suffix(".json")
        assert not other.exists(), f"{other.name} is stale: the case now fails"
        _no_machine_paths(text)
        golden.check(case.with_suffix(".txt"), text)
        return
    data = _relative_trace(artifact.to_data(), case.parent)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    other = case.with_suffix(".txt")
    assert not other.exists(), f"{other.name} is stale: the case now passes"
    _no_machine_paths(text)
    golden.check(case.with_suffix(".json"), text)


def test_every_pass_golden_has_a_case() -> None:
    orphans = [p.relative_to(PASSES).as_posix() for p in PASSES.glob("*/*")
               if p.suffix in (".json", ".txt") and not p.with_suffix(".toml").exists()]
    assert not orphans, f"expected files without a case (delete them): {orphans}"
