"""``[evaluation.sla]``: keys named for what they check, numbers (per-request bounds) or
tables (targets on the run), the deprecated ``itl_ms`` number, and the verdicts a replay
prints and reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.compiler import compile_text
from servesim.errors import CompileError, PayloadError
from servesim.payload import SlaArgs, SlaTarget, load_payload, payload_to_dict
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV, EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload
from servesim.sla import check_sla, sla_deprecations
from servesim.testing import small_config

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
HEAD = small_config(requests=3, input_tokens=16, output_tokens=4, concurrency=1,
                    prefill_ms=10.0, decode_ms=5.0)


def compiled(sla: str) -> SlaArgs | None:
    return compile_text(HEAD + "[evaluation.sla]\n" + sla, name="c.toml",
                        registry=REGISTRY).sla


def errors(sla: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compiled(sla)
    return [d.render() for d in info.value.diagnostics]


def test_numbers_are_per_request_bounds_and_tables_are_targets() -> None:
    sla = compiled('ttft_ms = 100\ntpot_ms = { p99 = 8, per_request = 9 }\n'
                   'itl_ms = { "p99.9" = 6 }\ne2e_ms = { p50 = 40 }\n')
    assert sla == SlaArgs(targets=(
        SlaTarget("ttft_ms", "per_request", 100.0), SlaTarget("tpot_ms", "p99", 8.0),
        SlaTarget("tpot_ms", "per_request", 9.0), SlaTarget("itl_ms", "p99.9", 6.0),
        SlaTarget("e2e_ms", "p50", 40.0)))


def test_e2e_combines_with_the_other_bounds() -> None:
    sla = compiled("ttft_ms = 100\ne2e_ms = 200\n")
    assert sla is not None and [t.metric for t in sla.targets] == ["ttft_ms", "e2e_ms"]


def test_the_itl_ms_number_is_read_as_before_with_a_deprecation_warning() -> None:
    sla = compiled("itl_ms = 50\n")
    assert sla == SlaArgs(itl_ms=50.0)  # the payload's first field: the mean gap (TPOT)
    assert [d.render() for d in sla_deprecations(sla)] == [
        "evaluation.sla.itl_ms: itl_ms = 50 bounds each request's mean token gap, which is "
        "TPOT; it is checked that way in this release and will bound every inter-token gap "
        "in the next [deprecated-key]\n"
        "  hint: rename it to tpot_ms = 50; to bound every gap between a request's tokens "
        "now, write itl_ms = { per_request = 50 }"]
    assert sla_deprecations(compiled("tpot_ms = 50\n")) == []
    assert sla_deprecations(compiled("itl_ms = { per_request = 50 }\n")) == []


@pytest.mark.parametrize(("sla", "expected"), [
    ("ttft_ms = { p42 = 1 }\n", [
        "evaluation.sla.ttft_ms.p42: unknown target 'p42' (allowed: per_request, mean, "
        "median, p50, p75, p90, p95, p99, p99.9, min, max) [sla-unknown-stat]\n"
        "  hint: did you mean 'p50'?"]),
    ("ttft_ms = { p99 = 0 }\n", [
        "evaluation.sla.ttft_ms.p99: must be in (0, 1000000000000], got 0 [out-of-range]"]),
    ("e2e_ms = { max = -3 }\n", [
        "evaluation.sla.e2e_ms.max: must be in (0, 1000000000000], got -3 [out-of-range]"]),
    ("tpot_ms = 0\n", [
        "evaluation.sla.tpot_ms: must be in (0, 1000000000000], got 0 [out-of-range]"]),
    ("ttft_ms = {}\n", [
        "evaluation.sla.ttft_ms: an empty table sets no target [sla-empty]\n"
        "  hint: write a number (a per-request bound) or targets such as "
        "ttft_ms = { p99 = 1000 }"]),
    ('ttft_ms = "fast"\n', [
        "evaluation.sla.ttft_ms: expected a number or a table of numbers, got "
        "string 'fast' [wrong-type]"]),
    ('ttft_ms = { p99 = "1" }\n', [
        "evaluation.sla.ttft_ms.p99: expected a number, got string '1' [wrong-type]"]),
    ("ttft_ms = { p99 = nan }\n", [
        "evaluation.sla.ttft_ms.p99: expected a finite number, got nan [not-finite]"]),
    ("tpot_ms = 40\nitl_ms = 50\n", [
        "evaluation.sla.tpot_ms: itl_ms (a number: each request's mean gap, as tpot_ms) "
        "and tpot_ms bound the same thing [sla-duplicate]\n  hint: keep one of them"]),
    ("tpot_ms = { p50 = 1, median = 2 }\n", [
        "evaluation.sla.tpot_ms.median: tpot_ms.p50 and tpot_ms.median bound the same "
        "thing [sla-duplicate]\n  hint: keep one of them"]),
    ("ttft_ms.p99.9 = 5\n", [  # unquoted, p99.9 is a table in a table
        "evaluation.sla.ttft_ms.p99: expected a number, got a table [wrong-type]"]),
    ("itl_ms_p99 = 5\n", [
        "evaluation.sla.itl_ms_p99: unknown key 'itl_ms_p99' (allowed here: ttft_ms, "
        "tpot_ms, itl_ms, e2e_ms) [unknown-key]\n  hint: did you mean 'itl_ms'?"]),
], ids=["unknown-stat", "zero", "negative", "zero-number", "empty", "string", "string-in-table",
        "nan", "itl-and-tpot", "p50-and-median", "unquoted-p99.9", "unknown-key"])
def test_bad_sla_values_name_their_path(sla: str, expected: list[str]) -> None:
    assert errors(sla) == expected


def test_a_hand_written_payload_is_held_to_the_same_rules() -> None:
    payload = compile_text(HEAD, name="c.toml", registry=REGISTRY)
    data = payload_to_dict(payload)
    data["sla"] = {"ttft_ms": 5.0, "targets": [
        {"metric": "ttft_ms", "stat": "per_request", "bound": 6.0},
        {"metric": "itl_ms", "stat": "p100", "bound": 1.0}]}
    bad = load_payload(data)
    assert [d.render().splitlines()[0] for d in check_sla(bad.sla)] == [
        "evaluation.sla.ttft_ms: ttft_ms and ttft_ms bound the same thing [sla-duplicate]",
        "evaluation.sla.itl_ms.p100: unknown target 'p100' (allowed: per_request, mean, "
        "median, p50, p75, p90, p95, p99, p99.9, min, max) [sla-unknown-stat]"]
    with pytest.raises(PayloadError):
        replay_payload(bad, registry=REGISTRY)


def test_a_payload_without_targets_replays_its_first_fields_as_before() -> None:
    payload = compile_text(HEAD, name="c.toml", registry=REGISTRY)
    data = payload_to_dict(payload)
    data["sla"] = {"ttft_ms": 1000.0, "itl_ms": 4.0, "e2e_ms": None}  # a v1 payload's SLA
    outcome = replay_payload(load_payload(data), registry=REGISTRY)
    # fixed timing: 5 ms between tokens, so the mean gap (what itl_ms meant) is over 4
    assert outcome.report["good_request_count"] == 0
    assert [d.code for d in outcome.warnings] == ["deprecated-key"]
    assert [(v["metric"], v["stat"]) for v in outcome.report["sla_verdicts"]] == [
        ("ttft_ms", "per_request"), ("tpot_ms", "per_request")]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    return tmp_path


def test_the_replay_prints_and_reports_a_verdict_per_target(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # one request at a time: TTFT = P + D = 15 ms, then three 5 ms gaps
    Path("c.toml").write_text(HEAD + "[evaluation.sla]\nttft_ms = { p99 = 20 }\n"
                              "tpot_ms = 4\nitl_ms = { max = 5 }\n", encoding="utf-8")
    assert main(["replay", "c.toml", "--quiet", "-o", "r.json"]) == 0
    out = capsys.readouterr().out
    rows = [" ".join(line.replace("│", " ").split()) for line in out.splitlines()]
    assert "ttft_ms p99 <= 20.00 15.00 met" in rows
    assert "tpot_ms per request <= 4.00 5.00 worst missed (0.0% of requests within)" in rows
    assert "itl_ms max <= 5.00 5.00 met" in rows
    assert "request_goodput 0.000 req/s (0 good)" in rows
    report = json.loads(Path("r.json").read_text(encoding="utf-8"))
    assert [(v["metric"], v["stat"], v["met"]) for v in report["sla_verdicts"]] == [
        ("tpot_ms", "per_request", False), ("ttft_ms", "p99", True), ("itl_ms", "max", True)]


def test_validate_and_replay_warn_about_the_deprecated_itl_ms(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("c.toml").write_text(HEAD + "[evaluation.sla]\nitl_ms = 50\n", encoding="utf-8")
    for argv in (["validate", "c.toml"], ["replay", "c.toml", "--quiet"],
                 ["compile", "c.toml", "-o", "p.json"]):
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert err.startswith("warning: evaluation.sla.itl_ms: itl_ms = 50 bounds each "
                              "request's mean token gap")
        assert "hint: rename it to tpot_ms = 50" in err


def test_inspect_shows_each_target(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Path("c.toml").write_text(HEAD + "[evaluation.sla]\nitl_ms = 50\n"
                              "e2e_ms = { p99 = 900 }\n", encoding="utf-8")
    assert main(["inspect", "c.toml"]) == 0
    out = capsys.readouterr().out
    assert "itl_ms (deprecated: each request's mean gap, as tpot_ms) = 50.0  (authored)" in out
    assert "e2e_ms.p99 = 900.0  (authored)" in out
