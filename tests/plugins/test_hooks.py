"""Every hook end to end: engines with options, timing providers, trace formats, discovery
through entry points, and broken plugins reported by name (never as a servesim crash)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from servesim.engines.base import Engine, ReplayResult, option
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import Segment, make_prompt
from servesim.errors import CompileError, ServesimError
from servesim.payload import RoleArgs, dump_payload, load_payload
from servesim.plugins import hookimpl
from servesim.plugins.manager import EngineRegistry, PluginError, get_plugin_manager
from servesim.testing import ReplayRun, rendered, small_config
from servesim.timing import FixedTimer, StepTimer
from servesim.workloads.formats import TraceFile, TraceLoader, request_format

# --- plugins under test --------------------------------------------------------------------


@attrs.frozen
class EchoOptions:
    """Options of the echo engine."""

    delay_ms: float = option(1.0, lo=0.0, hi=1e6, help="time from arrival to completion")
    tokens: int = option(1, lo=0, hi=100)


class EchoEngine(Engine):
    """Completes every request ``delay_ms`` after it arrives, with ``tokens`` tokens."""

    NAME = "echo"
    DESCRIPTION = "echo"
    Options = EchoOptions

    def check_options(self, options: Any) -> list[Any]:
        from servesim.errors import Diagnostic

        if options.tokens == 0 and options.delay_ms > 0:
            return [Diagnostic(code="echo-options", path=("engine", "options", "tokens"),
                               message="tokens = 0 needs delay_ms = 0")]
        return []

    def replay(self, payload: Any, workload: Any, sink: Any, *,
               progress: Any = None) -> ReplayResult:
        from servesim.engines.kernel.requests import RequestRecord

        opts = self.options(payload)
        end = 0.0
        pending = list(workload.start())
        while pending:
            spec = pending.pop(0)
            done = spec.arrival_ms + opts.delay_ms
            record = RequestRecord(spec.request_id, spec.arrival_ms, spec.input_length,
                                   spec.output_length, "completed", terminal_ms=done)
            for _ in range(opts.tokens):
                record.token_times.append(done)
            sink(record)
            end = max(end, done)
            pending += workload.on_terminal(spec, done)
        return ReplayResult(end_ms=end, gpu_seconds={"aggregated": 0.0})


class EchoPlugin:
    @hookimpl
    def servesim_register_engines(self) -> list[type[Engine]]:
        return [EchoEngine]


class Broken(EchoEngine):
    NAME = "broken"

    def replay(self, payload: Any, workload: Any, sink: Any, *,
               progress: Any = None) -> ReplayResult:
        raise RuntimeError("kaput")


def _flat(role: RoleArgs) -> StepTimer:
    """Flat 7 ms prefill and 3 ms decode."""
    return FixedTimer(prefill_ms=7.0, decode_ms=3.0)


class _Exploding:
    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return 1.0

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        raise ZeroDivisionError("no decode for you")


def _lines(trace: TraceFile) -> Iterator[RequestSpec]:
    """One request per line: ``arrival input output``."""
    for i, line in enumerate(trace.path.read_text().split("\n")):
        if line.strip():
            arrival, isl, osl = line.split()
            if arrival == "boom":
                raise ValueError(f"line {i + 1} explodes")
            yield RequestSpec(request_id=i, arrival_ms=float(arrival),
                              prompt=make_prompt([Segment(i, int(isl), repeat=False)]),
                              input_length=int(isl), output_length=int(osl))


class _Fronted:
    """Flat pass prices and a front end of 5 ms + 0.01 ms per prompt token."""

    def __init__(self, role: RoleArgs) -> None:
        self.passes = _flat(role)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return self.passes.prefill_ms(batch, mean_isl, mean_prefix)

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        return self.passes.decode_ms(batch, active, mean_context, total)

    def request_ms(self, input_tokens: int) -> float:
        if input_tokens > 10_000:
            raise OverflowError("prompt too long for this front end")
        return 5.0 + 0.01 * input_tokens


class _Grouped:
    """Flat pass prices, but a prefill half shared with other attention-DP ranks costs
    7 ms plus 0.01 ms per prompt token of the group."""

    def __init__(self, role: RoleArgs) -> None:
        self.passes = _flat(role)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return self.passes.prefill_ms(batch, mean_isl, mean_prefix)

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        if group_tokens > 10_000:
            raise OverflowError("too many prompt tokens at once")
        return 7.0 + 0.01 * group_tokens

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        return self.passes.decode_ms(batch, active, mean_context, total)


class _Exiting(_Exploding):
    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        sys.exit(3)


class _Unclosable:
    """A trace reader whose file went away: reading fails, and so does closing."""

    def sessions(self) -> Iterator[Any]:
        raise OSError("disk gone")

    def close(self) -> None:
        raise RuntimeError("cannot close either")


class _Invalid:
    """Prices a prefill at ``value`` (set per test) and a decode step at 1 ms."""

    value: Any = float("nan")

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return _Invalid.value if batch else 0.0

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        return 1.0 if batch else 0.0


class ExtrasPlugin:
    @hookimpl
    def servesim_register_timing_providers(self) -> Mapping[str, Callable[..., StepTimer]]:
        return {"flat": _flat, "exploding": lambda role: _Exploding(),
                "exiting": lambda role: _Exiting(), "fronted": _Fronted,
                "grouped": _Grouped, "invalid": lambda role: _Invalid(),
                "not-a-timer": lambda role: None}

    @hookimpl
    def servesim_register_trace_formats(self) -> Mapping[str, TraceLoader]:
        return {"lines": request_format(_lines), "unclosable": lambda trace: _Unclosable()}


@pytest.fixture
def servesim_plugins() -> list[object]:
    return [EchoPlugin(), ExtrasPlugin()]


def _name(pm: Any, kind: type) -> str:
    return str(pm.get_name(next(p for p in pm.get_plugins() if isinstance(p, kind))))


# --- engines and their options ---------------------------------------------------------------

def test_engine_options_are_structured_checked_and_lowered(
        compile_toml: Callable[..., Any], replay_toml: Callable[..., ReplayRun]) -> None:
    payload = compile_toml(small_config(engine="echo", options={"delay_ms": 4}))
    assert (payload.engine, payload.engine_options) == ("echo", {"delay_ms": 4.0, "tokens": 1})
    run = replay_toml(small_config(engine="echo", options={"delay_ms": 4}, requests=5))
    assert run.report["completed_requests"] == 5
    assert run.report["mean_e2e_latency_ms"] == 4.0


def test_engine_option_errors_read_like_every_other_config_error(
        compile_toml: Callable[..., Any]) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(engine="echo", options={"delay": 1, "tokens": 1.5}))
    assert rendered(info.value) == [
        "engine.options.tokens: expected an integer, got float 1.5 [wrong-type]",
        "engine.options.delay: unknown key 'delay' (allowed here: delay_ms, tokens) "
        "[unknown-key]"]
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(engine="echo", options={"tokens": 101}))
    assert rendered(info.value) == [
        "engine.options.tokens: must be in [0, 100], got 101 [out-of-range]"]
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(engine="echo", options={"tokens": 0}), stop_after="parse")
    assert rendered(info.value) == [
        "engine.options.tokens: tokens = 0 needs delay_ms = 0 [echo-options]"]


def test_an_engine_without_options_takes_none(compile_toml: Callable[..., Any]) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(options={"x": 1}))
    assert rendered(info.value) == [
        "engine.options.x: unknown key 'x' (engine 'vllm' has no options) [unknown-key]"]


def test_unknown_engine_and_wrong_mode(compile_toml: Callable[..., Any]) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(engine="ecko"))
    assert [str(d) for d in info.value.diagnostics] == [
        "engine.engine: unknown engine 'ecko' (registered: disagg, echo, vllm) "
        "[unknown-engine]\n  hint: did you mean 'echo'?"]
    text = small_config(engine="disagg")
    with pytest.raises(CompileError) as info:
        compile_toml(text)
    assert rendered(info.value) == [
        "engine.engine: engine 'disagg' does not run aggregated deployments (it runs: "
        "disaggregated) [engine-mode]"]


def test_the_payload_keeps_the_options_and_is_checked_again(
        compile_toml: Callable[..., Any], replay_toml: Callable[..., ReplayRun]) -> None:
    payload = compile_toml(small_config(engine="echo", options={"tokens": 3}))
    data = json.loads(dump_payload(payload))
    assert data["engine_options"] == {"delay_ms": 1.0, "tokens": 3}
    assert replay_toml(load_payload(data)).report["total_output_tokens"] == 3 * 20
    data["engine_options"]["tokens"] = "3"
    with pytest.raises(ServesimError) as info:
        replay_toml(load_payload(data))
    assert rendered(info.value) == [
        "engine.options.tokens: expected an integer, got string '3' [wrong-type]"]


def test_inspect_marks_options_authored_or_defaulted(compile_toml: Callable[..., Any]) -> None:
    resolved = compile_toml(small_config(engine="echo", options={"tokens": 2}),
                            stop_after="resolve")
    assert resolved.payload.engine_options == {"delay_ms": 1.0, "tokens": 2}
    assert resolved.provenance["engine.options.tokens"].origin == "authored"
    assert resolved.provenance["engine.options.delay_ms"].origin == "defaulted"
    assert resolved.provenance["engine.engine"].origin == "authored"


# --- timing providers and trace formats -----------------------------------------------------

def test_a_plugin_timing_provider_prices_the_passes(
        replay_toml: Callable[..., ReplayRun]) -> None:
    run = replay_toml(small_config(timing="flat", requests=1, concurrency=1, output_tokens=3))
    # vLLM: one pass computes the prompt and emits token 1, two decode passes follow
    assert run.report["mean_ttft_ms"] == 7.0 + 3.0
    assert run.report["mean_e2e_latency_ms"] == 7.0 + 3.0 * 3


def test_a_plugin_timer_s_front_end_latency_delays_admission(
        replay_toml: Callable[..., ReplayRun], plugin_manager: Any) -> None:
    text = small_config(timing="fronted", requests=1, concurrency=1, output_tokens=3)
    run = replay_toml(text)
    (request,) = run.requests
    front = 5.0 + 0.01 * request["input_length"]
    assert request["first_admit_ms"] == request["arrival_time_ms"] + front
    assert run.report["mean_ttft_ms"] == front + 7.0 + 3.0  # as flat, plus the front end
    assert run.report["mean_e2e_latency_ms"] == front + 7.0 + 3.0 * 3
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="fronted", requests=1, input_tokens=20_000))
    assert rendered(info.value) == [
        f"plugin {_name(plugin_manager, ExtrasPlugin)!r}: raised in timing provider 'fronted' "
        "request_ms: OverflowError: prompt too long for this front end [plugin-error]"]


def test_a_plugin_timer_prices_ranks_prefilling_together(
        replay_toml: Callable[..., ReplayRun], plugin_manager: Any) -> None:
    # Two clients start together on the two ranks of one worker: both 256-token prompts
    # are computed in the first pass, priced together (7 + 0.01 x 512 ms).
    text = small_config(timing="grouped", requests=2, concurrency=2, output_tokens=1,
                        attention_data=2)
    run = replay_toml(text)
    assert run.report["mean_ttft_ms"] == 7.0 + 0.01 * 512 + 3.0
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="grouped", requests=2, concurrency=2,
                                 attention_data=2, input_tokens=8_000))
    assert rendered(info.value) == [
        f"plugin {_name(plugin_manager, ExtrasPlugin)!r}: raised in timing provider 'grouped' "
        "prefill_group_ms: OverflowError: too many prompt tokens at once [plugin-error]"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 1e300, "10", None, True])
def test_a_plugin_timer_s_invalid_price_names_the_plugin(
        replay_toml: Callable[..., ReplayRun], plugin_manager: Any,
        monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    monkeypatch.setattr(_Invalid, "value", value)
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="invalid", requests=1, concurrency=1,
                                 input_tokens=32))
    assert rendered(info.value) == [
        f"plugin {_name(plugin_manager, ExtrasPlugin)!r}: timing provider 'invalid' "
        f"prefill_ms(1, 32, 0) returned {value!r}; a price must be a number of ms from 0 "
        "to 1e+09 [plugin-error]"]


def test_a_plugin_timing_provider_that_returns_no_timer_names_the_plugin(
        replay_toml: Callable[..., ReplayRun], plugin_manager: Any) -> None:
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="not-a-timer", requests=1, concurrency=1))
    assert rendered(info.value) == [
        f"plugin {_name(plugin_manager, ExtrasPlugin)!r}: timing provider 'not-a-timer' "
        "returned None, which has no prefill_ms or decode_ms method; a provider returns a "
        "step timer [plugin-error]"]


def test_unknown_timing_type(compile_toml: Callable[..., Any]) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(timing="flta"), stop_after="parse")
    assert rendered(info.value) == [
        "engine.workers.aggregated.timing.type: unknown timing type 'flta' (registered: "
        "default, exiting, exploding, fixed, flat, fronted, grouped, invalid, measured, "
        "not-a-timer, polynomial, table) [unknown-timing]"]


def test_a_plugin_trace_format_feeds_the_replay(
        tmp_path: Path, replay_toml: Callable[..., ReplayRun]) -> None:
    (tmp_path / "t.txt").write_text("0 64 2\n100 64 2\n")
    text = small_config(timing="flat").split("[traffic.source]")[0] + (
        '[traffic.source]\ntype = "trace"\nformat = "lines"\npaths = ["t.txt"]\n'
        '[traffic.load]\ntype = "trace_timestamps"\n')
    run = replay_toml(text)
    assert [r["arrival_time_ms"] for r in run.requests] == [0.0, 100.0]
    assert run.report["completed_requests"] == 2
    with pytest.raises(CompileError) as info:
        replay_toml(text.replace('"lines"', '"line"'))
    assert rendered(info.value) == [
        "traffic.source.format: unknown trace format 'line' (registered: lines, mooncake, "
        "mooncake-delta, unclosable) [unknown-trace-format]"]


def test_exceptions_in_timing_and_trace_plugins_name_the_plugin_and_hook(
        tmp_path: Path, replay_toml: Callable[..., ReplayRun], plugin_manager: Any) -> None:
    plugin = _name(plugin_manager, ExtrasPlugin)
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="exploding", requests=1))
    assert rendered(info.value) == [
        f"plugin {plugin!r}: raised in timing provider 'exploding' decode_ms: "
        "ZeroDivisionError: no decode for you [plugin-error]"]
    assert "test_hooks.py" in (info.value.diagnostics[0].hint or "")
    (tmp_path / "t.txt").write_text("0 64 2\nboom 1 1\n")
    text = small_config(timing="flat").split("[traffic.source]")[0] + (
        '[traffic.source]\ntype = "trace"\nformat = "lines"\npaths = ["t.txt"]\n')
    with pytest.raises(PluginError) as info:
        replay_toml(text)
    assert rendered(info.value) == [
        f"plugin {plugin!r}: raised in trace format 'lines' sessions(): ValueError: line 2 "
        "explodes [plugin-error]"]
    with pytest.raises(PluginError) as info:  # the first error, not close()'s after it
        replay_toml(text.replace('"lines"', '"unclosable"'))
    assert rendered(info.value) == [
        f"plugin {plugin!r}: raised in trace format 'unclosable' sessions(): OSError: disk "
        "gone [plugin-error]"]


def test_a_plugin_calling_sys_exit_is_reported_not_obeyed(
        replay_toml: Callable[..., ReplayRun], plugin_manager: Any) -> None:
    with pytest.raises(PluginError) as info:
        replay_toml(small_config(timing="exiting", requests=1))
    assert rendered(info.value) == [
        f"plugin {_name(plugin_manager, ExtrasPlugin)!r}: raised in timing provider 'exiting' "
        "decode_ms: SystemExit: 3 [plugin-error]"]


# --- registration errors ---------------------------------------------------------------------

class _ClashingTiming:
    @hookimpl
    def servesim_register_timing_providers(self) -> Mapping[str, Any]:
        return {"fixed": _flat}


class _Garbage:
    @hookimpl
    def servesim_register_engines(self) -> list[Any]:
        return ["not an engine"]


def test_a_duplicate_timing_provider_names_both_plugins() -> None:
    pm = get_plugin_manager(load_entrypoints=False, plugins=[_ClashingTiming()])
    with pytest.raises(PluginError) as info:
        EngineRegistry.collect(pm)
    assert rendered(info.value) == [
        f"plugin {_name(pm, _ClashingTiming)!r}: timing provider name 'fixed' is registered "
        f"by both 'servesim.builtin' and {_name(pm, _ClashingTiming)!r} "
        "[duplicate-timing-provider]"]


def test_a_hook_returning_garbage_is_reported() -> None:
    pm = get_plugin_manager(load_entrypoints=False, plugins=[_Garbage()])
    with pytest.raises(PluginError) as info:
        EngineRegistry.collect(pm)
    assert info.value.diagnostics[0].code == "plugin-bad-registration"
    assert "returned 'not an engine', not an Engine subclass" in str(info.value)


# --- entry points (fake installed distributions) ---------------------------------------------

@attrs.frozen
class _EntryPoint:
    name: str
    value: str
    group: str
    target: Any

    def load(self) -> Any:
        if isinstance(self.target, BaseException):
            raise self.target
        return self.target


class _Dist:
    def __init__(self, name: str, version: str, eps: list[_EntryPoint]) -> None:
        self.metadata = {"name": name, "Name": name}
        self.version = version
        self.entry_points = eps


def _module(name: str, *engines: type[Engine]) -> ModuleType:
    module = ModuleType(name)

    @hookimpl
    def servesim_register_engines() -> list[type[Engine]]:
        return list(engines)

    module.servesim_register_engines = servesim_register_engines  # type: ignore[attr-defined]
    return module


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Pretend packages are installed: ``installed(("pkg", "1.0", "ep", module), ...)``."""
    import importlib.metadata

    def install(*packages: tuple[str, str, str, Any]) -> None:
        dists = [_Dist(name, version, [_EntryPoint(ep, f"{name}.plugin", "servesim", target)])
                 for name, version, ep, target in packages]
        monkeypatch.setattr(importlib.metadata, "distributions", lambda: iter(dists))

    monkeypatch.delenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    return install


