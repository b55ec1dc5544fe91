"""What a running replay shows: the fraction done, requests, virtual time and an ETA; log
lines when stderr is no terminal; where an interrupted replay stopped."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from servesim import progress as progress_module
from servesim.cli import main
from servesim.progress import LogLines, ReplayProgress, duration, expected_requests
from servesim.workloads.spec import (
    SessionSource,
    Stop,
    SyntheticSource,
    TraceSource,
    WorkloadSpec,
)

CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 2.0
[traffic.source]
type = "trace"
paths = ["trace.jsonl"]
[traffic.load]
type = "trace_timestamps"
"""
REQUESTS = 300
LINE = re.compile(r"replay: (\d+)%, virtual time ([\d,]+\.\d) s, ([\d,]+) of 300 requests done, "
                  r"\d+ s elapsed(, ETA \d+ s)?")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def config(tmp_path: Path) -> str:
    rows = [json.dumps({"timestamp": 5 * i, "input_length": 20, "output_length": 4,
                        "hash_ids": [i]})
            for i in range(REQUESTS)]
    (tmp_path / "trace.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (tmp_path / "cfg.toml").write_text(CONFIG, encoding="utf-8")
    return str(tmp_path / "cfg.toml")


def test_the_fraction_is_requests_done_and_the_eta_the_pace_so_far() -> None:
    clock = Clock()
    p = ReplayProgress(200, clock=clock)
    clock.now += 10.0
    p.virtual_time(1_450_200.0)
    for _ in range(50):
        p.request_ended(None)  # type: ignore[arg-type]
    assert p.fraction == 0.25 and p.eta_s() == 30.0
    assert p.line("replay") == ("replay: 25%, virtual time 1,450.2 s, 50 of 200 requests done, "
                                "10 s elapsed, ETA 30 s")
    assert p.brief() == "50/200 requests, virtual 1,450.2 s, ETA 30 s"


def test_with_a_time_stop_the_nearer_stop_is_the_fraction() -> None:
    clock = Clock()
    p = ReplayProgress(1000, 3_600_000.0, clock=clock)
    p.virtual_time(1_800_000.0)
    assert p.fraction == 0.5  # (10 of 1000 requests: 1%)
    assert p.where() == "virtual time 1,800.0 of 3,600.0 s, 0 of 1,000 requests done"


def test_without_a_known_size_there_is_no_fraction_and_no_eta() -> None:
    clock = Clock()
    p = ReplayProgress(None, clock=clock)
    clock.now += 2.0
    p.virtual_time(3000.0)
    assert p.fraction is None and p.eta_s() is None
    assert p.line("replay") == "replay: virtual time 3.0 s, 0 requests done, 2 s elapsed"


def test_show_is_called_at_most_every_interval() -> None:
    clock = Clock()
    p = ReplayProgress(None, clock=clock)
    shown: list[float] = []
    p.attach(lambda q: shown.append(q.virtual_ms), every_s=5.0)
    for step in range(12):  # one call a second
        clock.now += 1.0
        p.virtual_time(float(step))
    assert shown == [4.0, 9.0]


@pytest.mark.parametrize(("seconds", "text"), [
    (0.4, "0 s"), (59.4, "59 s"), (250.0, "4 min 10 s"), (7500.0, "2 h 05 min")])
def test_durations_read_as_a_person_writes_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_the_expected_requests_of_each_kind_of_traffic(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"a": 1}\n\n  \n{"a": 2}\n{"a": 3}', encoding="utf-8")
    rows = TraceSource(path=str(trace))
    assert expected_requests(WorkloadSpec(source=rows)) == 3  # blank lines are no rows
    assert expected_requests(WorkloadSpec(source=rows, stop=Stop(requests=2))) == 2
    assert expected_requests(WorkloadSpec(source=rows, stop=Stop(sessions=2))) is None
    assert expected_requests(WorkloadSpec(source=TraceSource(path=str(tmp_path / "none")))) \
        is None  # (the replay says it cannot read it)
    plugin = TraceSource(path=str(trace), format="someone-elses")
    assert expected_requests(WorkloadSpec(source=plugin)) is None
    assert expected_requests(WorkloadSpec(source=SyntheticSource(),
                                          stop=Stop(requests=7, sessions=5))) == 5
    assert expected_requests(WorkloadSpec(source=SessionSource(turns=3),
                                          stop=Stop(sessions=4))) == 12
    assert expected_requests(WorkloadSpec(source=SessionSource(),
                                          stop=Stop(max_virtual_time_seconds=9.0))) is None


def test_a_replay_logs_progress_lines_when_stderr_is_no_terminal(
        config: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)  # a line each time it can
    assert main(["replay", config, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["completed_requests"] == REQUESTS
    *lines, last = err.splitlines()
    matches = [LINE.fullmatch(line) for line in lines]
    assert len(lines) >= 2 and all(matches), lines
    done = [int(m.group(3).replace(",", "")) for m in matches if m]
    virtual = [float(m.group(2).replace(",", "")) for m in matches if m]
    assert done == sorted(done) and virtual == sorted(virtual) and 0 < done[-1] <= REQUESTS
    assert re.fullmatch(r"replay: done, virtual time [\d,.]+ s, 300 of 300 requests done, "
                        r"\d+ s elapsed", last)


def test_a_short_replay_logs_nothing(config: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", config, "--format", "json"]) == 0  # (shorter than LOG_EVERY_S)
    assert capsys.readouterr().err == ""


def test_quiet_logs_nothing(config: str, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    assert main(["replay", config, "--format", "json", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_ctrl_c_reports_the_virtual_time_reached_and_the_requests_done(
        config: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C while request 100 ends: the engine reports the instant it stopped at."""
    reported: list[float] = []
    virtual_time = ReplayProgress.virtual_time

    def record(self: ReplayProgress, now_ms: float) -> None:
        reported.append(now_ms)
        virtual_time(self, now_ms)

    def interrupted(self: ReplayProgress, record: Any) -> None:
        self.done += 1
        if self.done == 100:
            reported.append(-1.0)  # (the interrupt)
            raise KeyboardInterrupt

    monkeypatch.setattr(ReplayProgress, "virtual_time", record)
    monkeypatch.setattr(ReplayProgress, "request_ended", interrupted)
    report = Path(config).with_name("report.json")
    assert main(["replay", config, "--quiet", "-o", str(report)]) == 130
    out, err = capsys.readouterr()
    stopped_at = reported[-1]
    assert reported[-2] == -1.0 and stopped_at > max(reported[:-2], default=0.0)
    assert (out, err) == ("", f"interrupted at virtual time {stopped_at / 1000:,.1f} s, "
                              "100 of 300 requests done: no report written\n")
    assert not report.exists()


def test_the_last_log_line_only_follows_others() -> None:
    lines: list[str] = []

    class Stream:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    log = LogLines(Stream(), "replay")  # type: ignore[arg-type]
    p = ReplayProgress(3, clock=Clock())
    log.finish(p)
    assert lines == []
    log.show(p)
    log.finish(p)
    assert lines == ["replay: 0%, virtual time 0.0 s, 0 of 3 requests done, 0 s elapsed\n",
                     "replay: done, virtual time 0.0 s, 0 of 3 requests done, 0 s elapsed\n"]
