"""Serving measurements a user calibrates against, read from the files benchmarks write.

Three formats, told apart by their content:

- ``silicon-csv``: a CSV in the columns of servesim's calibration data
  (``bench/data/silicon_dev.csv``): one measured point per row, ``isl``, ``osl``,
  ``silicon_ttft_ms``, ``silicon_tpot_ms`` and the concurrency (``silicon_concurrency=N``
  in ``silicon_data_source``, or ``batch_size`` x ``attention_dp_size``);
- ``vllm-bench-serve``: the result JSON of ``vllm bench serve`` / ``benchmark_serving.py
  --save-result`` (``mean_ttft_ms``, ``mean_tpot_ms``, ``completed``,
  ``total_input_tokens``, ``total_output_tokens``, ``max_concurrency`` or
  ``request_rate``);
- ``profile-export``: the aggregated export of AIPerf (``profile_export_aiperf.json``) or
  GenAI-Perf (``profile_export_genai_perf.json``): metrics as ``{"unit", "avg", ...}``
  objects (``time_to_first_token``, ``inter_token_latency``, ``input_sequence_length``,
  ``output_sequence_length``) and the load in ``input_config`` (AIPerf's ``loadgen``).

Each point is a mean over a benchmark at one load: ``concurrency`` clients in a closed
loop, or requests at ``request_rate`` per second. Every problem is a
:class:`~servesim.errors.WorkloadError` naming the file (and row) and what was expected.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim import codes
from servesim import limits as L
from servesim.errors import Diagnostic, WorkloadError

MAX_BYTES = 64 << 20  # a measurements file; bounds an endless device
MAX_LATENCY_MS = 1e9

EXPECTED = ("expected one of: a CSV in silicon_dev.csv's columns (id, isl, osl, "
            "silicon_ttft_ms, silicon_tpot_ms and batch_size or silicon_concurrency=N in "
            "silicon_data_source); a vllm bench serve result JSON (mean_ttft_ms, "
            "mean_tpot_ms, completed, total_input_tokens, total_output_tokens); an AIPerf or "
            "GenAI-Perf profile export JSON (time_to_first_token, inter_token_latency, "
            "input_sequence_length, output_sequence_length, input_config)")

# Deployment columns of the CSV: kept to tell the user when a point's recorded deployment
# is not the config's (the replay runs the config's).
DEPLOYMENT_COLUMNS = ("model_path", "system", "backend", "mode", "tp_size", "pp_size",
                      "attention_dp_size", "moe_tp_size", "moe_ep_size", "gemm_quant_mode",
                      "moe_quant_mode")


@attrs.frozen
class MeasuredPoint:
    """One measured benchmark: its load, mean prompt and output lengths, mean latencies."""

    label: str  # where it comes from: file name, and row id or line
    format: str
    input_tokens: int
    output_tokens: int
    ttft_ms: float
    tpot_ms: float | None  # None: one output token per request, no TPOT
    concurrency: int | None = None
    request_rate: float | None = None  # requests per second (None with a concurrency)
    requests: int | None = None  # requests the benchmark completed, when recorded
    deployment: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class MeasurementFile:
    path: str
    format: str
    sha256: str
    points: tuple[MeasuredPoint, ...]


def read_measurements(path: Path) -> MeasurementFile:
    """The measured points of one file, its format detected from its content."""
    raw = _read(path)
    digest = hashlib.sha256(raw).hexdigest()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise _error(str(path), f"not a text file (byte {exc.start} is not UTF-8); "
                     + EXPECTED) from None
    if not text.strip():
        raise _error(str(path), "the file is empty; " + EXPECTED)
    if text.lstrip()[:1] in "{[":
        fmt, points = _read_json(path, text)
    else:
        fmt, points = "silicon-csv", _read_csv(path, text)
    if not points:
        raise _error(str(path), "holds no measured point; " + EXPECTED)
    return MeasurementFile(path=str(path), format=fmt, sha256=digest, points=tuple(points))


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise _error(str(path), "file not found", code=codes.FILE_NOT_FOUND) from None
    except IsADirectoryError:
        raise _error(str(path), "is a directory, expected a measurements file",
                     code=codes.FILE_UNREADABLE) from None
    except OSError as exc:
        raise _error(str(path), f"cannot read: {exc.strerror or exc}",
                     code=codes.FILE_UNREADABLE) from None
    if len(raw) > MAX_BYTES:
        raise _error(str(path), f"file is over {MAX_BYTES} bytes, the most a measurements "
                     "file may be", code=codes.FILE_TOO_LARGE)
    return raw


def _error(location: str, message: str, code: str = codes.MEASUREMENT_INVALID,
           hint: str | None = None) -> WorkloadError:
    return WorkloadError([Diagnostic(code=code, message=message, location=location,
                                     hint=hint)])


# ---------------------------------------------------------------------------------------
# numbers


def _number(value: Any, where: str, what: str, *, lo: float = 0.0, hi: float = 1e12,
            lo_open: bool = False) -> float:
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _error(where, f"{what} must be a number, got {value!r:.40}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(where, f"{what} must be a number, got {json.dumps(value)[:40]}")
    if not math.isfinite(value):
        raise _error(where, f"{what} must be a finite number, got {value}")
    if value < lo or (lo_open and value == lo) or value > hi:
        bound = f"> {lo:.10g}" if lo_open else f">= {lo:.10g}"
        raise _error(where, f"{what} must be {bound} and <= {hi:.10g}, got {value:.6g}")
    return float(value)


def _count(value: Any, where: str, what: str, hi: int) -> int:
    v = _number(value, where, what, lo=1, hi=hi)
    return max(1, round(v))


def _point(label: str, fmt: str, where: str, *, isl: Any, osl: Any, ttft: Any, tpot: Any,
           concurrency: Any = None, rate: Any = None, requests: Any = None,
           deployment: Mapping[str, str] | None = None) -> MeasuredPoint:
    input_tokens = _count(isl, where, "the mean prompt length", L.TOKENS)
    output_tokens = _count(osl, where, "the mean output length", L.TOKENS)
    ttft_ms = _number(ttft, where, "the mean TTFT (ms)", lo=0.0, hi=MAX_LATENCY_MS,
                      lo_open=True)
    tpot_ms = None
    if output_tokens > 1:
        tpot_ms = _number(tpot, where, "the mean TPOT (ms)", lo=0.0, hi=MAX_LATENCY_MS,
                          lo_open=True)
    c = _count(concurrency, where, "the concurrency", L.CONCURRENCY) \
        if concurrency is not None else None
    r = _number(rate, where, "the request rate (requests/s)", lo=0.0, hi=1e6, lo_open=True) \
        if rate is not None and c is None else None
    if c is None and r is None:
        raise _error(where, "records no load: neither a concurrency nor a request rate",
                     hint="benchmark at a fixed concurrency or request rate")
    n = _count(requests, where, "the number of requests", L.COUNT) \
        if requests is not None else None
    return MeasuredPoint(label=label, format=fmt, input_tokens=input_tokens,
                         output_tokens=output_tokens, ttft_ms=ttft_ms, tpot_ms=tpot_ms,
                         concurrency=c, request_rate=r, requests=n,
                         deployment=dict(deployment or {}))


# ---------------------------------------------------------------------------------------
# CSV in silicon_dev.csv's columns

CSV_REQUIRED = ("isl", "osl", "silicon_ttft_ms", "silicon_tpot_ms")


def _read_csv(path: Path, text: str) -> list[MeasuredPoint]:
    name = path.name
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except (StopIteration, csv.Error) as exc:
        raise _error(f"{path}:1", f"unreadable CSV header: {exc}; " + EXPECTED) from None
    header = [h.strip() for h in header]
    missing = [c for c in CSV_REQUIRED if c not in header]
    if missing:
        raise _error(f"{path}:1", f"not a measurements file: the CSV header lacks "
                     f"{', '.join(missing)}; " + EXPECTED)
    if "batch_size" not in header and "silicon_data_source" not in header:
        raise _error(f"{path}:1", "the CSV has neither batch_size nor silicon_data_source "
                     "(silicon_concurrency=N), so no row records its concurrency")
    points = []
    try:
        for line, values in _rows(reader):
            where = f"{path}:{line}"
            if len(values) != len(header):
                raise _error(where, f"row has {len(values)} fields, the header {len(header)}"
                             " (a truncated or malformed row)")
            row = dict(zip(header, values, strict=True))
            if row.get("mode", "agg") not in ("agg", ""):
                raise _error(where, f"mode {row['mode']!r:.20} is not replayed against one "
                             "deployment; calibrate on aggregated (agg) rows",
                             hint="remove the row, or calibrate each P/D pool from its own "
                             "measurements")
            label = f"{name}:{row.get('id') or line}"
            points.append(_point(
                label, "silicon-csv", where, isl=row["isl"], osl=row["osl"],
                ttft=row["silicon_ttft_ms"], tpot=row["silicon_tpot_ms"],
                concurrency=_csv_concurrency(row, where),
                deployment={k: row[k] for k in DEPLOYMENT_COLUMNS if row.get(k)}))
    except csv.Error as exc:
        raise _error(f"{path}:{reader.line_num}", f"malformed CSV: {exc}") from None
    return points


def _rows(reader: Any) -> Iterator[tuple[int, list[str]]]:
    for values in reader:
        if not values or not any(v.strip() for v in values):
            continue
        yield reader.line_num, values


def _csv_concurrency(row: Mapping[str, str], where: str) -> int:
    m = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source", ""))
    if m:
        return _count(m.group(1), where, "silicon_concurrency", L.CONCURRENCY)
    if not row.get("batch_size", "").strip():
        raise _error(where, "the row records no concurrency (batch_size is empty and "
                     "silicon_data_source has no silicon_concurrency=N)")
    batch = _count(row["batch_size"], where, "batch_size", L.CONCURRENCY)
    dp = row.get("attention_dp_size", "").strip()
    ranks = _count(dp, where, "attention_dp_size", L.PARALLEL) if dp else 1
    return batch * ranks


# ---------------------------------------------------------------------------------------
# JSON: vLLM bench serve results, AIPerf / GenAI-Perf profile exports


def _read_json(path: Path, text: str) -> tuple[str, list[MeasuredPoint]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _error(f"{path}:{exc.lineno}:{exc.colno}",
                     f"not valid JSON: {exc.msg}; " + EXPECTED) from None
    except (ValueError, RecursionError) as exc:
        raise _error(str(path), f"not valid JSON: {exc}") from None
    docs = data if isinstance(data, list) else [data]
    fmt = ""
    points = []
    for i, doc in enumerate(docs):
        where = f"{path}[{i}]" if isinstance(data, list) else str(path)
        label = f"{path.name}[{i}]" if isinstance(data, list) else path.name
        if not isinstance(doc, dict):
            raise _error(where, "a measurement must be a JSON object; " + EXPECTED)
        if "mean_ttft_ms" in doc:
            kind, point = "vllm-bench-serve", _vllm(doc, label, where)
        elif isinstance(doc.get("time_to_first_token"), dict):
            kind, point = "profile-export", _profile_export(doc, label, where)
        else:
            keys = ", ".join(sorted(map(str, doc))[:8])
            raise _error(where, f"unknown JSON measurement format (its keys: {keys:.200}); "
                         + EXPECTED)
        if fmt and kind != fmt:
            raise _error(where, f"mixes {kind} with {fmt} objects; give one format a file")
        fmt = kind
        points.append(point)
    return fmt or "json", points


def _vllm(doc: Mapping[str, Any], label: str, where: str) -> MeasuredPoint:
    for key in ("mean_ttft_ms", "mean_tpot_ms", "completed", "total_input_tokens",
                "total_output_tokens"):
        if key not in doc:
            raise _error(where, f"a vllm bench serve result without {key!r}",
                         hint="save the result with --save-result from a run that completed")
    completed = _count(doc["completed"], where, "completed (requests)", L.COUNT)
    concurrency = doc.get("max_concurrency")
    rate = doc.get("request_rate")
    if concurrency is None and rate in (None, "inf", float("inf")):
        concurrency = completed  # every request sent at once
    if rate in ("inf", float("inf")):
        rate = None
    isl = _number(doc["total_input_tokens"], where, "total_input_tokens", lo=1) / completed
    osl = _number(doc["total_output_tokens"], where, "total_output_tokens", lo=1) / completed
    deployment = {k: str(doc[k]) for k in ("model_id", "backend") if k in doc}
    return _point(label, "vllm-bench-serve", where, isl=isl, osl=osl,
                  ttft=doc["mean_ttft_ms"], tpot=doc["mean_tpot_ms"],
                  concurrency=concurrency, rate=rate, requests=completed,
                  deployment=deployment)


def _metric(doc: Mapping[str, Any], key: str, where: str, unit: str | None = None) -> Any:
    m = doc.get(key)
    if not isinstance(m, dict) or "avg" not in m:
        raise _error(where, f"a profile export without {key}.avg",
                     hint="export from a run that streamed its responses (--streaming)")
    if unit is not None and m.get("unit") not in (None, unit):
        raise _error(where, f"{key} is in {m.get('unit')!r:.20}, expected {unit!r}")
    return m["avg"]


def _profile_export(doc: Mapping[str, Any], label: str, where: str) -> MeasuredPoint:
    config = doc.get("input_config")
    if not isinstance(config, dict):
        raise _error(where, "a profile export without input_config (the load it ran)")
    loadgen = config.get("loadgen")
    if not isinstance(loadgen, dict):  # GenAI-Perf: the load at the top of input_config
        loadgen = config
    concurrency = loadgen.get("concurrency")
    rate = loadgen.get("request_rate")
    requests = None
    count = doc.get("request_count")
    if isinstance(count, dict):
        requests = count.get("avg")
    models = config.get("model_names") or (config.get("endpoint") or {}).get("model_names")
    deployment = {"model_path": str(models[0])} if isinstance(models, list) and models else {}
    return _point(label, "profile-export", where,
                  isl=_metric(doc, "input_sequence_length", where, "tokens"),
                  osl=_metric(doc, "output_sequence_length", where, "tokens"),
                  ttft=_metric(doc, "time_to_first_token", where, "ms"),
                  tpot=_metric(doc, "inter_token_latency", where, "ms"),
                  concurrency=concurrency, rate=rate, requests=requests,
                  deployment=deployment)