def test_entry_point_engines_are_listed_with_their_package(
        installed: Callable[..., None], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from servesim.cli import main

    installed(("pkg-echo", "1.2", "echo_ep", _module("echo_mod", EchoEngine)))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plugins", "--format", "json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)
            if row["kind"] == "engine"}
    assert rows["echo"]["plugin"] == "echo_ep"
    assert rows["echo"]["source"] == "pkg-echo 1.2 (entry point 'echo_ep')"
    assert rows["vllm"]["source"].endswith("(built-in)")
    assert main(["plugins"]) == 0
    assert "echo_ep (pkg-echo 1.2)" in capsys.readouterr().out


def test_a_duplicate_engine_names_both_packages(installed: Callable[..., None]) -> None:
    installed(("pkg-alpha", "1.0", "alpha", _module("a", EchoEngine)),
              ("pkg-beta", "2.0", "beta", _module("b", EchoEngine)))
    with pytest.raises(PluginError) as info:
        EngineRegistry.collect(get_plugin_manager())
    assert rendered(info.value) == [
        "plugin 'beta' (package pkg-beta 2.0): engine name 'echo' is registered by both "
        "'alpha' (package pkg-alpha 1.0) and 'beta' (package pkg-beta 2.0) "
        "[duplicate-engine]"]


