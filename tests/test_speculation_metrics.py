"""Metrics of a speculative-decoding replay: gaps between emissions, not tokens (a burst
is one emission, as vLLM's and AIPerf's benchmarks count streamed chunks), and the
acceptance statistics in the report and the summary."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.cli import main
from servesim.compiler import compile_text
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV, EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload
from servesim.testing import small_config

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
# MTP with two drafts always accepted: a step emits 3 tokens; fixed 10 ms prefill, 5 ms decode
SPECULATION = ('[engine.speculation]\nkind = "mtp"\nnum_speculative_tokens = 2\n'
               "acceptance_rates = [1.0, 1.0]\n")
CONFIG = small_config(requests=2, input_tokens=16, output_tokens=7, concurrency=1,
                      decode_ms=5.0, extra=SPECULATION)


def test_bursts_are_one_emission_and_acceptance_is_reported() -> None:
    payload = compile_text(CONFIG, name="c.toml", registry=REGISTRY)
    report = replay_payload(payload, registry=REGISTRY).report
    # each request: 3 tokens at 15 ms, 3 at 20 ms, the last at 25 ms (no draft left)
    assert report["total_output_tokens"] == 14
    assert report["median_itl_ms"] == report["min_itl_ms"] == 5.0  # not 0
    assert report["num_itl_samples"] == 4
    assert report["median_ttst_ms"] == 5.0
    assert report["mean_tpot_ms"] == pytest.approx(10.0 / 6)  # TPOT divides by tokens
    assert {k: v for k, v in report.items() if k.startswith("spec_decode_")} == {
        "spec_decode_num_drafts": 4, "spec_decode_draft_tokens": 8,
        "spec_decode_accepted_tokens": 8, "spec_decode_acceptance_rate": 100.0,
        "spec_decode_acceptance_length": 3.0,
        "spec_decode_per_position_acceptance_rates": [1.0, 1.0]}


def test_a_replay_without_speculation_has_no_acceptance_statistics() -> None:
    text = CONFIG.replace(SPECULATION, "")
    report = replay_payload(compile_text(text, name="c.toml", registry=REGISTRY),
                            registry=REGISTRY).report
    assert not any(k.startswith("spec_decode_") for k in report)


def test_the_summary_prints_the_acceptance_statistics(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    Path("c.toml").write_text(CONFIG, encoding="utf-8")
    assert main(["replay", "c.toml", "--quiet"]) == 0
    rows = [" ".join(line.replace("│", " ").split())
            for line in capsys.readouterr().out.splitlines()]
    assert "spec_decode_acceptance_length 3.000 tokens per step" in rows
    assert "spec_decode_acceptance_rate 100.0 %" in rows
    assert "spec_decode_per_position_acceptance_rates 1.000 1.000" in rows
    assert "itl_ms 5.00 5.00 5.00 5.00 5.00" in rows
