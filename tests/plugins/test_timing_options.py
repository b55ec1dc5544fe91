"""A timing provider's own options: ``[engine.workers.<role>.timing.options]``, structured
by its ``Options`` class at compile time and again when a payload is replayed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from servesim.engines.base import option
from servesim.errors import CompileError, ReplayError
from servesim.payload import RoleArgs
from servesim.plugins import hookimpl
from servesim.testing import rendered, small_config
from servesim.timing import FixedTimer, StepTimer, with_options


@attrs.frozen
class StepOptions:
    prefill_ms: float = option(10.0, lo=0.0, hi=1000.0, help="every prefill pass")
    decode_ms: float = option(2.0, lo=0.0, hi=1000.0, help="every decode pass")


@with_options(StepOptions)
def step_timer(role: RoleArgs, options: StepOptions) -> StepTimer:
    return FixedTimer(prefill_ms=options.prefill_ms, decode_ms=options.decode_ms)


def plain_timer(role: RoleArgs) -> StepTimer:
    return FixedTimer(prefill_ms=10.0, decode_ms=2.0)


class _Providers:
    @hookimpl
    def servesim_register_timing_providers(self) -> Mapping[str, Any]:
        return {"step": step_timer, "plain": plain_timer}


@pytest.fixture
def servesim_plugins() -> list[object]:
    return [_Providers()]


def _config(timing: str, options: str = "") -> str:
    extra = f"[engine.workers.aggregated.timing.options]\n{options}\n" if options else ""
    return small_config(timing=timing, requests=8, output_tokens=4, extra=extra)


def test_options_reach_the_payload_with_defaults_and_the_provider(compile_toml: Any,
                                                                  replay_toml: Any) -> None:
    payload = compile_toml(_config("step", "decode_ms = 5.0"))
    assert payload.roles["aggregated"].timing.options == {"prefill_ms": 10.0, "decode_ms": 5.0}
    slow = replay_toml(_config("step", "decode_ms = 5.0")).requests
    fast = replay_toml(_config("step")).requests
    assert max(r["terminal_time_ms"] for r in slow) > max(r["terminal_time_ms"] for r in fast)


def test_a_provider_without_options_keeps_none_in_the_payload(compile_toml: Any) -> None:
    assert compile_toml(_config("plain")).roles["aggregated"].timing.options is None


@pytest.mark.parametrize(("timing", "options", "expected"), [
    ("step", "decode_ms = -1.0",
     "engine.workers.aggregated.timing.options.decode_ms: must be in [0, 1000], got -1 "
     "[out-of-range]"),
    ("step", 'decode_ms = "fast"',
     "engine.workers.aggregated.timing.options.decode_ms: expected a number, got string "
     "'fast' [wrong-type]"),
    ("plain", "decode_ms = 5.0",
     "engine.workers.aggregated.timing.options.decode_ms: unknown key 'decode_ms' (timing "
     "type 'plain' has no options) [unknown-key]"),
    ("polynomial", "x = 1",
     "engine.workers.aggregated.timing.options.x: unknown key 'x' (timing type 'polynomial' "
     "has no options) [unknown-key]"),
])
def test_wrong_options_are_refused_where_they_are_written(compile_toml: Any, timing: str,
                                                          options: str, expected: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config(timing, options))
    assert rendered(info.value) == [expected]


def test_an_unknown_option_names_the_allowed_ones(compile_toml: Any) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config("step", "decode = 1.0"))
    (line,) = rendered(info.value)
    assert line.startswith("engine.workers.aggregated.timing.options.decode: unknown key "
                           "'decode'")
    assert "decode_ms" in line and line.endswith("[unknown-key]")


def test_a_payload_with_wrong_options_is_refused_at_replay(compile_toml: Any,
                                                           replay_toml: Any) -> None:
    payload = compile_toml(_config("step"))
    role = payload.roles["aggregated"]
    bad = attrs.evolve(payload, roles={"aggregated": attrs.evolve(
        role, timing=attrs.evolve(role.timing, options={"decode_ms": 1e9}))})
    with pytest.raises(ReplayError) as info:
        replay_toml(bad)
    assert rendered(info.value) == [
        "engine.workers.aggregated.timing.options.decode_ms: must be in [0, 1000], got "
        "1000000000 [out-of-range]"]
