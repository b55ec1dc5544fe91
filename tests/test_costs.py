"""GPU-hour prices and what a deployment costs: the ``[evaluation] gpu_hour_usd`` key (one
number or a table by GPU, over the shipped catalog prices), its errors, the payload's
prices and their check, and the report's per-GPU and cost figures and summary lines."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from servesim.cli import main
from servesim.compiler import compile_text
from servesim.errors import CompileError, PayloadError
from servesim.payload import GpuPriceArgs, Payload, dump_payload, load_payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload
from servesim.sweep.pricing import cost_figures, shipped_prices

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
AGGREGATED = """\
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.parallelism]
replicas = 2
tensor = 2
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 2.0
[traffic.source]
type = "synthetic"
input_tokens = 64
output_tokens = 5
[traffic.load]
type = "concurrency"
concurrency = 2
[traffic.stop]
requests = 4
"""
DISAGG = """\
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.prefill.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 0.0
[engine.workers.decode]
hardware = "h200_sxm"
[engine.workers.decode.parallelism]
tensor = 2
replicas = 3
[engine.workers.decode.timing]
type = "fixed"
prefill_ms = 0.0
decode_ms = 2.0
[traffic.source]
type = "synthetic"
input_tokens = 64
output_tokens = 5
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
requests = 3
"""


def compiled(text: str) -> Payload:
    return compile_text(text, name="c.toml", registry=REGISTRY)


def errors(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compiled(text)
    return [d.render() for d in info.value.diagnostics]


# -- the config key ---------------------------------------------------------------------------


def test_without_a_config_price_each_gpu_has_the_catalog_s() -> None:
    payload = compiled(DISAGG)
    assert payload.gpu_hour_usd == {
        "h100_sxm": GpuPriceArgs(shipped_prices()["h100_sxm"], "catalog"),
        "h200_sxm": GpuPriceArgs(shipped_prices()["h200_sxm"], "catalog")}


def test_one_number_prices_every_gpu_of_the_deployment() -> None:
    payload = compiled(DISAGG + "[evaluation]\ngpu_hour_usd = 2.5\n")
    assert payload.gpu_hour_usd == {"h100_sxm": GpuPriceArgs(2.5, "config"),
                                    "h200_sxm": GpuPriceArgs(2.5, "config")}


def test_a_table_prices_the_gpus_it_names_and_the_catalog_the_others() -> None:
    # a price for a GPU the deployment does not use is fine: a sweep may switch to it
    payload = compiled(DISAGG + "[evaluation.gpu_hour_usd]\nh200_sxm = 3.5\nb200_sxm = 9\n")
    assert payload.gpu_hour_usd == {
        "h100_sxm": GpuPriceArgs(shipped_prices()["h100_sxm"], "catalog"),
        "h200_sxm": GpuPriceArgs(3.5, "config")}


@pytest.mark.parametrize(("value", "expected"), [
    ("-1", "evaluation.gpu_hour_usd: must be in (0, 1000000], got -1 [out-of-range]"),
    ("0", "evaluation.gpu_hour_usd: must be in (0, 1000000], got 0 [out-of-range]"),
    ("1e7", "evaluation.gpu_hour_usd: must be in (0, 1000000], got 10000000 [out-of-range]"),
    ("nan", "evaluation.gpu_hour_usd: expected a finite number, got nan [not-finite]"),
    ('"3"', "evaluation.gpu_hour_usd: expected a number or a table of numbers, got string "
     "'3' [wrong-type]"),
    ("true", "evaluation.gpu_hour_usd: expected a number or a table of numbers, got boolean "
     "true [wrong-type]"),
    ("[1]", "evaluation.gpu_hour_usd: expected a number or a table of numbers, got an array "
     "[wrong-type]"),
    ("{ h200_sxm = -2 }", "evaluation.gpu_hour_usd.h200_sxm: must be in (0, 1000000], got -2 "
     "[out-of-range]"),
    ("{ h200_sxm = inf }", "evaluation.gpu_hour_usd.h200_sxm: expected a finite number, got "
     "inf [not-finite]"),
    ('{ h200_sxm = "x" }', "evaluation.gpu_hour_usd.h200_sxm: expected a number, got string "
     "'x' [wrong-type]"),
], ids=["negative", "zero", "huge", "nan", "string", "bool", "array", "table-negative",
        "table-inf", "table-string"])
def test_a_bad_price_names_its_config_path(value: str, expected: str) -> None:
    assert errors(AGGREGATED + f"[evaluation]\ngpu_hour_usd = {value}\n") == [expected]


def test_a_price_for_an_unknown_gpu_lists_the_catalog() -> None:
    assert errors(AGGREGATED + "[evaluation.gpu_hour_usd]\nh900 = 2.0\n") == [
        "evaluation.gpu_hour_usd.h900: no catalog GPU is named 'h900' [unknown-hardware]\n"
        "  hint: price one of: a100_sxm, b200_sxm, b300_sxm, gb200, gb300, h100_sxm, "
        "h200_sxm, l40s; or give one number for every GPU (gpu_hour_usd = 2.5)"]


# -- the payload's prices -------------------------------------------------------------------


def _payload_data(text: str) -> dict[str, object]:
    data: dict[str, object] = json.loads(dump_payload(compiled(text)))
    return data


def test_a_payload_s_prices_are_checked_with_the_config_s_paths() -> None:
    engine = REGISTRY.get("vllm")
    assert engine is not None
    data = _payload_data(AGGREGATED)
    data["gpu_hour_usd"] = {"h200_sxm": {"usd_per_hour": -3.0, "source": "config"},
                            "b200_sxm": {"usd_per_hour": 5.0, "source": "catalog"}}
    diags = engine.validate_payload(load_payload(data))
    assert [d.render() for d in diags] == [
        "evaluation.gpu_hour_usd.h200_sxm: must be in (0, 1000000], got -3 [out-of-range]",
        "evaluation.gpu_hour_usd.b200_sxm: no role runs on 'b200_sxm' (the roles run on "
        "h200_sxm) [unused-price]\n  hint: price the hardware of the roles, or remove it"]
    data["gpu_hour_usd"] = {"h200_sxm": {"usd_per_hour": 3.0, "source": "spot"}}
    with pytest.raises(PayloadError, match="gpu_hour_usd"):
        load_payload(data)


def test_a_payload_without_prices_replays_with_unknown_costs() -> None:
    payload = attrs.evolve(compiled(AGGREGATED), gpu_hour_usd={})
    report = replay_payload(payload, registry=REGISTRY).report
    assert report["usd_per_hour"] is None and report["gpu_hours_cost_usd"] is None
    assert report["usd_per_million_output_tokens"] is None
    assert report["gpu_prices"] == {"aggregated": {"hardware": "h200_sxm", "gpus": 4,
                                                   "usd_per_gpu_hour": None, "source": None}}
    assert report["output_tok_s_per_gpu"] == report["output_throughput_tok_s"] / 4


# -- the report ----------------------------------------------------------------------------


def test_aggregated_figures_per_gpu_per_replica_and_cost() -> None:
    report = replay_payload(compiled(AGGREGATED + "[evaluation]\ngpu_hour_usd = 3.0\n"),
                            registry=REGISTRY).report
    rate = report["output_throughput_tok_s"]
    assert rate > 0 and report["gpus"] == 4
    assert report["output_tok_s_per_gpu"] == rate / 4
    assert report["output_tok_s_per_replica"] == rate / 2
    assert report["usd_per_hour"] == 12.0
    assert report["usd_per_million_output_tokens"] == pytest.approx(12.0 / (rate * 3600 / 1e6))
    assert report["gpu_hours_cost_usd"] == pytest.approx(report["gpu_hours"] * 3.0)
    assert report["gpu_prices"] == {"aggregated": {"hardware": "h200_sxm", "gpus": 4,
                                                   "usd_per_gpu_hour": 3.0,
                                                   "source": "config"}}


def test_each_p_d_role_is_priced_by_its_own_hardware() -> None:
    text = DISAGG + "[evaluation.gpu_hour_usd]\nh100_sxm = 2.0\n"
    report = replay_payload(compiled(text), registry=REGISTRY).report
    h200 = shipped_prices()["h200_sxm"]
    # 1 prefill GPU (h100_sxm, the config's price), 3 x TP2 decode GPUs (h200_sxm, catalog)
    assert report["gpus"] == 7
    assert report["usd_per_hour"] == pytest.approx(1 * 2.0 + 6 * h200)
    assert report["output_tok_s_per_replica"] == report["output_throughput_tok_s"] / 3
    assert report["gpu_hours_cost_usd"] == pytest.approx(
        (report["prefill_worker_seconds"] * 2.0 + report["decode_worker_seconds"] * 2 * h200)
        / 3600)
    assert report["gpu_prices"] == {
        "prefill": {"hardware": "h100_sxm", "gpus": 1, "usd_per_gpu_hour": 2.0,
                    "source": "config"},
        "decode": {"hardware": "h200_sxm", "gpus": 6, "usd_per_gpu_hour": h200,
                   "source": "catalog"}}


def test_cost_figures_without_output_or_gpu_seconds() -> None:
    payload = compiled(AGGREGATED)
    figures = cost_figures(payload.roles, payload.gpu_hour_usd, 0.0, {})
    assert figures["output_tok_s_per_gpu"] == 0.0
    assert figures["usd_per_million_output_tokens"] is None  # nothing was produced
    assert figures["gpu_hours_cost_usd"] is None  # the engine reported no GPU time
    assert figures["usd_per_hour"] == 4 * shipped_prices()["h200_sxm"]


def test_the_summary_shows_per_gpu_figures_each_role_s_price_and_the_costs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    config = tmp_path / "c.toml"
    config.write_text(DISAGG + "[evaluation.gpu_hour_usd]\nh100_sxm = 2.0\n", encoding="utf-8")
    assert main(["replay", str(config), "--quiet", "-o", str(tmp_path / "r.json")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    report = json.loads((tmp_path / "r.json").read_text())
    h200 = shipped_prices()["h200_sxm"]
    assert f"output tok/s per GPU {report['output_tok_s_per_gpu']:.1f} (7 GPUs)" in text
    assert "prefill GPUs 1 x h100_sxm, $2.00/GPU-hour (config price)" in text
    assert f"decode GPUs 6 x h200_sxm, ${h200:.2f}/GPU-hour (catalog price)" in text
    assert f"cost (USD/hour) {2.0 + 6 * h200:.2f}" in text
    assert f"cost per 1M output tokens (USD) " \
        f"{report['usd_per_million_output_tokens']:.3f}" in text


def test_inspect_shows_each_price_and_where_it_came_from(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    config = tmp_path / "c.toml"
    config.write_text(DISAGG + "[evaluation.gpu_hour_usd]\nh100_sxm = 2.0\n", encoding="utf-8")
    assert main(["inspect", str(config)]) == 0
    out = capsys.readouterr().out
    assert "evaluation.gpu_hour_usd (USD per GPU-hour)" in out
    assert "h100_sxm = 2.0  (authored)" in out
    assert f"h200_sxm = {shipped_prices()['h200_sxm']}  (defaulted: the catalog's indicative " \
        "price)" in out
    assert main(["inspect", str(config), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu_hour_usd"]["h100_sxm"] == {"usd_per_hour": 2.0, "source": "config"}
