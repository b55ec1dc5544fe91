"""The HTML page: plotly figures written with plotly.js inline, so the file opens with no
network.

For results (a sweep or a search): the Pareto front of output throughput per GPU against
throughput per user (1000 / median TPOT), every valid point behind it, the latency
percentiles of each point, and the table of points. For one replay (its report and the
per-request lines of ``--requests-out``): output throughput, queued and running requests
and the tokens the running requests hold in KV cache over virtual time, and the TTFT and
per-request TPOT distributions.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesim.extras import require
from servesim.report.series import Span, histogram, series
from servesim.sweep.metrics import finite
from servesim.sweep.results import write_atomic

PERCENTILES = ("median", "p90", "p99")


def import_plotly() -> Any:
    return require("plotly.graph_objects", "report", "the HTML report", "servesim report")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both maximised), by x."""
    order = sorted(range(len(points)), key=lambda i: (-points[i][0], -points[i][1]))
    front, best_y = [], float("-inf")
    for i in order:
        if points[i][1] > best_y:
            front.append(i)
            best_y = points[i][1]
    return sorted(front, key=lambda i: points[i][0])


def label(row: Mapping[str, Any], params: Sequence[str]) -> str:
    return ", ".join(f"{p.rpartition('.')[2]}={row.get(p)}" for p in params) or \
        f"point {row.get('point')}"


def results_figures(rows: Sequence[Mapping[str, Any]], params: Sequence[str]) -> list[Any]:
    go = import_plotly()
    ok = [r for r in rows if r.get("status") == "ok" and finite(r.get("median_tpot_ms"))
          and finite(r.get("output_tok_s_per_gpu")) is not None]
    xy = [(1000.0 / float(r["median_tpot_ms"]), float(r["output_tok_s_per_gpu"])) for r in ok]
    names = [label(r, params) for r in ok]
    front = pareto_front(xy)
    pareto = go.Figure()
    pareto.add_scatter(x=[p[0] for p in xy], y=[p[1] for p in xy], mode="markers",
                       text=names, name="points", marker={"color": "#9aa5b1", "size": 9})
    pareto.add_scatter(x=[xy[i][0] for i in front], y=[xy[i][1] for i in front],
                       mode="lines+markers", text=[names[i] for i in front],
                       name="Pareto front", marker={"color": "#d62728", "size": 11})
    pareto.update_layout(title="Pareto front: throughput per GPU vs. speed per user",
                         xaxis_title="output tokens/s per user (1000 / median TPOT ms)",
                         yaxis_title="output tokens/s per GPU")
    latency = go.Figure()
    for metric in ("ttft_ms", "tpot_ms"):
        for stat in PERCENTILES:
            latency.add_bar(x=names, y=[r.get(f"{stat}_{metric}") for r in ok],
                            name=f"{metric.split('_')[0].upper()} {stat}",
                            yaxis="y" if metric == "ttft_ms" else "y2",
                            offsetgroup=stat)
    latency.update_layout(title="Latency percentiles per point", barmode="group",
                          yaxis={"title": "TTFT ms", "domain": [0.55, 1]},
                          yaxis2={"title": "TPOT ms", "domain": [0, 0.45], "anchor": "x"})
    return [pareto, latency]


def replay_figures(spans: Sequence[Span]) -> list[Any]:
    go = import_plotly()
    data = series(list(spans))
    fig = go.Figure()
    fig.add_scatter(x=data.seconds, y=data.output_tok_s, name="output tok/s")
    fig.add_scatter(x=data.seconds, y=data.queued, name="queued requests", yaxis="y2")
    fig.add_scatter(x=data.seconds, y=data.running, name="running requests", yaxis="y2")
    fig.add_scatter(x=data.seconds, y=data.kv_tokens, yaxis="y3",
                    name="tokens in KV cache (running requests)")
    fig.update_layout(title="Over virtual time",
                      xaxis={"title": "virtual time (s)", "anchor": "y3"},
                      yaxis={"title": "output tok/s", "domain": [0.68, 1]},
                      yaxis2={"title": "requests", "domain": [0.35, 0.63], "anchor": "x"},
                      yaxis3={"title": "KV tokens", "domain": [0, 0.3], "anchor": "x"})
    dist = go.Figure()
    for name, values, axis in (
            ("TTFT ms", [s.ttft for s in spans if s.ttft is not None], ""),
            ("TPOT ms", [s.tpot for s in spans if s.tpot is not None], "2")):
        centres, counts, width = histogram(values)
        dist.add_bar(x=centres, y=counts, width=width, name=name, xaxis=f"x{axis}",
                     yaxis=f"y{axis}")
    dist.update_layout(title="Latency distributions (requests per bin)",
                       xaxis={"domain": [0, 0.45], "title": "TTFT ms"},
                       xaxis2={"domain": [0.55, 1], "title": "TPOT ms"},
                       yaxis2={"anchor": "x2"})
    return [fig, dist]


def _table(rows: Sequence[Mapping[str, Any]], names: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_short(r.get(n)))}</td>" for n in names)
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def page(title: str, figures: Sequence[Any], summary: Mapping[str, Any], table: str) -> str:
    """A whole HTML document; plotly.js is inlined once, with the first figure."""
    divs = [fig.to_html(full_html=False, include_plotlyjs=(i == 0),
                        config={"displaylogo": False}) for i, fig in enumerate(figures)]
    facts = "".join(f"<li><b>{html.escape(str(k))}</b>: {html.escape(_short(v))}</li>"
                    for k, v in summary.items())
    style = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}")
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>"
            f"{html.escape(title)}</title><style>{style}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><ul>{facts}</ul>{''.join(divs)}{table}"
            "</body></html>\n")


TABLE_COLUMNS = ("status", "gpus", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms",
                 "p99_tpot_ms", "output_tok_s_per_gpu", "goodput_rps_per_gpu",
                 "usd_per_million_output_tokens", "error")


def write_report(path: Path, meta: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
                 params: Sequence[str]) -> None:
    """The report of a results file's rows."""
    figures = results_figures(rows, params)
    summary = {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))}
    summary["points"] = len(rows)
    summary["valid points"] = sum(1 for r in rows if r.get("status") == "ok")
    table = _table(rows, ["point", *params, *TABLE_COLUMNS])
    write_atomic(path, page(f"servesim {meta.get('command', 'results')}", figures, summary,
                            table).encode())


def write_replay_report(path: Path, report: Mapping[str, Any],
                        spans: Sequence[Span]) -> None:
    """The report of one replay: its report file and its per-request lines."""
    figures = replay_figures(spans)
    keys = ("engine", "num_requests", "completed", "output_throughput",
            "request_goodput", "median_ttft_ms", "p99_ttft_ms",
            "median_tpot_ms", "p99_tpot_ms", "servesim_version", "payload_sha256")
    summary = {k: report[k] for k in keys if k in report}
    write_atomic(path, page("servesim replay", figures, summary, "").encode())
