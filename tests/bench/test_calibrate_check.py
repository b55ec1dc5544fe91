"""bench/calibrate_check.py runs end to end on one small partition (the script replays
through bench/calib.py, whose interface it must keep up with)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import calibrate_check


def test_one_partition_prints_its_errors_and_the_target_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", [
        "calibrate_check.py", "--partition", "zhipuai/GLM-5", "--holdout", "2",
        "--max-tokens", "40000"])
    assert calibrate_check.main() == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("b200_sxm / sglang / zhipuai/GLM-5"))
    assert line.split()[6] == "2"  # rows held out
    assert "TTFT after   over  1 partitions" in out
    assert "target (median partition, held-out rows)" in out
