"""``servesim validate`` refuses what ``servesim replay`` refuses, with the same lines: the
admission rule of a prompt with chunked prefill off and the rows a timing table must have
are one implementation each, run by both. A replay in which no request completes is an
error; rejected requests are counted in the summary with their reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.cli import main
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

HEAD = """\
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
enable_chunked_prefill = false
context_length = 4096
[engine.workers.aggregated.scheduler]
max_batched_tokens = 512
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 1.0
decode_ms = 1.0
"""
SYNTHETIC = """
[traffic.source]
type = "synthetic"
input_tokens = 1000
output_tokens = 4
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
requests = 2
"""
SESSIONS = """
[traffic.source]
type = "synthetic-session"
new_input_tokens_per_turn = 1000
output_tokens_per_turn = 4
[traffic.source.session]
turns = 2
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
sessions = 1
"""
TRACE = """
[traffic.source]
type = "trace"
paths = ["trace.jsonl"]
block_size = 16
[traffic.load]
type = "trace_timestamps"
"""
ROW = '{"timestamp": %d, "input_length": %d, "output_length": 3, "hash_ids": [%s]}\n'
OVER_BUDGET = [
    "error: engine.workers.aggregated.scheduler.max_batched_tokens: request 0 needs 1000 "
    "uncached prompt tokens in one pass, but chunked prefill is disabled and "
    "max_batched_tokens is 512; the replay would deadlock [request-unschedulable]",
    "  hint: set enable_chunked_prefill = true, or raise scheduler.max_batched_tokens to at "
    "least 1000"]


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err.splitlines()


def trace(*lengths: int) -> None:
    ids = lambda n: ", ".join(str(i) for i in range(-(-n // 16)))  # noqa: E731
    Path("trace.jsonl").write_text("".join(ROW % (t, n, ids(n)) for t, n in enumerate(lengths)),
                                   encoding="utf-8")


@pytest.mark.parametrize("traffic", [SYNTHETIC, SESSIONS, TRACE])
def test_a_first_prompt_over_the_budget_is_refused_by_validate_as_by_replay(
        capsys: pytest.CaptureFixture[str], traffic: str) -> None:
    trace(1000, 100)
    Path("c.toml").write_text(HEAD + traffic, encoding="utf-8")
    validate = run(capsys, "validate", "c.toml")
    replay = run(capsys, "replay", "c.toml", "--quiet")
    assert validate == replay == (1, "", OVER_BUDGET)


def test_a_prompt_within_the_budget_is_accepted_by_both(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace(500, 100)
    Path("c.toml").write_text(HEAD + TRACE, encoding="utf-8")
    assert run(capsys, "validate", "c.toml")[0] == 0
    assert run(capsys, "replay", "c.toml", "--quiet", "--format", "json")[0] == 0


TABLE_HEAD = "batch_size,prefill_tokens,kv_read_tokens,latency_ms\n"
PREFILL_ONLY = TABLE_HEAD + "1,1,0,1\n1,8192,0,9\n64,1,0,2\n64,8192,0,20\n"
DECODE_ONLY = TABLE_HEAD + "1,0,0,1\n1,0,100000,3\n64,0,0,2\n64,0,100000,9\n"


@pytest.mark.parametrize(("table", "kind"), [(PREFILL_ONLY, "decode"),
                                             (DECODE_ONLY, "prefill")])
def test_a_table_without_the_rows_a_worker_needs_is_refused_by_both(
        capsys: pytest.CaptureFixture[str], table: str, kind: str) -> None:
    Path("t.csv").write_text(table, encoding="utf-8")
    config = HEAD.replace('type = "fixed"\nprefill_ms = 1.0\ndecode_ms = 1.0',
                          'type = "table"\npath = "t.csv"') + SYNTHETIC.replace("1000", "100")
    Path("c.toml").write_text(config, encoding="utf-8")
    expected = (1, "", [
        f"error: engine.workers.aggregated.timing.path: the table has no {kind} rows, but the "
        "aggregated workers run prefill and decode passes [timing-table-range]",
        "  hint: add rows with prefill_tokens > 0 (prefill) and prefill_tokens = 0 (decode)"])
    for argv in (["validate"], ["replay", "--quiet"]):  # the trace's path comes out absolute
        code, out, err = run(capsys, *argv, "c.toml")
        assert (code, out, [line.replace(f"{Path.cwd()}/", "") for line in err]) == expected


def test_a_pass_outside_the_table_is_located_at_the_table_s_key(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("t.csv").write_text(PREFILL_ONLY + "1,0,0,1\n1,0,10,3\n64,0,0,2\n64,0,10,9\n",
                             encoding="utf-8")
    config = HEAD.replace('type = "fixed"\nprefill_ms = 1.0\ndecode_ms = 1.0',
                          'type = "table"\npath = "t.csv"') + SYNTHETIC.replace("1000", "100")
    Path("c.toml").write_text(config, encoding="utf-8")
    code, _, err = run(capsys, "replay", "c.toml", "--quiet")
    assert code == 1
    assert err[0].startswith("error: engine.workers.aggregated.timing.path: decode pass at ")


def test_a_replay_that_completes_no_request_is_an_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace(5000, 6000)  # both at or over the 4096-token context
    Path("c.toml").write_text(HEAD.replace("enable_chunked_prefill = false\n", "") + TRACE,
                              encoding="utf-8")
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "-o", "r.json")
    assert (code, out) == (1, "")
    assert err == [
        "error: c.toml: no request of 2 completed: 2 rejected (prompt at or over the context "
        "length, or more tokens than a rank's KV cache holds) [nothing-completed]",
        "  hint: shorten the prompts or raise engine.context_length and the KV cache "
        "(kv_cache.memory_fraction, more GPUs per worker); or let the replay run longer"]
    assert not Path("r.json").exists()


def test_rejected_requests_are_counted_in_the_summary_with_their_reason(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace(5000, 100)
    Path("c.toml").write_text(HEAD.replace("enable_chunked_prefill = false\n", "") + TRACE,
                              encoding="utf-8")
    code, out, _ = run(capsys, "replay", "c.toml", "--quiet")
    assert code == 0
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "completed 1 / 2" in rows
    assert ("rejected requests 1 (prompt at or over the context length, or more tokens than a "
            "rank's KV cache holds)") in rows


def test_a_misspelt_trace_key_is_refused_by_both(capsys: pytest.CaptureFixture[str]) -> None:
    Path("trace.jsonl").write_text(
        '{"timestamp": 0, "input_len": 20, "output_length": 3, "hash_ids": [1, 2]}\n',
        encoding="utf-8")
    Path("c.toml").write_text(HEAD + TRACE, encoding="utf-8")
    expected = (1, "", [
        "error: trace.jsonl:1: unknown key 'input_len' [trace-unknown-key]",
        "  hint: did you mean 'input_length'? (a row holds only timestamp, created_time, "
        "input_length, input_tokens, output_length, output_tokens, output_token_ids, hash_ids, "
        "session_id, delay, delay_ms)"])
    for argv in (["validate"], ["replay", "--quiet"]):  # the trace's path comes out absolute
        code, out, err = run(capsys, *argv, "c.toml")
        assert (code, out, [line.replace(f"{Path.cwd()}/", "") for line in err]) == expected
