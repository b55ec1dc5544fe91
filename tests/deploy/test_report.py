"""``servesim report`` and ``--html``: a self-contained page of results or of one replay."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from servesim.report.page import pareto_front

from .conftest import run

REPLICAS = "engine.workers.aggregated.parallelism.replicas"


def test_the_pareto_front_keeps_the_points_nothing_beats() -> None:
    points = [(1.0, 5.0), (2.0, 4.0), (1.5, 3.0), (3.0, 1.0), (0.5, 5.0)]
    assert pareto_front(points) == [0, 1, 3]


def self_contained(path: str) -> str:
    text = Path(path).read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"<script[^>]+src=", text)  # plotly.js is inline: no network
    assert "Plotly.newPlot" in text
    return text


def test_sweep_html_and_report_of_a_results_file(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly")
    code, _, _ = run(capsys, "sweep", "tiny.toml", "--set", f"{REPLICAS}=1,2",
                     "-o", "r.csv", "-j", "1", "--html", "sweep.html")
    assert code == 0
    text = self_contained("sweep.html")
    assert "Pareto front" in text and "Latency percentiles per point" in text
    assert "replicas=2" in text
    assert run(capsys, "report", "r.csv", "-o", "again.html")[0] == 0
    assert "Pareto front" in self_contained("again.html")


def test_report_of_one_replay(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly")
    assert run(capsys, "replay", "tiny.toml", "-o", "rep.json",
               "--requests-out", "req.jsonl")[0] == 0
    code, _, err = run(capsys, "report", "rep.json", "--requests", "req.jsonl",
                       "-o", "replay.html")
    assert (code, err.strip()) == (0, "wrote replay.html")
    text = self_contained("replay.html")
    assert "Over virtual time" in text and "Latency distributions" in text


@pytest.mark.parametrize(("name", "text", "message"), [
    ("x.json", "[1, 2]", "not a results file"),
    ("x.json", '{"a": 1}', "neither a results file nor a replay report"),
    ("x.csv", "", "no rows"),
    ("x.txt", "a", "name a .csv, .json or .parquet file"),
    ("missing.json", None, "not a results file"),
])
def test_bad_report_inputs_are_input_errors(capsys: pytest.CaptureFixture[str], name: str,
                                            text: str | None, message: str) -> None:
    pytest.importorskip("plotly")
    if text is not None:
        Path(name).write_text(text)
    code, _, err = run(capsys, "report", name, "-o", "out.html")
    assert code == 1 and message in err and "Traceback" not in err
    assert not Path("out.html").exists()


def test_bad_request_lines_are_an_input_error(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly")
    assert run(capsys, "replay", "tiny.toml", "-o", "rep.json")[0] == 0
    Path("req.jsonl").write_text('{"a": 1}\n')
    code, _, err = run(capsys, "report", "rep.json", "--requests", "req.jsonl", "-o", "o.html")
    assert code == 1 and "line 1 is not a request record" in err


def test_without_plotly_the_report_says_what_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(capsys, "sweep", "tiny.toml", "--set", f"{REPLICAS}=1,2", "-o", "r.json",
               "-j", "1")[0] == 0
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    code, _, err = run(capsys, "report", "r.json", "-o", "out.html")
    assert code == 1 and "pip install 'servesim[report]'" in err
