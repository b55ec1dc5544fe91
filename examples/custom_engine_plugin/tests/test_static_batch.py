"""The static-batch engine: options, payload checks and scheduling semantics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servesim.errors import CompileError, PayloadError
from servesim.payload import Payload, dump_payload, load_payload
from servesim.testing import ReplayRun, rendered, small_config

P, D = 10.0, 2.0  # fixed prefill and decode step times (ms)


def trace_config(tmp_path: Path, rows: list[tuple[float, int, int]], *,
                 options: dict[str, Any] | None = None, timing: str = "fixed",
                 engine: str = "static-batch") -> str:
    """A config replaying ``rows`` (arrival_ms, input, output) from a CSV trace."""
    lines = ["arrival_ms,input_tokens,output_tokens", *(f"{a},{i},{o}" for a, i, o in rows)]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    timing_keys = f'type = "{timing}"\n' + (
        f"prefill_ms = {P}\ndecode_ms = {D}\n" if timing == "fixed" else "")
    opts = ", ".join(f"{k} = {str(v).lower() if isinstance(v, bool) else v}"
                     for k, v in (options or {}).items())
    return f"""
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
engine = "{engine}"
options = {{ {opts} }}
[engine.workers.aggregated.kv_cache]
block_size = 16
capacity = {{ type = "fixed", blocks = 1024 }}
[engine.workers.aggregated.timing]
{timing_keys}
[traffic.source]
type = "trace"
format = "csv"
paths = ["t.csv"]
[traffic.load]
type = "trace_timestamps"
"""


def by_id(run: ReplayRun) -> dict[int, dict[str, Any]]:
    return {r["request_id"]: r for r in run.requests}


# --- registration and options ---------------------------------------------------------

def test_the_plugin_registers_an_engine_a_timing_provider_and_a_trace_format(
        engine_registry: Any) -> None:
    assert "static-batch" in engine_registry.names()
    assert "linear" in engine_registry.timing_providers
    assert "csv" in engine_registry.trace_formats
    assert engine_registry.origin("static-batch") == "servesim_static_batch.plugin"


def test_options_are_lowered_with_their_defaults(compile_toml: Callable[..., Any]) -> None:
    payload = compile_toml(small_config(engine="static-batch", options={"max_batch_size": 3}))
    assert isinstance(payload, Payload)
    assert payload.engine == "static-batch"
    assert payload.engine_options == {"max_batch_size": 3, "max_wait_ms": 0.0,
                                      "pad_to_longest": True}


def test_option_errors_have_dotted_paths(compile_toml: Callable[..., Any]) -> None:
    text = small_config(engine="static-batch", options={
        "max_batch_sise": 8, "pad_to_longest": "yes"})
    with pytest.raises(CompileError) as info:
        compile_toml(text, stop_after="parse")
    assert rendered(info.value) == [
        "engine.options.pad_to_longest: expected true or false, got string 'yes' [wrong-type]",
        "engine.options.max_batch_sise: unknown key 'max_batch_sise' (allowed here: "
        "max_batch_size, max_wait_ms, pad_to_longest) [unknown-key]"]
    with pytest.raises(CompileError) as info:
        compile_toml(small_config(engine="static-batch", options={"max_batch_size": 0}))
    assert rendered(info.value) == [
        "engine.options.max_batch_size: must be in [1, 2^20], got 0 [out-of-range]"]


def test_the_engine_refuses_what_it_does_not_model(compile_toml: Callable[..., Any]) -> None:
    text = small_config(engine="static-batch").replace(
        "replicas = 1", "replicas = 1\nattention_data = 2")
    with pytest.raises(CompileError) as info:
        compile_toml(text)
    assert rendered(info.value) == [
        "engine.workers.aggregated.parallelism.attention_data: static-batch runs one "
        "scheduler per worker; attention_data must be 1, got 2 [static-batch-attention-dp]"]


def test_a_hand_edited_payload_is_checked_again(compile_toml: Callable[..., Any],
                                                replay_toml: Callable[..., ReplayRun],
                                                tmp_path: Path) -> None:
    payload = compile_toml(small_config(engine="static-batch"))
    text = dump_payload(payload).replace('"max_wait_ms": 0.0', '"max_wait_ms": -5.0')
    import json

    bad = load_payload(json.loads(text))
    with pytest.raises(PayloadError) as info:
        replay_toml(bad)
    assert rendered(info.value) == [
        "engine.options.max_wait_ms: must be in [0, 1000000000], got -5 [out-of-range]"]


# --- scheduling semantics -------------------------------------------------------------

def test_a_batch_runs_to_its_longest_output(tmp_path: Path,
                                            replay_toml: Callable[..., ReplayRun]) -> None:
    # both start together; the short one finishes early, the batch ends with the long one
    run = replay_toml(trace_config(tmp_path, [(0.0, 64, 2), (0.0, 64, 5)]))
    r = by_id(run)
    assert r[0]["ttft_ms"] == P and r[1]["ttft_ms"] == P
    assert r[0]["e2el_ms"] == P + D
    assert r[1]["e2el_ms"] == P + 4 * D


def test_a_request_waits_for_the_running_batch(tmp_path: Path,
                                               replay_toml: Callable[..., ReplayRun]) -> None:
    # request 1 arrives 1 ms after a 10-token batch started: no joining in flight, it is
    # prefilled when that batch ends at P + 9 D
    run = replay_toml(trace_config(tmp_path, [(0.0, 64, 10), (1.0, 64, 1)]))
    r = by_id(run)
    assert r[0]["e2el_ms"] == P + 9 * D
    assert r[1]["ttft_ms"] == (P + 9 * D) + P - 1.0
    assert run.report["static_batch"] == {"batches": 2, "mean_batch_size": 1.0}


def test_at_the_cutoff_a_batch_in_flight_keeps_only_the_tokens_seen(
        tmp_path: Path, replay_toml: Callable[..., ReplayRun]) -> None:
    # the batch's tokens are stamped ahead (P, P + D, ...); the run ends at the arrival at
    # 12 ms (the last event before the 15 ms cutoff), so tokens after 12 ms are dropped
    config = trace_config(tmp_path, [(0.0, 64, 10), (12.0, 64, 4)])
    run = replay_toml(config + "[traffic.stop]\nmax_virtual_time_seconds = 0.015\n")
    r = by_id(run)
    assert [r[i]["terminal_status"] for i in (0, 1)] == ["incomplete", "incomplete"]
    assert (r[0]["first_token_ms"], r[0]["last_token_ms"], r[0]["output_length"]) == (
        P, P + D, 2)
    assert r[1]["output_length"] == 0
    assert run.report["num_requests"] == 2


def test_an_idle_worker_waits_for_a_full_batch(tmp_path: Path,
                                               replay_toml: Callable[..., ReplayRun]) -> None:
    rows = [(0.0, 64, 1), (30.0, 64, 1)]
    full = replay_toml(trace_config(tmp_path, rows, options={"max_batch_size": 2,
                                                             "max_wait_ms": 50.0}))
    assert by_id(full)[0]["ttft_ms"] == 30.0 + P  # started when the second arrived
    assert full.report["static_batch"]["batches"] == 1
    partial = replay_toml(trace_config(tmp_path, rows, options={"max_batch_size": 2,
                                                                "max_wait_ms": 20.0}))
    assert by_id(partial)[0]["ttft_ms"] == 20.0 + P  # gave up waiting after 20 ms
    assert partial.report["static_batch"]["batches"] == 2


def test_padding_makes_decode_steps_cost_the_whole_batch(
        tmp_path: Path, replay_toml: Callable[..., ReplayRun]) -> None:
    # "linear" timing charges decode per KV token: padded finished requests cost time
    rows = [(0.0, 512, 2), (0.0, 512, 2), (0.0, 64, 40)]
    padded = replay_toml(trace_config(tmp_path, rows, timing="linear"))
    unpadded = replay_toml(trace_config(tmp_path, rows, timing="linear",
                                        options={"pad_to_longest": False}))
    assert by_id(padded)[2]["e2el_ms"] > by_id(unpadded)[2]["e2el_ms"]
    assert by_id(padded)[0]["e2el_ms"] == by_id(unpadded)[0]["e2el_ms"]


def test_a_request_that_can_never_fit_is_rejected(tmp_path: Path,
                                                  replay_toml: Callable[..., ReplayRun]) -> None:
    # the pool holds 1024 x 16 tokens
    run = replay_toml(trace_config(tmp_path, [(0.0, 20000, 1), (0.0, 64, 1)]))
    assert [r["terminal_status"] for r in sorted(run.requests, key=lambda r: r["request_id"])] == [
        "rejected", "completed"]


def test_static_batching_delays_first_tokens_compared_to_vllm(
        tmp_path: Path, replay_toml: Callable[..., ReplayRun]) -> None:
    # a request every 5 ms: vLLM admits each into the next pass, static batching makes it
    # wait for the batch in flight
    rows = [(5.0 * i, 256, 64) for i in range(40)]
    vllm = replay_toml(trace_config(tmp_path, rows, engine="vllm", timing="polynomial"))
    static = replay_toml(trace_config(tmp_path, rows, timing="polynomial"))
    assert static.report["completed"] == vllm.report["completed"] == 40
    assert (static.report["engine"], vllm.report["engine"]) == ("static-batch", "vllm")
    assert static.report["mean_ttft_ms"] > 2 * vllm.report["mean_ttft_ms"]


def test_replays_are_deterministic_and_every_request_ends_once(
        replay_toml: Callable[..., ReplayRun]) -> None:
    text = small_config(engine="static-batch", options={"max_batch_size": 3},
                        requests=25, concurrency=5)
    a, b = replay_toml(text), replay_toml(text)
    assert a.report == b.report
    assert sorted(r["request_id"] for r in a.requests) == list(range(25))


# --- the command line -----------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize("config", ["static_batch.toml", "csv_trace.toml"])
def test_the_example_configs_replay_from_the_cli(config: str, servesim_cli: Any) -> None:
    import json

    result = servesim_cli("replay", EXAMPLE / config, "--quiet", "--format", "json")
    assert (result.code, result.err) == (0, "")
    report = json.loads(result.out)
    assert report["engine"] == "static-batch"
    assert report["completed"] == report["num_requests"] > 0


def test_the_cli_validates_and_shows_the_options(servesim_cli: Any) -> None:
    import json

    result = servesim_cli("validate", EXAMPLE / "static_batch.toml")
    assert result.code == 0 and "engine static-batch" in result.out
    result = servesim_cli("inspect", EXAMPLE / "static_batch.toml")
    assert "max_wait_ms = 50.0  (authored)" in result.out
    result = servesim_cli("inspect", EXAMPLE / "csv_trace.toml", "--format", "json")
    assert json.loads(result.out)["engine_options"] == {
        "max_batch_size": 4, "max_wait_ms": 0.0, "pad_to_longest": True}
    schema = json.loads(servesim_cli("schema", "config").out)
    options = schema["$defs"]["options.static-batch"]["properties"]
    assert options["max_wait_ms"]["default"] == 0.0
    assert "idle worker" in options["max_wait_ms"]["description"]


@pytest.mark.parametrize("seed", range(6))
def test_random_traces_end_every_request_once_with_all_its_tokens(
        seed: int, tmp_path: Path, replay_toml: Callable[..., ReplayRun]) -> None:
    import random

    rng = random.Random(seed)
    rows, t = [], 0.0
    for _ in range(60):
        t += rng.choice([0.0, 0.5, 3.0, 20.0])
        rows.append((t, rng.randint(1, 3000), rng.randint(0, 40)))
    options = {"max_batch_size": rng.randint(1, 6), "max_wait_ms": rng.choice([0.0, 5.0]),
               "pad_to_longest": rng.random() < 0.5}
    run = replay_toml(trace_config(tmp_path, rows, options=options))
    assert sorted(r["request_id"] for r in run.requests) == list(range(60))
    for r in run.requests:
        assert r["terminal_status"] == "completed"
        assert r["output_length"] == r["requested_output_length"]
        assert r["first_admit_ms"] >= r["arrival_time_ms"]
        if r["output_length"]:
            assert r["ttft_ms"] >= P and r["terminal_time_ms"] == r["last_token_ms"]
