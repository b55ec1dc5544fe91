"""`servesim replay` of disaggregated configs: the example configs end to end, the per-role
report keys, and a compiled payload replaying like its config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.compiler import compile_file
from servesim.payload import KvTransferArgs

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"


def _replay(config: Path, out: Path, *extra: str) -> dict[str, object]:
    assert main(["replay", str(config), "-o", str(out), "--quiet", *extra]) == 0
    report: dict[str, object] = json.loads(out.read_text())
    return report


def test_llama70b_disagg_example_replays_with_per_role_figures(tmp_path: Path) -> None:
    requests = tmp_path / "requests.jsonl"
    r = _replay(EXAMPLES / "llama70b_disagg.toml", tmp_path / "report.json",
                "--requests-out", str(requests))
    assert r["completed_requests"] == r["num_requests"] == 100
    assert r["total_output_tokens"] == 100 * 256
    # Fixed timing: 120 ms prefill on a TP4 H100 worker, 4096 tokens x 81920 B (the prefill
    # role's auto bytes/token) over 25 GB/s = 13.4217728 ms, then 25 ms per decode pass.
    transfer = 4096 * 81920 / 25.0 / 1e6
    assert r["kv_transfers"] == 100
    assert r["mean_kv_transfer_ms"] == pytest.approx(transfer, rel=1e-12)
    assert r["min_ttft_ms"] == pytest.approx(120.0 + transfer + 25.0, rel=1e-12)
    assert r["mean_tpot_ms"] == pytest.approx(25.0, rel=1e-12)
    assert r["max_tpot_ms"] == pytest.approx(25.0, rel=1e-12)
    # Every worker is provisioned for the whole run: 2 prefill workers, 1 decode worker.
    duration_s = float(r["duration_ms"]) / 1000.0  # type: ignore[arg-type]
    assert r["prefill_worker_seconds"] == 2 * duration_s
    assert r["decode_worker_seconds"] == duration_s
    p_s, d_s = 2 * duration_s, duration_s
    assert r["gpu_hours"] == pytest.approx((p_s * 4 + d_s * 8) / 3600, rel=1e-12)
    lines = [json.loads(line) for line in requests.read_text().splitlines()]
    assert sorted({line["prefill_worker_idx"] for line in lines}) == [0, 1]
    assert {line["decode_worker_idx"] for line in lines} == {0}


def test_sessions_example_reuses_resident_prefixes_on_the_decode_side(tmp_path: Path) -> None:
    r = _replay(EXAMPLES / "qwen3_32b_disagg_sessions.toml", tmp_path / "report.json")
    assert r["completed_requests"] == r["num_requests"] == 60 * 4
    assert r["kv_transfers"] == 240
    # destination_missing: later turns and shared group prefixes find KV already resident,
    # so the mean transfer is below what the mean full prompt would take over 50 GB/s.
    prompt_tokens = float(r["total_input_tokens"]) / 240  # type: ignore[arg-type]
    # Qwen3-32B at TP2, bf16: 64 layers x 4 KV heads x 128 x (K, V) x 2 bytes.
    assert compile_file(EXAMPLES / "qwen3_32b_disagg_sessions.toml").kv_transfer == (
        KvTransferArgs(bytes_per_token=131072, bandwidth_gb_per_second=50.0,
                       timing_mode="destination_missing", state_bytes=0))
    full = prompt_tokens * 131072 / 50.0 / 1e6
    assert 0 < float(r["mean_kv_transfer_ms"]) < full  # type: ignore[arg-type]
    assert float(r["prefix_cache_reused_ratio"]) > 0  # type: ignore[arg-type]
    assert "goodput_completed_requests" in r
    decode_s = float(r["decode_worker_seconds"])  # type: ignore[arg-type]
    assert r["prefill_worker_seconds"] == pytest.approx(3 * decode_s, rel=1e-12)


def test_compiled_disagg_payload_replays_like_its_config(tmp_path: Path) -> None:
    config = EXAMPLES / "llama70b_disagg.toml"
    payload = tmp_path / "payload.json"
    assert main(["compile", str(config), "-o", str(payload)]) == 0
    a = _replay(config, tmp_path / "a.json")
    b = _replay(payload, tmp_path / "b.json")
    assert a == b


def test_requests_out_splits_every_ttft_and_the_summary_shows_the_handoff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    requests = tmp_path / "requests.jsonl"
    assert main(["replay", str(EXAMPLES / "llama70b_disagg.toml"), "--quiet",
                 "--requests-out", str(requests), "-o", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    parts = ("prefill_queue", "prefill", "kv_transfer", "decode_queue", "first_decode")
    transfer = 4096 * 81920 / 25.0 / 1e6
    for line in map(json.loads, requests.read_text().splitlines()):
        values = [line[f"ttft_{part}_ms"] for part in parts]
        assert sum(values) == line["ttft_ms"]
        assert line["ttft_prefill_ms"] == pytest.approx(120.0, rel=1e-12)
        assert line["ttft_first_decode_ms"] == pytest.approx(25.0, rel=1e-12)
        assert line["ttft_kv_transfer_ms"] == pytest.approx(transfer, rel=1e-12)
        assert line["kv_transfer_end_ms"] - line["kv_transfer_start_ms"] == pytest.approx(
            transfer, rel=1e-12)
        assert 0.0 <= line["ttft_decode_queue_ms"] < 25.0  # the decode pass in flight
    assert report["mean_ttft_prefill_ms"] == pytest.approx(120.0, rel=1e-12)
    assert report["p99_ttft_first_decode_ms"] == pytest.approx(25.0, rel=1e-12)
    assert f"KV transfers {report['kv_transfers']} (mean {transfer:.2f} ms on the link)" in \
        " ".join(out.split())
    assert "rejected requests 0" in " ".join(out.split())
    assert "TTFT breakdown (ms)" in out
    row = next(line for line in out.splitlines() if "decode queue" in line)
    assert f"{report['mean_ttft_decode_queue_ms']:.2f}" in row
