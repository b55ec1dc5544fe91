"""``servesim sweep``: points, invalid points skipped, derived columns, result files,
determinism across workers, Ctrl-C."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from servesim.compiler.overrides import parse_override
from servesim.errors import CompileError
from servesim.sweep import trial
from servesim.sweep.metrics import column_name
from servesim.sweep.pricing import shipped_prices
from servesim.sweep.space import parse_settings, points

from .conftest import run

REPLICAS = "engine.workers.aggregated.parallelism.replicas"
TENSOR = "engine.workers.aggregated.parallelism.tensor"


def rows_of(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(Path(path).read_text())["rows"]
    return rows


def test_points_are_the_product_or_the_zip() -> None:
    fixed, axes = parse_settings(["a=1,2", "b=x,y", "c=5"])
    assert fixed == (parse_override("c=5"),)
    assert [tuple(v for _, v in p) for p in points(axes)] == \
        [(1, "x"), (1, "y"), (2, "x"), (2, "y")]
    assert [tuple(v for _, v in p) for p in points(axes, zipped=True)] == [(1, "x"), (2, "y")]
    with pytest.raises(CompileError, match="same number of values"):
        points(parse_settings(["a=1,2", "b=1,2,3"])[1], zipped=True)
    with pytest.raises(CompileError, match="swept twice"):
        parse_settings(["a=1,2", "a=3,4"])


def test_metric_names_read_as_constraints_are_written() -> None:
    assert column_name("ttft_ms.p99") == "p99_ttft_ms"
    assert column_name("tpot_ms.mean") == "mean_tpot_ms"
    assert column_name("goodput_rps_per_gpu") == "goodput_rps_per_gpu"


def test_a_sweep_replays_each_point_and_skips_invalid_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "sweep", "tiny.toml", "--set", f"{TENSOR}=1,3,2",
                         "--set", f"{REPLICAS}=2", "-o", "r.json", "-j", "1")
    assert code == 0
    rows = rows_of("r.json")
    assert [(r["point"], r[TENSOR], r["status"]) for r in rows] == \
        [(0, 1, "ok"), (1, 3, "invalid"), (2, 2, "ok")]
    assert "indivisible-heads" in rows[1]["error"] and rows[1]["gpus"] is None
    assert "point 1 (engine.workers.aggregated.parallelism.tensor=3) invalid" in err
    assert [r["gpus"] for r in rows if r["status"] == "ok"] == [2, 4]
    assert "wrote r.json (3 points)" in err and "TTFT p99" in out


def test_derived_columns_follow_from_the_report_and_the_prices(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "sweep", "tiny.toml", "--set", f"{TENSOR}=2",
                     "--set", "engine.hardware=h100_sxm,h200_sxm",
                     "--set", "evaluation.gpu_hour_usd.h200_sxm=10", "-o", "r.json")
    assert code == 0
    h100, h200 = rows_of("r.json")
    assert h100["usd_per_hour"] == pytest.approx(2 * shipped_prices()["h100_sxm"])
    assert h200["usd_per_hour"] == pytest.approx(20.0)  # the config's price wins
    for row in (h100, h200):
        assert row["gpus"] == 2
        assert row["output_tok_s_per_gpu"] == pytest.approx(row["output_throughput_tok_s"] / 2)
        assert row["goodput_rps_per_gpu"] == \
            pytest.approx(row["goodput_request_throughput_rps"] / 2)
        assert row["usd_per_million_output_tokens"] == pytest.approx(
            row["usd_per_hour"] / (row["output_throughput_tok_s"] * 3600 / 1e6))
        assert row["servesim_version"] and row["payload_sha256"]


def test_one_config_price_prices_every_point_s_gpus(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = run(capsys, "sweep", "tiny.toml", "--set", f"{TENSOR}=2",
                     "--set", "engine.hardware=h100_sxm,b200_sxm",
                     "--set", "evaluation.gpu_hour_usd=1.5", "-o", "r.json")
    assert code == 0
    assert [row["usd_per_hour"] for row in rows_of("r.json")] == [3.0, 3.0]


def test_every_catalog_gpu_has_a_shipped_price() -> None:
    from servesim.catalog import gpu_names

    assert set(shipped_prices()) == set(gpu_names())


def test_rows_are_the_same_whatever_the_number_of_workers(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = ["sweep", "tiny.toml", "--set", f"{REPLICAS}=1,2",
            "--set", "traffic.load.requests_per_second=2,20"]
    assert run(capsys, *args, "-o", "one.json", "-j", "1")[0] == 0
    assert run(capsys, *args, "-o", "two.json", "-j", "2")[0] == 0
    assert Path("one.json").read_bytes() == Path("two.json").read_bytes()
    assert len(rows_of("one.json")) == 4


def test_csv_and_parquet_hold_the_same_rows(capsys: pytest.CaptureFixture[str]) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    args = ["sweep", "tiny.toml", "--set", f"{TENSOR}=1,3", "-j", "1"]
    for name in ("r.json", "r.csv", "r.parquet"):
        assert run(capsys, *args, "-o", name)[0] == 0
    expected = rows_of("r.json")
    with open("r.csv", newline="") as f:
        from_csv = list(csv.DictReader(f))
    table = pq.read_table("r.parquet")
    from_parquet = table.to_pylist()
    meta = json.loads(table.schema.metadata[b"servesim"])
    assert meta["config_sha256"] == from_csv[0]["config_sha256"]
    for j, c, p in zip(expected, from_csv, from_parquet, strict=True):
        assert j["status"] == c["status"] == p["status"]
        if j["status"] == "ok":
            assert float(c["p99_ttft_ms"]) == pytest.approx(j["p99_ttft_ms"])
            assert p["p99_ttft_ms"] == pytest.approx(j["p99_ttft_ms"])


def test_parquet_without_pyarrow_says_what_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    code, _, err = run(capsys, "sweep", "tiny.toml", "--set", f"{TENSOR}=1,2", "-o", "r.parquet")
    assert code == 1 and "pip install 'servesim[parquet]'" in err
    assert not Path("r.parquet").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", f"{TENSOR}=1,2", "-o", "r.txt"], "name a .csv, .json or .parquet file"),
    (["--set", f"{TENSOR}=1,2", "-o", "link.csv"], "this run reads this file"),
    (["--set", f"{TENSOR}=1,2", "-o", "r.json", "-j", "0"], "from 1 to"),
    (["--set", f"{TENSOR}=1,,2", "-o", "r.json"], "empty value"),
    (["--set", f"{TENSOR}=1,2", "--set", f"{REPLICAS}=1,2,3", "--zip", "-o", "r.json"],
     "same number of values"),
    (["--set", f"{TENSOR}=3,5", "-o", "r.json"], "no point of the sweep could be replayed"),
])
def test_bad_sweeps_are_input_errors(capsys: pytest.CaptureFixture[str], argv: list[str],
                                     message: str) -> None:
    Path("link.csv").symlink_to("tiny.toml")
    code, _, err = run(capsys, "sweep", "tiny.toml", *argv)
    assert code == 1 and message in err and "Traceback" not in err
    assert Path("tiny.toml").read_text().startswith("[engine]")


def test_ctrl_c_keeps_the_finished_rows(capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    real = trial.run_trial

    def interrupted(base: Any, task: Any, *args: Any, **kw: Any) -> Any:
        if task[0] == 2:
            raise KeyboardInterrupt
        return real(base, task, *args, **kw)

    monkeypatch.setattr("servesim.sweep.executors.run_trial", interrupted)
    code, _, err = run(capsys, "sweep", "tiny.toml", "--set", f"{REPLICAS}=1,2,3,4",
                       "-o", "r.csv", "-j", "1")
    assert code == 130 and "interrupted: 2 of 4 points finished" in err
    with open("r.csv", newline="") as f:
        assert [r["point"] for r in csv.DictReader(f)] == ["0", "1"]


def test_an_output_naming_a_file_the_config_reads_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).resolve().parents[2] / "examples" / "traces" / "mooncake_small.jsonl"
    Path("trace.json").write_bytes(trace.read_bytes())
    Path("traced.toml").write_text(
        Path("tiny.toml").read_text().split("[traffic.source]")[0]
        + '[traffic.source]\ntype = "trace"\npaths = ["trace.json"]\nformat = "mooncake"\n'
        'block_size = 512\n[traffic.load]\ntype = "trace_timestamps"\n', encoding="utf-8")
    code, _, err = run(capsys, "sweep", "traced.toml", "--set", f"{REPLICAS}=1,2",
                       "-o", "trace.json")
    assert code == 1 and "this run reads this file" in err
    assert Path("trace.json").read_bytes() == trace.read_bytes()


def test_html_without_plotly_is_refused_before_the_sweep(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    code, _, err = run(capsys, "sweep", "tiny.toml", "--set", f"{REPLICAS}=1,2",
                       "-o", "r.json", "--html", "r.html")
    assert code == 1 and "pip install 'servesim[report]'" in err
    assert not Path("r.json").exists()


def test_the_trials_log_a_line_every_few_seconds_when_stderr_is_no_terminal() -> None:
    import io

    from rich.console import Console

    from servesim.progress import LOG_EVERY_S
    from servesim.sweep.progress import TrialProgress

    now = [0.0]
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False)
    with TrialProgress(console, 12, True, clock=lambda: now[0]) as bar:
        for _ in range(4):
            now[0] += LOG_EVERY_S / 2
            bar.advance()
    assert stream.getvalue().splitlines() == [
        "sweep: 2 of 12 points done (17%), 5 s elapsed, ETA 25 s",
        "sweep: 4 of 12 points done (33%), 10 s elapsed, ETA 20 s"]
    quiet = io.StringIO()
    with TrialProgress(Console(file=quiet), 12, False, clock=lambda: now[0]) as bar:
        now[0] += 2 * LOG_EVERY_S
        bar.advance()
    assert quiet.getvalue() == ""
