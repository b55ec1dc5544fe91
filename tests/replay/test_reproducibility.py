"""Byte-identical outputs across processes and hash seeds; Ctrl-C with --requests-out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.engines.kernel.requests import RequestRecord

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"


# P/D with string session ids, and seeded speculative bursts with a state cache
@pytest.mark.parametrize("example", ["qwen3_32b_disagg_sessions", "kimi_k3_speculation"])
def test_report_and_requests_are_byte_identical_across_processes_and_hash_seeds(
        example: str, tmp_path: Path) -> None:
    """String hashing (session ids, sets of names) is salted per process unless
    PYTHONHASHSEED is fixed: two processes with different seeds must still agree."""
    outputs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        report, requests = tmp_path / f"report-{seed}.json", tmp_path / f"req-{seed}.jsonl"
        subprocess.run([sys.executable, "-m", "servesim", "replay",
                        str(EXAMPLES / f"{example}.toml"), "-o", str(report),
                        "--requests-out", str(requests), "--quiet"],
                       check=True, capture_output=True, env=env)
        outputs.append((report.read_bytes(), requests.read_bytes()))
    assert outputs[0] == outputs[1]
    lines = outputs[0][1].decode().splitlines()
    assert len(lines) == json.loads(outputs[0][0])["num_requests"] > 0


def test_ctrl_c_keeps_only_complete_request_lines_and_no_report(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupt between two finished requests: the lines already written are whole
    JSON records, the report file is absent, and stderr says where the records are."""
    import servesim.replay

    added = []

    class Interrupted(servesim.replay.MetricsCollector):
        def add(self, record: RequestRecord) -> None:
            if len(added) == 3:
                raise KeyboardInterrupt
            added.append(record)
            super().add(record)

    monkeypatch.setattr(servesim.replay, "MetricsCollector", Interrupted)
    report, requests = tmp_path / "report.json", tmp_path / "requests.jsonl"
    code = main(["replay", str(EXAMPLES / "qwen3_32b_h200.toml"), "-o", str(report),
                 "--requests-out", str(requests), "--quiet"])
    assert code == 130
    err = capsys.readouterr().err
    assert "no report written; finished requests are in" in err and "Traceback" not in err
    assert not report.exists()
    assert not list(tmp_path.glob(".report.json.*"))  # no temporary file left behind
    records = [json.loads(line) for line in requests.read_text().splitlines()]
    assert [r["request_id"] for r in records] == [r.request_id for r in added]
    assert requests.read_text().endswith("\n")


def test_a_replay_collects_garbage_less_often_and_restores_the_thresholds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's thresholds are raised while the engine runs and restored after,
    also when the replay is interrupted."""
    import gc

    import servesim.replay

    seen = []

    class Interrupted(servesim.replay.MetricsCollector):
        def add(self, record: RequestRecord) -> None:
            seen.append(gc.get_threshold())
            raise KeyboardInterrupt

    before = gc.get_threshold()
    monkeypatch.setattr(servesim.replay, "MetricsCollector", Interrupted)
    code = main(["replay", str(EXAMPLES / "qwen3_32b_h200.toml"), "-o",
                 str(tmp_path / "report.json"), "--quiet"])
    assert code == 130
    assert seen and seen[0][0] > before[0]
    assert gc.get_threshold() == before
