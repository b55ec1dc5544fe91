"""docs/plugins.md documents every hook with its exact signature, and every fixture."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from servesim.plugins import hookspecs

DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
HOOKS = sorted(name for name in vars(hookspecs) if name.startswith("servesim_"))


def _signature(name: str) -> str:
    fn = getattr(hookspecs, name)
    params = ", ".join(str(p) for p in inspect.signature(fn).parameters.values())
    return f"def {name}({params}) -> {fn.__annotations__['return']}"


def test_there_are_hooks() -> None:
    assert HOOKS == ["servesim_register_backends", "servesim_register_engines",
                     "servesim_register_routers", "servesim_register_timing_providers",
                     "servesim_register_trace_formats"]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hookspec_is_documented_with_its_signature(hook: str) -> None:
    text = DOC.read_text(encoding="utf-8")
    assert f"### {hook}\n" in text, f"docs/plugins.md lacks a '### {hook}' section"
    section = text.split(f"### {hook}\n", 1)[1].split("\n### ", 1)[0]
    assert _signature(hook) in section, (
        f"docs/plugins.md: the {hook} section must show `{_signature(hook)}`")


def test_every_testing_fixture_is_documented() -> None:
    import servesim.testing as testing

    text = DOC.read_text(encoding="utf-8")
    fixtures = sorted(name for name, obj in vars(testing).items()
                      if hasattr(obj, "_fixture_function_marker")
                      or type(obj).__name__ == "FixtureFunctionDefinition")
    assert fixtures, "no fixtures found in servesim.testing"
    missing = [f for f in fixtures if not re.search(rf"\| `{f}` \|", text)]
    assert not missing, f"docs/plugins.md lacks a fixture table row for {missing}"


def _documented_fields(heading: str) -> set[str]:
    """The field names in the first column of the table under ``### `heading` ...``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"### `{heading}`", 1)[1].split("\n#", 1)[0]
    cells = re.findall(r"^\| ([^|]+) \|", section, re.M)
    return {name for cell in cells for name in re.findall(r"`(\w+)`", cell)}


@pytest.mark.parametrize("heading", ["RequestSpec", "RequestRecord", "ReplayResult",
                                     "RoleArgs"])
def test_every_field_of_a_type_a_plugin_sees_is_documented(heading: str) -> None:
    import attrs

    from servesim.engines.base import ReplayResult
    from servesim.engines.kernel import requests
    from servesim.payload import RoleArgs

    cls = {"RequestSpec": requests.RequestSpec, "RequestRecord": requests.RequestRecord,
           "ReplayResult": ReplayResult, "RoleArgs": RoleArgs}[heading]
    fields = ({f.name for f in attrs.fields(cls)} if attrs.has(cls)
              else set(inspect.signature(cls).parameters))
    assert len(fields) >= 4
    assert fields - _documented_fields(heading) == set()


@pytest.mark.parametrize("module", ["placement", "prompt_cache", "static_batch"])
def test_every_kernel_helper_has_a_line_in_the_guide(module: str) -> None:
    import importlib

    mod = importlib.import_module(f"servesim.engines.kernel.{module}")
    helpers = [name for name, obj in vars(mod).items() if not name.startswith("_")
               and (inspect.isclass(obj) or inspect.isfunction(obj))
               and obj.__module__ == mod.__name__]
    section = DOC.read_text(encoding="utf-8").split("## Kernel helpers\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    assert helpers
    assert [h for h in helpers if f"| `{mod.__name__}.{h}" not in section] == []


def test_the_worked_example_gpu_of_the_docs_loads() -> None:
    import json

    from servesim.catalog import GpuSpec

    text = (DOC.parent / "adding-a-gpu.md").read_text(encoding="utf-8")
    gpu = GpuSpec.from_dict("h20", json.loads(text.split("```json\n")[1].split("```")[0]))
    assert gpu.bf16_flops == 148e12 and gpu.num_gpus_per_node == 8
