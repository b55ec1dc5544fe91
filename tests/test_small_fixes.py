"""Smaller robustness fixes: session ids that would merge or collide are refused, a trace
can stop after a number of requests, and startup_seconds (which a replay could not honour)
is refused instead of ignored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

CONFIG = """\
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 1.0
decode_ms = 1.0
[traffic.source]
type = "trace"
paths = ["t.jsonl"]
block_size = 16
[traffic.load]
type = "trace_timestamps"
"""
ROW = '{"timestamp": %d, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]%s}\n'


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, [line.replace(f"{Path.cwd()}/", "") for line in err.splitlines()]


def trace(*extras: str) -> None:
    Path("t.jsonl").write_text("".join(ROW % (i, extra) for i, extra in enumerate(extras)),
                               encoding="utf-8")
    Path("c.toml").write_text(CONFIG, encoding="utf-8")


def test_session_ids_1_and_quoted_1_are_not_merged(capsys: pytest.CaptureFixture[str]) -> None:
    trace(', "session_id": 1', ', "session_id": "1"')
    expected = [
        'error: t.jsonl:1: session_id 1 is written both as a number and as the string "1": '
        "two sessions, or one? [trace-bad-field]",
        "  hint: write every session_id of a session the same way"]
    assert run(capsys, "replay", "c.toml", "--quiet") == (1, "", expected)
    # validate reports every bad row
    assert run(capsys, "validate", "c.toml") == (1, "", [
        *expected, expected[0].replace("t.jsonl:1", "t.jsonl:2"), expected[1]])


def test_an_implicit_request_name_cannot_collide_with_a_session_id(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace("", ', "session_id": "request_1"')
    assert run(capsys, "replay", "c.toml", "--quiet") == (1, "", [
        "error: t.jsonl:1: this row has no session_id, so its request is named 'request_1', "
        "which another row gives as its session_id [trace-bad-field]",
        "  hint: give this row a session_id of its own, or rename that session"])


def test_integer_and_string_session_ids_that_differ_are_sessions(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace(', "session_id": 1', ', "session_id": "a"', ', "session_id": 1')
    code, out, _ = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    assert code == 0 and json.loads(out)["completed_requests"] == 3


def test_a_trace_stops_after_a_number_of_requests(capsys: pytest.CaptureFixture[str]) -> None:
    trace("", "", "", "")
    Path("c.toml").write_text(CONFIG + "[traffic.stop]\nrequests = 2\n", encoding="utf-8")
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    assert (code, err) == (0, [])
    report = json.loads(out)
    assert (report["num_requests"], report["completed_requests"]) == (2, 2)
    code, out, _ = run(capsys, "inspect", "c.toml", "--format", "json")
    assert json.loads(out)["provenance"]["traffic.stop.requests"]["origin"] == "authored"


def test_startup_seconds_is_refused_as_it_would_change_nothing(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace("")
    Path("c.toml").write_text(CONFIG.replace("[engine.workers.aggregated.timing]",
                                             "[engine.workers.aggregated]\nstartup_seconds = 30"
                                             "\n[engine.workers.aggregated.timing]"),
                              encoding="utf-8")
    assert run(capsys, "validate", "c.toml") == (1, "", [
        "error: engine.workers.aggregated.startup_seconds: startup_seconds = 30 would have no "
        "effect: it delays workers that join during a run, and a replay starts every worker "
        "at t=0 [unsupported-field]",
        "  hint: remove startup_seconds"])
