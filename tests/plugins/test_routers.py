"""A role's routing section (``[engine.workers.<role>.routing]``): its payload form, a
router a plugin registers, and every wrong value refused where it is written."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from servesim.engines.base import option
from servesim.engines.routing import with_options
from servesim.errors import CompileError, PluginError, ReplayError
from servesim.payload import RoleArgs, RoutingArgs
from servesim.plugins import hookimpl
from servesim.testing import rendered, small_config


class Last:
    """Every request on the last worker."""

    def route(self, request: Any, workers: Sequence[Any]) -> int:
        return len(workers) - 1


@attrs.frozen
class PickOptions:
    worker: int = option(0, lo=-5, hi=5, help="the position to return")


@with_options(PickOptions)
def pick(role: RoleArgs, options: PickOptions) -> Any:
    class Pick:
        def route(self, request: Any, workers: Sequence[Any]) -> int:
            return options.worker

    return Pick()


def broken(role: RoleArgs) -> Any:
    class Broken:
        def route(self, request: Any, workers: Sequence[Any]) -> int:
            raise RuntimeError("no worker today")

    return Broken()


class _Routers:
    @hookimpl
    def servesim_register_routers(self) -> Mapping[str, Any]:
        return {"last": lambda role: Last(), "pick": pick, "broken": broken}


@pytest.fixture
def servesim_plugins() -> list[object]:
    return [_Routers()]


def _config(routing: str, replicas: int = 2) -> str:
    return small_config(replicas=replicas, requests=6, output_tokens=4,
                        extra=f"[engine.workers.aggregated.routing]\n{routing}\n")


def test_the_routing_table_reaches_the_payload_with_defaults(compile_toml: Any) -> None:
    role = compile_toml(_config('type = "kv_aware"\noverlap_weight = 2.0')).roles["aggregated"]
    assert role.routing == RoutingArgs(type="kv_aware", options={
        "overlap_weight": 2.0, "temperature": 0.0, "seed": 42})


def test_a_config_without_routing_keeps_none_in_the_payload(compile_toml: Any) -> None:
    assert compile_toml(small_config(replicas=2)).roles["aggregated"].routing is None


def test_inspect_marks_routing_keys_authored_or_defaulted(compile_toml: Any) -> None:
    resolved = compile_toml(_config('type = "least_loaded"'), stop_after="resolve")
    origins = {path: p.origin for path, p in resolved.provenance.items()
               if "routing" in path}
    assert origins == {"engine.workers.aggregated.routing.type": "authored",
                       "engine.workers.aggregated.routing.by": "defaulted"}


def test_a_plugin_router_places_the_requests(replay_toml: Any) -> None:
    run = replay_toml(_config('type = "last"'))
    assert {r["decode_worker_idx"] for r in run.requests} == {1}
    picked = replay_toml(_config('type = "pick"\nworker = 0'))
    assert {r["decode_worker_idx"] for r in picked.requests} == {0}


def test_the_default_routing_alternates(replay_toml: Any) -> None:
    run = replay_toml(small_config(replicas=2, requests=6, output_tokens=4))
    assert sorted(r["decode_worker_idx"] for r in run.requests) == [0, 0, 0, 1, 1, 1]


@pytest.mark.parametrize(("routing", "message"), [
    ('type = "pick"\nworker = 3', "router 'pick' route returned 3 for request 0; it returns a "
     "worker position, 0 to 1"),
    ('type = "broken"', "raised in router 'broken' route: RuntimeError: no worker today"),
])
def test_a_wrong_plugin_router_is_the_plugins_error(replay_toml: Any, routing: str,
                                                    message: str) -> None:
    with pytest.raises(PluginError) as info:
        replay_toml(_config(routing))
    (line,) = rendered(info.value)
    assert message in line and line.endswith("[plugin-error]")


@pytest.mark.parametrize(("routing", "expected"), [
    ('type = "kv_awre"',
     "engine.workers.aggregated.routing.type: unknown router 'kv_awre' (registered: broken, "
     "kv_aware, last, least_loaded, pick, round_robin, session_affinity) [unknown-router]"),
    ("type = 3",
     "engine.workers.aggregated.routing.type: expected a router name (a string), got int 3 "
     "[wrong-type]"),
    ('type = "kv_aware"\noverlap_weight = -1.0',
     "engine.workers.aggregated.routing.overlap_weight: must be in [0, 1000000], got -1 "
     "[out-of-range]"),
    ('type = "kv_aware"\ntemperature = nan',
     "engine.workers.aggregated.routing.temperature: expected a finite number, got nan "
     "[not-finite]"),
    ('type = "least_loaded"\nby = "bytes"',
     "engine.workers.aggregated.routing.by: expected one of \"requests\", \"tokens\", got "
     "string 'bytes' [bad-choice]"),
    ('type = "round_robin"\nweight = 1',
     "engine.workers.aggregated.routing.weight: unknown key 'weight' (router 'round_robin' "
     "has no options) [unknown-key]"),
])
def test_wrong_routing_is_refused_where_it_is_written(compile_toml: Any, routing: str,
                                                      expected: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config(routing))
    assert rendered(info.value) == [expected]


def test_an_unknown_option_names_the_allowed_ones(compile_toml: Any) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config('type = "kv_aware"\noverlap = 2.0'))
    (line,) = rendered(info.value)
    assert line.startswith("engine.workers.aggregated.routing.overlap: unknown key 'overlap'")
    assert "overlap_weight" in line and line.endswith("[unknown-key]")


def test_an_unknown_router_suggests_the_closest(compile_toml: Any) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config('type = "kv_awre"'))
    assert info.value.diagnostics[0].hint == "did you mean 'kv_aware'?"


def test_a_payload_with_wrong_routing_is_refused_at_replay(compile_toml: Any,
                                                           replay_toml: Any) -> None:
    payload = compile_toml(_config('type = "kv_aware"'))
    role = payload.roles["aggregated"]
    for routing, expected in [
        (RoutingArgs(type="kv_aware", options={"temperature": -0.5}),
         "engine.workers.aggregated.routing.temperature: must be in [0, 1000000], got -0.5 "
         "[out-of-range]"),
        (RoutingArgs(type="sticky"),
         "engine.workers.aggregated.routing.type: unknown router 'sticky' (registered: "
         "broken, kv_aware, last, least_loaded, pick, round_robin, session_affinity) "
         "[unknown-router]"),
    ]:
        bad = attrs.evolve(payload, roles={"aggregated": attrs.evolve(role, routing=routing)})
        with pytest.raises(ReplayError) as info:
            replay_toml(bad)
        assert rendered(info.value) == [expected]


def test_disaggregated_roles_take_a_router_each(compile_toml: Any) -> None:
    text = small_config().replace("[engine]\n", '[engine]\nmode = "disaggregated"\n')
    text = text.replace("engine.workers.aggregated", "engine.workers.prefill")
    decode = text[text.index("[engine.workers.prefill"):text.index("[traffic")].replace(
        "engine.workers.prefill", "engine.workers.decode")
    text = text.replace("[traffic.source]", decode + "[traffic.source]", 1)
    text += ('[engine.workers.prefill.routing]\ntype = "least_loaded"\n'
             '[engine.workers.decode.routing]\ntype = "kv_aware"\n')
    roles = compile_toml(text).roles
    assert (roles["prefill"].routing.type, roles["decode"].routing.type) == (
        "least_loaded", "kv_aware")
