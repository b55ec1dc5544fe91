"""The measured-table timing provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.errors import ReplayError
from servesim.payload import RoleArgs, TimingArgs
from servesim.timing import make_timer
from servesim.timing.table import TableTimer

HEADER = "batch_size,prefill_tokens,kv_read_tokens,latency_ms\n"


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


GRID = (
    # decode: batch x kv
    "1,0,1000,10\n1,0,3000,14\n4,0,1000,12\n4,0,3000,20\n"
    # prefill: batch x new x prefix
    "1,512,0,30\n1,2048,0,90\n2,1024,0,60\n2,4096,0,200\n"
)


def test_exact_points_and_interpolation(tmp_path: Path) -> None:
    path = _write(tmp_path, "1,0,1000,10\n1,0,3000,14\n4,0,1000,12\n4,0,3000,20\n")
    t = TableTimer(path)
    assert t.decode_ms(1, 1000, 1000, 0) == 10
    assert t.decode_ms(4, 3000, 750, 0) == 20
    assert t.decode_ms(1, 2000, 2000, 0) == pytest.approx(12)  # midway along kv
    assert t.decode_ms(2, 1000, 500, 0) == pytest.approx(10 + 2 / 3)  # 1/3 of the way in batch
    assert t.decode_ms(0, 0, 0, 0) == 0.0


def test_prefill_grid(tmp_path: Path) -> None:
    body = "1,1024,0,50\n1,2048,0,90\n2,1024,0,70\n2,2048,0,130\n"
    t = TableTimer(_write(tmp_path, body))
    assert t.prefill_ms(1, 1024, 0) == 50
    assert t.prefill_ms(2, 1024, 0) == 130  # 2 x 1024 new tokens
    assert t.prefill_ms(1, 1536, 0) == pytest.approx(70)
    assert t.prefill_ms(1, 512, 512) == 0.0  # nothing new


def test_out_of_range_names_the_point_and_the_range(tmp_path: Path) -> None:
    t = TableTimer(_write(tmp_path, "1,0,1000,10\n1,0,3000,14\n4,0,1000,12\n4,0,3000,20\n"))
    with pytest.raises(ReplayError) as err:
        t.decode_ms(8, 2000, 250, 0)
    msg = err.value.diagnostics[0].message
    assert "decode pass at (batch_size=8, kv_read_tokens=2000)" in msg
    assert "batch_size 8 not in [1, 4]" in msg
    assert err.value.diagnostics[0].code == "timing-table-range"
    with pytest.raises(ReplayError, match="no prefill rows"):
        t.prefill_ms(1, 100, 0)


def test_bad_rows_are_located_file_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "1,0,1000,10\n1,0,abc,14\n")
    with pytest.raises(ReplayError) as err:
        TableTimer(path, display="t.csv")
    diag = err.value.diagnostics[0]
    assert diag.where == "t.csv:3"
    assert "kv_read_tokens 'abc' is not a number" in diag.message
    with pytest.raises(ReplayError, match=r"t\.csv:2: .*expected 4 fields"):
        TableTimer(_write(tmp_path, "1,0\n"), display="t.csv")
    with pytest.raises(ReplayError, match=r"t\.csv:1: header lacks column"):
        (tmp_path / "h.csv").write_text("batch,latency_ms\n1,2\n", encoding="utf-8")
        TableTimer(tmp_path / "h.csv", display="t.csv")
    with pytest.raises(ReplayError, match="duplicate point"):
        TableTimer(_write(tmp_path, "1,0,1000,10\n1,0,1000,11\n"))
    with pytest.raises(ReplayError, match="must be a finite number >= 0"):
        TableTimer(_write(tmp_path, "1,0,1000,-1\n"))
    with pytest.raises(ReplayError, match=r"t\.csv:2: latency_ms must be at most 1e\+09 .*1e300"):
        TableTimer(_write(tmp_path, "1,0,1000,1e300\n"), display="t.csv")


def test_incomplete_grid_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ReplayError, match=r"no row for \(batch_size=4, kv_read_tokens=3000\)"):
        TableTimer(_write(tmp_path, "1,0,1000,10\n1,0,3000,14\n4,0,1000,12\n"))


def test_registered_as_table_timing(tmp_path: Path) -> None:
    path = _write(tmp_path, "1,0,1000,10\n")
    role = RoleArgs(worker_type="decode", backend="vllm", model="m", hardware="g",
                    timing=TimingArgs(type="table", path=str(path)))
    timer = make_timer(role)
    assert timer.decode_ms(1, 1000, 1000, 0) == 10
    missing = RoleArgs(worker_type="decode", backend="vllm", model="m", hardware="g",
                       timing=TimingArgs(type="table"))
    with pytest.raises(ReplayError, match="table timing requires path"):
        make_timer(missing)
