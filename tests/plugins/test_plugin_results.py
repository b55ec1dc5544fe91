"""What a plugin engine returns is checked before use: a wrong return value, a NaN, a
record sent twice or never, a hook returning garbage, a GeneratorExit - each is a
``plugin-error`` naming the plugin and the hook, never a traceback or a wrong report. A
plugin that prints cannot corrupt ``--format json``; one that loops forever is ended by
``--timeout``."""

from __future__ import annotations

import json
import math
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.cli import main
from servesim.engines.base import Engine, ReplayResult
from servesim.engines.kernel.requests import RequestRecord
from servesim.errors import Diagnostic
from servesim.plugins import hookimpl
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV
from servesim.testing import small_config

Behaviour = Callable[[Any, Any], Any]  # (workload, sink) -> what replay returns


def _records(workload: Any, sink: Any, *, times: float = 1.0, twice: bool = False,
             skip: int | None = None) -> None:
    for spec in workload.start():
        if spec.request_id == skip:
            continue
        record = RequestRecord(spec.request_id, spec.arrival_ms, spec.input_length,
                               spec.output_length, "completed", terminal_ms=times)
        record.token_times.append(times)
        sink(record)
        if twice:
            sink(record)


def _ok(workload: Any, sink: Any, **kw: Any) -> ReplayResult:
    _records(workload, sink, **kw)
    return ReplayResult(end_ms=1.0, gpu_seconds={"aggregated": 1.0})


class _RaisingMapping(Mapping[str, float]):
    def __getitem__(self, key: str) -> float:
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("cannot iterate")

    def __len__(self) -> int:
        return 1


def _generator_exit(workload: Any, sink: Any) -> Any:
    raise GeneratorExit


REPLAYS: dict[str, tuple[Behaviour, str]] = {
    "returns None": (lambda w, s: _records(w, s),
                     "Bad.replay returned None; it returns a servesim.engines.base.ReplayResult"),
    "non-numeric gpu_seconds": (
        lambda w, s: (_records(w, s), ReplayResult(end_ms=1.0, gpu_seconds={"a": "x"}))[1],
        "Bad.replay returned gpu_seconds {'a': 'x'}; it is a mapping of role name to a "
        "finite number >= 0"),
    "NaN gpu_seconds": (
        lambda w, s: (_records(w, s), ReplayResult(end_ms=1.0,
                                                   gpu_seconds={"a": math.nan}))[1],
        "Bad.replay returned gpu_seconds {'a': nan}; it is a mapping of role name to a finite "
        "number >= 0"),
    "a mapping that raises while read": (
        lambda w, s: (_records(w, s), ReplayResult(end_ms=1.0,
                                                   gpu_seconds=_RaisingMapping()))[1],
        "raised in Bad.replay result: RuntimeError: cannot iterate"),
    "a set in extra": (
        lambda w, s: (_records(w, s), ReplayResult(end_ms=1.0, gpu_seconds={},
                                                   extra={"k": {1, 2}}))[1],
        "Bad.replay returned extra {'k': {1, 2}}, which is no JSON object of finite values "
        "(Object of type set is not JSON serializable)"),
    "NaN in extra": (
        lambda w, s: (_records(w, s), ReplayResult(end_ms=1.0, gpu_seconds={},
                                                   extra={"k": math.inf}))[1],
        "Bad.replay returned extra {'k': inf}, which is no JSON object of finite values (Out "
        "of range float values are not JSON compliant)"),
    "NaN token times": (lambda w, s: _ok(w, s, times=math.nan),
                        "Bad.replay sent request 0 with a time that is no finite number of ms"),
    "a record sent twice": (lambda w, s: _ok(w, s, twice=True),
                            "Bad.replay sent a second record of request 0; each request has "
                            "one"),
    "a record never sent": (
        lambda w, s: _ok(w, s, skip=3),
        "Bad.replay returned without a record of 1 request(s) it was handed (3); each request "
        "ends with one record (status incomplete when unfinished)"),
    "a record of a request never handed out": (
        lambda w, s: (s(RequestRecord(99, 0.0, 1, 1, "rejected")), _ok(w, s))[1],
        "Bad.replay sent a record of request 99, which the workload never handed it"),
    "not a record": (lambda w, s: (s({"request_id": 0}), _ok(w, s))[1],
                     "Bad.replay sent {'request_id': 0} to the sink; it takes a RequestRecord "
                     "per request"),
    "GeneratorExit": (_generator_exit, "raised in Bad.replay: GeneratorExit: "),
}


_CHECKED = object()  # validate_payload runs the shared rules


def _engine(replay: Behaviour | None = None, validate: Any = _CHECKED) -> type[Engine]:
    class Bad(Engine):
        NAME = "bad"
        DESCRIPTION = "misbehaves"

        def validate_payload(self, payload: Any) -> Any:
            return super().validate_payload(payload) if validate is _CHECKED else validate

        def replay(self, payload: Any, workload: Any, sink: Any, *,
                   progress: Any = None) -> Any:
            if replay is None:
                return _ok(workload, sink)
            return replay(workload, sink)

    Bad.__qualname__ = "Bad"  # as a module-level class is named in messages
    return Bad


