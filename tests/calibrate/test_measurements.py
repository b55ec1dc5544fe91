"""Reading measured points: each accepted format, and a diagnostic per malformed input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.calibrate.measurements import MAX_BYTES, read_measurements
from servesim.errors import WorkloadError

DATA = Path(__file__).resolve().parent / "data"


def test_silicon_csv_rows_become_points_at_their_concurrency() -> None:
    f = read_measurements(DATA / "silicon_rows.csv")
    assert f.format == "silicon-csv"
    assert [p.concurrency for p in f.points] == [8, 32, 128]
    first = f.points[0]
    assert (first.input_tokens, first.output_tokens) == (1024, 128)
    assert first.ttft_ms == pytest.approx(154.2481599)
    assert first.tpot_ms == pytest.approx(18.0370482875)
    assert first.label.startswith("silicon_rows.csv:qwen_qwen3_32b")
    assert first.deployment["tp_size"] == "2"
    assert first.deployment["system"] == "h100_sxm"
    assert len(f.sha256) == 64


def test_vllm_bench_serve_result() -> None:
    f = read_measurements(DATA / "vllm_bench_serve.json")
    assert f.format == "vllm-bench-serve"
    (p,) = f.points
    assert (p.concurrency, p.request_rate, p.requests) == (16, None, 160)
    assert (p.input_tokens, p.output_tokens) == (1024, 128)  # totals over completed
    assert (p.ttft_ms, p.tpot_ms) == (187.94, 22.18)


def test_aiperf_profile_export() -> None:
    (p,) = read_measurements(DATA / "profile_export_aiperf.json").points
    assert (p.concurrency, p.requests, p.input_tokens, p.output_tokens) == (32, 192, 1024, 128)
    assert (p.ttft_ms, p.tpot_ms) == (250.47, 29.38)
    assert p.deployment == {"model_path": "Qwen/Qwen3-32B"}


def test_genai_perf_profile_export_at_a_request_rate() -> None:
    f = read_measurements(DATA / "profile_export_genai_perf.json")
    assert f.format == "profile-export"
    (p,) = f.points
    assert (p.concurrency, p.request_rate) == (None, 2.5)
    assert (p.input_tokens, p.ttft_ms, p.tpot_ms) == (4096, 412.3, 38.2)


def test_a_json_list_of_vllm_results_is_one_point_each(tmp_path: Path) -> None:
    doc = json.loads((DATA / "vllm_bench_serve.json").read_text())
    path = tmp_path / "runs.json"
    path.write_text(json.dumps([doc, {**doc, "max_concurrency": 64, "mean_ttft_ms": 400.0}]))
    points = read_measurements(path).points
    assert [p.concurrency for p in points] == [16, 64]
    assert points[1].label == "runs.json[1]"


def test_vllm_burst_without_concurrency_sends_every_request_at_once(tmp_path: Path) -> None:
    doc = json.loads((DATA / "vllm_bench_serve.json").read_text())
    doc["max_concurrency"] = None
    path = tmp_path / "burst.json"
    path.write_text(json.dumps(doc))
    (p,) = read_measurements(path).points
    assert (p.concurrency, p.request_rate) == (160, None)


def _vllm(**change: object) -> str:
    doc = json.loads((DATA / "vllm_bench_serve.json").read_text())
    for key, value in change.items():
        if value is None:
            doc.pop(key)
        else:
            doc[key] = value
    return json.dumps(doc)


def _csv(row: str, header: str | None = None) -> str:
    lines = (DATA / "silicon_rows.csv").read_text().splitlines()
    return (header or lines[0]) + "\n" + row + "\n"


ROW = (DATA / "silicon_rows.csv").read_text().splitlines()[1]
AIPERF = json.loads((DATA / "profile_export_aiperf.json").read_text())

MALFORMED = [
    ("empty", "", "the file is empty"),
    ("blank", "\n  \n", "the file is empty"),
    ("binary", b"\xff\xfe\x00garbage", "not a text file"),
    ("json syntax", '{"mean_ttft_ms": 1,', "not valid JSON"),
    ("unknown json", '{"hello": 1}', "unknown JSON measurement format"),
    ("json scalar list", "[1, 2]", "must be a JSON object"),
    ("csv other columns", "a,b,c\n1,2,3\n", "the CSV header lacks isl, osl"),
    ("csv no load column", "isl,osl,silicon_ttft_ms,silicon_tpot_ms\n1,2,3,4\n",
     "neither batch_size nor silicon_data_source"),
    ("csv truncated row", _csv(ROW.rsplit(",", 3)[0]), "a truncated or malformed row"),
    ("csv nan ttft", _csv(ROW.rsplit(",", 2)[0] + ",nan,18.0"), "must be a finite number"),
    ("csv negative tpot", _csv(ROW.rsplit(",", 1)[0] + ",-3"), "the mean TPOT (ms) must be >"),
    ("csv text isl", _csv(ROW.replace(",1024,128,", ",many,128,", 1)),
     "the mean prompt length must be a number"),
    ("csv huge concurrency", _csv(ROW.replace("silicon_concurrency=8", "silicon_concurrency="
                                              "99999999999")),
     "silicon_concurrency must be >= 1 and <= 1048576"),
    ("csv disagg row", _csv(ROW.replace(",agg,", ",disagg,", 1)), "calibrate on aggregated"),
    ("csv no concurrency", _csv(ROW.replace("silicon_concurrency=8", "x").replace(
        ",1024,128,,,8,", ",1024,128,,,,", 1)), "records no concurrency"),
    ("vllm missing ttft", _vllm(mean_ttft_ms=None), "unknown JSON measurement format"),
    ("vllm missing tpot", _vllm(mean_tpot_ms=None), "without 'mean_tpot_ms'"),
    ("vllm nothing completed", _vllm(completed=0), "completed (requests) must be >= 1"),
    ("vllm string ttft", _vllm(mean_ttft_ms="fast"), "the mean TTFT (ms) must be a number"),
    ("vllm bool concurrency", _vllm(max_concurrency=True), "the concurrency must be a number"),
    ("vllm huge ttft", _vllm(mean_ttft_ms=1e300), "the mean TTFT (ms) must be"),
    ("vllm mixed with export", json.dumps([json.loads(_vllm()), AIPERF]), "mixes"),
    ("export without config", json.dumps({k: v for k, v in AIPERF.items()
                                          if k != "input_config"}), "without input_config"),
    ("export without itl", json.dumps({k: v for k, v in AIPERF.items()
                                       if k != "inter_token_latency"}),
     "without inter_token_latency.avg"),
    ("export in seconds", json.dumps({**AIPERF, "time_to_first_token": {"unit": "s",
                                                                        "avg": 0.2}}),
     "time_to_first_token is in 's'"),
    ("export no load", json.dumps({**AIPERF, "input_config": {"loadgen": {}}}),
     "records no load"),
    ("export zero rate", json.dumps({**AIPERF, "input_config": {"request_rate": 0}}),
     "the request rate (requests/s) must be > 0"),
]


@pytest.mark.parametrize(("content", "message"), [(c, m) for _, c, m in MALFORMED],
                         ids=[name for name, _, _ in MALFORMED])
def test_every_malformed_input_gets_a_diagnostic(tmp_path: Path, content: str | bytes,
                                                 message: str) -> None:
    path = tmp_path / "m.txt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(WorkloadError) as info:
        read_measurements(path)
    (d,) = info.value.diagnostics
    assert message in d.message
    assert d.location is not None and d.location.startswith(str(path))


def test_unknown_format_names_what_was_expected(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text('{"latency": 3}')
    with pytest.raises(WorkloadError) as info:
        read_measurements(path)
    message = info.value.diagnostics[0].message
    for expected in ("silicon_dev.csv", "vllm bench serve", "AIPerf or GenAI-Perf"):
        assert expected in message


def test_missing_directory_and_oversized_files(tmp_path: Path) -> None:
    for path, code in ((tmp_path / "nope.csv", "file-not-found"),
                       (tmp_path, "file-unreadable")):
        with pytest.raises(WorkloadError) as info:
            read_measurements(path)
        assert info.value.diagnostics[0].code == code
    big = tmp_path / "big.csv"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    with pytest.raises(WorkloadError) as info:
        read_measurements(big)
    assert info.value.diagnostics[0].code == "file-too-large"


def test_a_single_output_token_has_no_tpot(tmp_path: Path) -> None:
    path = tmp_path / "one.json"
    path.write_text(_vllm(total_output_tokens=160, mean_tpot_ms=0))
    (p,) = read_measurements(path).points
    assert (p.output_tokens, p.tpot_ms) == (1, None)
