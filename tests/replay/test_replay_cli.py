"""`servesim replay` end to end: config and payload inputs, outputs, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.cli import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"

SMALL = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.kv_cache]
block_size = 4
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 2.0
[traffic.source]
type = "trace"
paths = ["trace.jsonl"]
block_size = 16
[traffic.load]
type = "trace_timestamps"
"""


ONE_REQUEST = '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}'


def _write_trace(folder: Path, lines: list[str]) -> None:
    (folder / "trace.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "cfg.toml").write_text(SMALL, encoding="utf-8")


def test_replay_of_a_config_reports_every_request(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
        '{"timestamp": 1000, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
    ])
    report_path = tmp_path / "report.json"
    requests_path = tmp_path / "requests.jsonl"
    code = main(["replay", str(tmp_path / "cfg.toml"), "-o", str(report_path),
                 "--requests-out", str(requests_path), "--quiet"])
    assert code == 0
    report = json.loads(report_path.read_text())
    assert report["completed_requests"] == 2
    assert report["total_output_tokens"] == 6
    # the second request reuses 16 of the first one's 20 tokens: the recompute cap
    # floor((20 - 1) / 4) * 4 keeps the last complete block out of the hit
    assert report["prefix_cache_reused_ratio"] == 16 / 40
    # one pass of prefill + decode, then two decode passes: TTFT = P + D, E2E = P + 3D
    assert report["mean_ttft_ms"] == 12.0
    assert report["mean_e2e_latency_ms"] == 16.0
    records = [json.loads(line) for line in requests_path.read_text().splitlines()]
    assert [r["output_length"] for r in records] == [3, 3]
    assert "wall_time_ms" not in report
    assert "request_throughput" in capsys.readouterr().out


