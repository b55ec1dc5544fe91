"""Hostile payloads: the loader and the engine handoff answer with diagnostics, never crash."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.compiler import compile_file
from servesim.errors import ServesimError
from servesim.payload import load_payload, payload_to_dict
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
BASE = payload_to_dict(compile_file(ROOT / "examples" / "configs" / "qwen3_32b_h200.toml",
                                    registry=REGISTRY))
# keep fuzzed replays tiny
BASE["workload"]["stop"]["requests"] = 3
BASE["workload"]["source"]["input_tokens"] = 40
BASE["workload"]["source"]["output_tokens"] = 3

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from([0, 1, 2, -1, 2**53, 2**64, math.nan, "auto", "vllm", "fixed", [], {}]),
    st.lists(st.integers(-2, 2), max_size=3),
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(_paths(v, (*prefix, k)))
    return out


PATHS = _paths(BASE)


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    if value is _DELETE:
        data.pop(path[-1], None)
    else:  # a copy: the strategies share their [] and {} between examples
        data[path[-1]] = copy.deepcopy(value)


_DELETE = object()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(VALUES, st.just(_DELETE))),
                min_size=1, max_size=3))
def test_mutated_payloads_load_validate_and_replay_or_fail_with_diagnostics(
        edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    data = copy.deepcopy(BASE)
    for path, value in edits:
        try:
            _set(data, path, value)
        except (KeyError, TypeError, AttributeError):
            continue  # an earlier edit replaced the parent: nothing to set
    text = json.dumps(data)  # what a hand-edited file would hold (NaN included)
    try:
        payload = load_payload(json.loads(text))
        replay_payload(payload, registry=REGISTRY)
    except ServesimError as exc:
        assert exc.diagnostics, "an error must carry at least one diagnostic"