@pytest.mark.parametrize("failure", [ImportError("no module named 'numpyy'"), SystemExit(3)])
def test_a_plugin_that_fails_to_import_is_named(installed: Callable[..., None],
                                                failure: BaseException) -> None:
    installed(("pkg-ok", "1.0", "ok", _module("ok", EchoEngine)),
              ("pkg-bad", "0.1", "bad", failure))
    with pytest.raises(PluginError) as info:
        get_plugin_manager()
    assert rendered(info.value) == [
        "plugin 'bad' (package pkg-bad 0.1): loading the 'servesim' entry-point plugin "
        f"failed: {type(failure).__name__}: {failure} [plugin-load-failed]"]


def test_a_plugin_engine_that_raises_in_replay_is_not_a_servesim_crash(
        installed: Callable[..., None], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from servesim.cli import main

    installed(("pkg-broken", "0.3", "broken", _module("broken_mod", Broken)))
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("NO_COLOR", "1")
    cfg = tmp_path / "cfg.toml"
    cfg.write_text(small_config(engine="broken"))
    assert main(["validate", str(cfg)]) == 0
    capsys.readouterr()
    assert main(["replay", str(cfg), "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[0] == (
        "error: plugin 'broken' (package pkg-broken 0.3): raised in Broken.replay: "
        "RuntimeError: kaput [plugin-error]")
    assert "Traceback" not in captured.err
    assert "bug in the plugin at test_hooks.py:" in captured.err


def test_disabled_autoload_and_an_explicit_plugin_module(
        installed: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from servesim.cli import main

    installed(("pkg-echo", "1.2", "echo_ep", _module("echo_mod", EchoEngine)))
    monkeypatch.setenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", "1")
    (tmp_path / "my_echo_plugin.py").write_text(
        "from servesim import hookimpl\n"
        "from servesim.engines.base import Engine\n\n"
        "class Other(Engine):\n    NAME = 'other'\n    def replay(self, *a, **k): ...\n\n"
        "@hookimpl\ndef servesim_register_engines():\n    return [Other]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plugins", "--format", "json"]) == 0
    names = {row["name"] for row in json.loads(capsys.readouterr().out)}
    assert "echo" not in names and "other" not in names
    assert main(["--plugin", "my_echo_plugin", "plugins", "--format", "json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["other"]["source"] == "module my_echo_plugin"
    sys.modules.pop("my_echo_plugin", None)


def test_schema_config_includes_plugin_engine_options(servesim_cli: Any) -> None:
    result = servesim_cli("schema", "config", plugins=[])
    assert "options.echo" not in json.loads(result.out)["$defs"]
    module = _module("schema_echo", EchoEngine)
    sys.modules["schema_echo"] = module
    try:
        result = servesim_cli("schema", "config", plugins=["schema_echo"])
    finally:
        del sys.modules["schema_echo"]
    schema = json.loads(result.out)
    assert schema["$defs"]["options.echo"]["properties"]["delay_ms"] == {
        "default": 1.0, "description": "time from arrival to completion", "maximum": 1e6,
        "minimum": 0.0, "type": "number"}
    assert {"if": {"properties": {"engine": {"const": "echo"}}, "required": ["engine"]},
            "then": {"properties": {"options": {"$ref": "#/$defs/options.echo"}}}} in \
        schema["$defs"]["Engine"]["allOf"]