def test_an_output_path_that_cannot_be_written_is_refused_before_the_replay(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_trace(tmp_path, [ONE_REQUEST])
    for flag in ("-o", "--requests-out"):
        code = main(["replay", str(tmp_path / "cfg.toml"), flag, str(tmp_path), "--quiet"])
        out, err = capsys.readouterr()
        assert (code, out) == (1, "")  # nothing replayed
        assert f"error: {flag} {tmp_path}: cannot write this file: it is a folder" in err


def test_a_report_that_cannot_be_written_goes_to_stdout(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    _write_trace(tmp_path, [ONE_REQUEST])

    def disk_full(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("os.replace", disk_full)
    report = tmp_path / "report.json"
    code = main(["replay", str(tmp_path / "cfg.toml"), "-o", str(report), "--quiet"])
    out, err = capsys.readouterr()
    assert code == 1
    assert json.loads(out)["completed_requests"] == 1  # the finished replay is not lost
    assert "cannot write this file: No space left on device [output-path]" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.toml", "trace.jsonl"]


def test_compiled_payload_and_config_give_the_same_report(tmp_path: Path) -> None:
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
    ])
    payload_dir = tmp_path / "out"
    assert main(["compile", str(tmp_path / "cfg.toml"), "-o",
                 str(payload_dir / "payload.json")]) == 0
    assert json.loads((payload_dir / "payload.json").read_text())["workload"]["source"][
        "path"] == "../trace.jsonl"
    assert main(["replay", str(tmp_path / "cfg.toml"), "-o", str(tmp_path / "a.json"),
                 "--quiet"]) == 0
    assert main(["replay", str(payload_dir / "payload.json"), "-o", str(tmp_path / "b.json"),
                 "--quiet"]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()


def test_reports_are_byte_identical_across_processes(tmp_path: Path) -> None:
    config = EXAMPLES / "mooncake_trace.toml"
    outputs = []
    for name in ("one.json", "two.json"):
        subprocess.run([sys.executable, "-m", "servesim", "replay", str(config), "-o",
                        str(tmp_path / name), "--quiet"], check=True, capture_output=True)
        outputs.append((tmp_path / name).read_bytes())
    assert outputs[0] == outputs[1]
    report = json.loads(outputs[0])
    assert len(report["trace_sha256"]) == 64 and len(report["payload_sha256"]) == 64


def test_a_malformed_trace_line_names_file_and_line_and_writes_no_report(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
        '{"timestamp": 5, "input_length": 20, "output_length": 3, "hash_ids": [1, 2',
    ])
    report_path = tmp_path / "report.json"
    code = main(["replay", str(tmp_path / "cfg.toml"), "-o", str(report_path), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err
    assert "trace.jsonl:2" in err
    assert "Traceback" not in err
    assert not report_path.exists()


def test_default_timing_is_refused_with_a_clear_message(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "cfg.toml"
    config.write_text('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
                      "[engine.workers.aggregated]\n[traffic.stop]\nrequests = 2\n")
    code = main(["replay", str(config), "--quiet"])
    err = capsys.readouterr().err
    if code == 0:  # the analytical model is available: the replay must have run
        return
    assert code == 1
    assert "engine.workers.aggregated.timing.type" in err


def test_a_hand_written_payload_is_checked_with_the_shared_rules(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
    ])
    payload_path = tmp_path / "payload.json"
    assert main(["compile", str(tmp_path / "cfg.toml"), "-o", str(payload_path)]) == 0
    data = json.loads(payload_path.read_text())
    data["roles"]["aggregated"]["block_size"] = 1
    data["roles"]["aggregated"]["prefill_decode_interval"] = 2
    payload_path.write_text(json.dumps(data))
    assert main(["replay", str(payload_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert ("engine.workers.aggregated.kv_cache.block_size: vLLM/TRT-LLM require "
            "block_size >= 2, got 1 [block-size-too-small]") in err
    assert "prefill_decode_interval is supported only for backend=sglang" in err


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d.update(schema_version=99), "unsupported payload schema_version 99"),
    (lambda d: d["roles"]["aggregated"].update(block_sise=4), "unknown key 'block_sise'"),
    (lambda d: d["roles"]["aggregated"].pop("worker_type"), "required key 'worker_type'"),
    (lambda d: d["roles"]["aggregated"].update(num_gpu_blocks="many"), "expected an integer"),
    (lambda d: d.update(workload=None), "workload: expected a table, got NoneType [wrong-type]"),
    (lambda d: d.update(roles=True), "roles: expected a table, got boolean true [wrong-type]"),
    (lambda d: d["workload"]["source"].update(blok_size=16),
     "traffic.source.blok_size: unknown key 'blok_size' (allowed here: type, path, format, "
     "block_size) [unknown-key]"),
    (lambda d: d["workload"]["load"].update(concurrency=4),
     "traffic.load.concurrency: unknown key 'concurrency' (allowed here: type, speedup) "
     "[unknown-key]"),
    (lambda d: d["workload"].update(stop={"requests": 0}),
     "traffic.stop.requests: must be in [1, 2^31], got 0 [out-of-range]"),
    (lambda d: d["roles"]["aggregated"]["timing"].update(path="x.csv"),
     "engine.workers.aggregated.timing.path: fixed timing rejects path [timing-table]"),
    (lambda d: d.update(sla={"ttft_ms": -5}),
     "evaluation.sla.ttft_ms: must be in (0, 1000000000000], got -5 [out-of-range]"),
])
def test_malformed_payloads_are_refused_by_name(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                edit: object, expected: str) -> None:
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
    ])
    payload_path = tmp_path / "payload.json"
    assert main(["compile", str(tmp_path / "cfg.toml"), "-o", str(payload_path)]) == 0
    data = json.loads(payload_path.read_text())
    edit(data)  # type: ignore[operator]
    payload_path.write_text(json.dumps(data))
    assert main(["replay", str(payload_path), "--quiet"]) == 1
    assert expected in capsys.readouterr().err


def test_ctrl_c_stops_cleanly_without_a_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import servesim.replay

    def interrupted(*args: object, progress: object = None, **kwargs: object) -> None:
        progress(1500.0)  # type: ignore[operator]
        raise KeyboardInterrupt

    monkeypatch.setattr(servesim.replay, "replay_payload", interrupted)
    _write_trace(tmp_path, [
        '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}',
    ])
    report_path = tmp_path / "report.json"
    code = main(["replay", str(tmp_path / "cfg.toml"), "-o", str(report_path), "--quiet"])
    assert code == 130
    assert capsys.readouterr().err == ("interrupted at virtual time 1.5 s, 0 of 1 requests done: "
                                       "no report written\n")
    assert not report_path.exists()