def _plugin(monkeypatch: pytest.MonkeyPatch, **hooks: Callable[[], Any]) -> None:
    module = types.ModuleType("bad_plugin")
    for name, fn in hooks.items():
        setattr(module, name, hookimpl(fn))
    monkeypatch.setitem(sys.modules, "bad_plugin", module)


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "400")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    Path("c.toml").write_text(small_config(engine="bad", requests=6, concurrency=6),
                              encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main(["--plugin", "bad_plugin", *argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err.splitlines()


def _error(message: str) -> str:
    return f"error: plugin 'bad_plugin': {message} [plugin-error]"


@pytest.mark.parametrize("case", list(REPLAYS))
def test_a_bad_replay_result_is_a_plugin_error(capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch,
                                               case: str) -> None:
    behaviour, message = REPLAYS[case]
    engine = _engine(behaviour)
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    Path("requests.jsonl").write_text("previous\n", encoding="utf-8")
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json",
                         "--requests-out", "requests.jsonl")
    assert (code, out) == (1, "")
    assert err[0] == _error(message)
    assert Path("requests.jsonl").read_text(encoding="utf-8") == "previous\n"


def test_a_good_plugin_replay_is_reported(capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    assert (code, err) == (0, [])
    assert json.loads(out)["completed_requests"] == 6


@pytest.mark.parametrize(("value", "shown"), [
    ("no problems", "'no problems'"), (5, "5"), ([1], "[1]"), (None, "None")])
def test_validate_payload_returning_no_diagnostics_is_a_plugin_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: Any,
        shown: str) -> None:
    engine = _engine(validate=value)
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    code, _, err = run(capsys, "replay", "c.toml", "--quiet")
    assert (code, err[0]) == (1, _error(
        f"Bad.validate_payload returned {shown}; it returns a list of servesim.errors."
        "Diagnostic (empty when the payload is accepted)"))


@pytest.mark.parametrize(("hook", "value", "message"), [
    ("servesim_register_engines", lambda: 5,
     "servesim_register_engines returned 5, expected a list of Engine subclasses"),
    ("servesim_register_timing_providers", lambda: _RaisingMapping(),
     "raised in servesim_register_timing_providers: RuntimeError: cannot iterate"),
    ("servesim_register_trace_formats", lambda: 5,
     "servesim_register_trace_formats returned int, expected a mapping of name to callable"),
])
def test_a_hook_returning_garbage_is_a_plugin_error(capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    hook: str, value: Any,
                                                    message: str) -> None:
    _plugin(monkeypatch, **{hook: value})
    code, out, err = run(capsys, "plugins")
    assert (code, out) == (1, "")
    code_name = "plugin-error" if message.startswith("raised") else "plugin-bad-registration"
    assert err[0] == f"error: plugin 'bad_plugin': {message} [{code_name}]"


def test_engine_attributes_of_the_wrong_type_are_refused(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine()
    engine.DESCRIPTION = {"not": "text"}  # type: ignore[assignment]
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    code, _, err = run(capsys, "plugins", "--format", "json")
    assert code == 1
    assert err[0].startswith("error: plugin 'bad_plugin': servesim_register_engines "
                             "registered <class ")
    assert err[0].endswith("whose MODES is no tuple of strings or DESCRIPTION no string "
                           "[plugin-bad-registration]")


def test_what_a_plugin_prints_goes_to_stderr(capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    def chatty(workload: Any, sink: Any) -> ReplayResult:
        print("hello from the plugin")
        return _ok(workload, sink)

    engine = _engine(chatty)

    def register() -> list[type[Engine]]:
        print("registering")
        return [engine]

    _plugin(monkeypatch, servesim_register_engines=register)
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    assert code == 0
    assert json.loads(out)["completed_requests"] == 6
    assert err == ["registering", "hello from the plugin"]


def test_timeout_ends_a_plugin_that_never_returns(capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    def forever(workload: Any, sink: Any) -> None:
        _records(workload, sink)
        while True:
            pass

    engine = _engine(forever)
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--timeout", "0.5",
                         "--requests-out", "r.jsonl")
    assert (code, out) == (130, "")
    # (it never reports its virtual time; the requests it ended are counted)
    assert err == ["stopped by --timeout 0.5 at virtual time 0.0 s, 6 of 6 requests done: no "
                   "report written; finished requests are in r.jsonl"]
    assert len(Path("r.jsonl").read_text(encoding="utf-8").splitlines()) == 6


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x", "1e30"])
def test_a_timeout_that_is_no_positive_number_is_a_usage_error(
        capsys: pytest.CaptureFixture[str], value: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "c.toml", "--timeout", value])
    assert info.value.code == 2
    assert f"expected a number of seconds in (0, 1e+07], got {value!r}" in \
        capsys.readouterr().err


_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                 max_size=3)
    | st.frozensets(st.integers(), max_size=2),
    max_leaves=6)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(end=_values, gpu=_values, extra=_values, validate=_values)
def test_any_plugin_return_value_is_a_report_or_a_plugin_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, end: Any,
        gpu: Any, extra: Any, validate: Any) -> None:
    def replay(workload: Any, sink: Any) -> Any:
        _records(workload, sink)
        return ReplayResult(end_ms=end, gpu_seconds=gpu, extra=extra)

    engine = _engine(replay, validate=validate if validate else [])
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    if code == 0:
        json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in the report"))
    else:
        assert code == 1 and err[0].startswith("error: plugin 'bad_plugin': ")
        assert err[0].endswith("[plugin-error]")


def test_a_diagnostic_a_plugin_returns_is_reported(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(validate=[Diagnostic(code="bad-thing", message="no", path=("engine",))])
    _plugin(monkeypatch, servesim_register_engines=lambda: [engine])
    assert run(capsys, "replay", "c.toml", "--quiet") == (1, "", ["error: engine: no "
                                                                 "[bad-thing]"])
