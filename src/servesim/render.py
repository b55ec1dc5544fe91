"""Rich renderables for the CLI: diagnostics, stage dumps, the resolved tree, reports.

Only this module and :mod:`servesim.cli` import rich; everything else returns data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
from rich.console import Console
from rich.table import Table
from rich.text import Text
from rich.tree import Tree

from servesim.errors import Diagnostic, format_path
from servesim.payload import RoleArgs, role_field_path
from servesim.workloads.spec import workload_to_data

if TYPE_CHECKING:  # (the compiler's modules load with a config, not with a payload)
    from servesim.compiler.model.resolved import Provenance, ResolvedConfig

REJECTED_WHY = ("prompt at or over the context length, or more tokens than a rank's KV cache "
                "holds")
INCOMPLETE_WHY = "unfinished when the replay stopped"
ORIGIN_STYLE = {"authored": "green", "defaulted": "dim", "derived": "cyan"}


def shown(text: object) -> str:
    """``text`` as it may reach a terminal: every character that is not printable (a
    newline, an escape, a bidirectional override) written as its Python escape, so that
    a file name, a TOML key or a plugin's string can neither forge a line nor drive the
    terminal. Rich markup is off in the CLI's consoles: brackets print as they are."""
    value = str(text)
    if value.isprintable():
        return value
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in value)


def print_diagnostics(console: Console, diagnostics: Iterable[Diagnostic]) -> None:
    for d in diagnostics:
        line = Text()
        line.append("error: ", style="bold red")
        line.append(f"{shown(d.where)}: ", style="bold")
        line.append(shown(d.message))
        line.append(f" [{shown(d.code)}]", style="dim")
        console.print(line, highlight=False, soft_wrap=True)
        if d.hint:
            console.print(Text("  hint: ", style="yellow") + Text(shown(d.hint)),
                          highlight=False, soft_wrap=True)


def _leaf(tree: Tree, key: str, value: Any, prov: Provenance | None) -> None:
    label = Text(f"{shown(key)} = ", overflow="fold")
    label.append(_fmt(value), style="bold")
    if prov is not None:
        label.append(f"  ({prov.origin}", style=ORIGIN_STYLE[prov.origin])
        if prov.formula:
            label.append(f": {prov.formula}", style=ORIGIN_STYLE[prov.origin])
        label.append(")", style=ORIGIN_STYLE[prov.origin])
    tree.add(label)


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f'"{shown(value)}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_fmt(v) for v in value) + "]"
    if value is None:
        return "none"
    return str(value)


def resolved_tree(cfg: ResolvedConfig) -> Tree:
    """Every resolved field, marked authored / defaulted / derived (with its formula)."""
    from servesim.compiler.model.resolved import Provenance

    prov, payload = cfg.provenance, cfg.payload
    root = Tree(Text(f"engine  (mode {payload.mode}, engine {payload.engine})", style="bold"))
    if payload.engine_options:
        node = root.add(Text("options", style="bold"))
        for key, value in payload.engine_options.items():
            _leaf(node, key, value, prov.get(f"engine.options.{key}"))
    for name, role in payload.roles.items():
        node = root.add(Text(f"workers.{name}", style="bold"))
        _role_tree(node, name, role, prov)
    if payload.kv_transfer is not None:
        node = root.add(Text("kv_transfer", style="bold"))
        for f in attrs.fields(type(payload.kv_transfer)):
            _leaf(node, f.name, getattr(payload.kv_transfer, f.name),
                  prov.get(f"engine.kv_transfer.{f.name}"))
    traffic = root.add(Text("traffic", style="bold"))
    for section, values in workload_to_data(payload.workload).items():
        sub = traffic.add(Text(shown(section)))
        for key, value in values.items():
            _leaf(sub, key, value, prov.get(f"traffic.{section}.{key}"))
    if payload.gpu_hour_usd:
        prices = root.add(Text("evaluation.gpu_hour_usd (USD per GPU-hour)", style="bold"))
        for gpu, price in payload.gpu_hour_usd.items():
            _leaf(prices, gpu, price.usd_per_hour, prov.get(f"evaluation.gpu_hour_usd.{gpu}"))
    if payload.sla is not None:
        sla = root.add(Text("evaluation.sla", style="bold"))
        if payload.sla.itl_ms is not None:
            _leaf(sla, "itl_ms (deprecated: each request's mean gap, as tpot_ms)",
                  payload.sla.itl_ms, Provenance("authored"))
        for t in payload.sla.targets:
            key = t.metric if t.stat == "per_request" else f"{t.metric}.{t.stat}"
            _leaf(sla, key, t.bound, Provenance("authored"))
    return root


def _role_tree(node: Tree, role: str, r: RoleArgs, prov: Mapping[str, Provenance]) -> None:
    sections: dict[str, Tree] = {}
    for f in attrs.fields(RoleArgs):
        value = getattr(r, f.name)
        path = role_field_path(role, f.name)
        parent = node
        if len(path) == 5:
            section = path[3]
            if section not in sections:
                sections[section] = node.add(section)
            parent = sections[section]
        key = path[-1]
        if attrs.has(type(value)):
            _attrs_tree(parent, key, value, format_path(path), prov)
            continue
        _leaf(parent, key, value, prov.get(format_path(path)))


def _attrs_tree(parent: Tree, key: str, value: Any, where: str,
                prov: Mapping[str, Provenance]) -> None:
    """An attrs value as a branch of its set fields (nested ones as branches too)."""
    sub = parent.add(key)
    for g in attrs.fields(type(value)):
        item = getattr(value, g.name)
        if item is None:
            continue
        if attrs.has(type(item)):
            _attrs_tree(sub, g.name, item, f"{where}.{g.name}", prov)
            continue
        _leaf(sub, g.name, item, prov.get(f"{where}.{g.name}") or prov.get(where))


def report_table(report: Mapping[str, Any]) -> Table:
    """The terminal summary of a replay report: each latency by its report name."""
    table = Table(title="servesim replay", show_header=True, header_style="bold")
    table.add_column("metric (ms)")
    for col in ("mean", "median", "p90", "p99", "max"):
        table.add_column(col, justify="right")
    for name in ("ttft", "ttst", "tpot", "itl", "e2el"):
        row = [f"{report.get(f'{k}_{name}_ms', 0.0):.2f}"
               for k in ("mean", "median", "p90", "p99", "max")]
        table.add_row(f"{name}_ms", *row)
    return table


def speculation_table(report: Mapping[str, Any]) -> Table | None:
    """Speculative decoding's acceptance statistics, when the run had any."""
    if "spec_decode_num_drafts" not in report:
        return None
    table = Table(title="speculative decoding", show_header=False, box=None)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    rates = report["spec_decode_per_position_acceptance_rates"]
    for key, value in (
            ("spec_decode_acceptance_length", f"{report['spec_decode_acceptance_length']:.3f} "
             "tokens per step"),
            ("spec_decode_acceptance_rate", f"{report['spec_decode_acceptance_rate']:.1f} %"),
            ("spec_decode_num_drafts", f"{report['spec_decode_num_drafts']} steps"),
            ("spec_decode_accepted_tokens", f"{report['spec_decode_accepted_tokens']} of "
             f"{report['spec_decode_draft_tokens']} drafted"),
            ("spec_decode_per_position_acceptance_rates",
             " ".join(f"{rate:.3f}" for rate in rates))):
        table.add_row(key, value)
    return table


def sla_table(report: Mapping[str, Any]) -> Table | None:
    """One line per SLA target of the report: met or missed, with the value."""
    verdicts = report.get("sla_verdicts")
    if not verdicts:
        return None
    table = Table(title="SLA", show_header=True, header_style="bold")
    for col, justify in (("target", "left"), ("bound (ms)", "right"), ("value (ms)", "right"),
                         ("verdict", "left")):
        table.add_column(col, justify=justify)  # type: ignore[arg-type]
    for v in verdicts:
        per_request = v["stat"] == "per_request"
        name = f"{v['metric']} per request" if per_request else f"{v['metric']} {v['stat']}"
        value = "-" if v["value"] is None else f"{v['value']:.2f}"
        if v["met"] is None:
            verdict = Text("no samples", style="dim")
        else:
            verdict = Text("met" if v["met"] else "missed",
                           style="green" if v["met"] else "bold red")
        if per_request:
            value += " worst" if v["value"] is not None else ""
            verdict.append(f" ({100.0 * v['attainment']:.1f}% of requests within)")
        table.add_row(shown(name), f"<= {v['target']:.2f}", value, verdict)
    return table


def report_summary(report: Mapping[str, Any], *, wall_time_ms: float | None = None) -> Table:
    table = Table(show_header=False, box=None)
    table.add_column("key", style="bold")
    table.add_column("value", justify="right")
    rows = [
        ("completed", f"{report.get('completed', 0)} / {report.get('num_requests', 0)}"),
        ("duration", f"{report.get('duration_ms', 0.0) / 1000:.2f} s"),
        ("request_throughput", f"{report.get('request_throughput', 0.0):.3f} req/s"),
        ("output_throughput", f"{report.get('output_throughput', 0.0):.1f} tok/s"),
        ("total_token_throughput", f"{report.get('total_token_throughput', 0.0):.1f} tok/s"),
        ("prefix_cache_reused_ratio", f"{report.get('prefix_cache_reused_ratio', 0.0):.3f}"),
        ("gpu_hours", f"{report.get('gpu_hours', 0.0):.4f}"),
    ]
    for status, why in (("rejected", REJECTED_WHY), ("incomplete", INCOMPLETE_WHY)):
        if report.get(f"{status}_requests", 0):
            rows.append((f"{status} requests", f"{report[f'{status}_requests']} ({why})"))
    if "request_goodput" in report:
        rows.append(("request_goodput", f"{report['request_goodput']:.3f} req/s "
                     f"({report['good_request_count']} good)"))
    rows += _handoff_rows(report) + _cost_rows(report)
    if wall_time_ms is not None:
        rows.append(("simulator wall time (ms)", f"{wall_time_ms:.0f}"))
    for k, v in rows:
        table.add_row(k, v)
    return table


def _handoff_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A P/D run's KV transfers and what did not complete, zeros included."""
    if "kv_transfers" not in report:
        return []
    rows = [("KV transfers", f"{report['kv_transfers']} (mean "
             f"{report.get('mean_kv_transfer_ms', 0.0):.2f} ms on the link)")]
    rows += _contention_rows(report)
    rows += [(f"{status} requests", str(report.get(f"{status}_requests", 0)))
             for status in ("rejected", "incomplete") if not report.get(f"{status}_requests")]
    return rows


def _contention_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """How much the transfers sharing a link slowed each other, where the report says."""
    peak = report.get("max_concurrent_kv_transfers")
    if peak is None:
        return []
    if peak <= 1:
        return [("KV link sharing", "none (one transfer per link at a time)")]
    return [("KV link sharing", f"up to {peak} transfers on one link; p99 "
             f"{report['p99_kv_transfer_ms']:.2f} ms, mean "
             f"{report['mean_kv_transfer_uncontended_ms']:.2f} ms alone")]


def _cost_rows(report: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Output per GPU and per replica, each role's GPUs and their price (with its source),
    and what they cost."""
    if "gpus" not in report:
        return []
    gpus = report["gpus"]
    rows = [("output tok/s per GPU", f"{report['output_tok_s_per_gpu']:.1f} ({gpus} "
             f"GPU{'s' if gpus != 1 else ''})"),
            ("output tok/s per replica", f"{report['output_tok_s_per_replica']:.1f}")]
    for role, p in report.get("gpu_prices", {}).items():
        price = "no price" if p["usd_per_gpu_hour"] is None else \
            f"${p['usd_per_gpu_hour']:.2f}/GPU-hour ({shown(p['source'])} price)"
        rows.append((f"{shown(role)} GPUs", f"{p['gpus']} x {shown(p['hardware'])}, {price}"))
    money = (("cost (USD/hour)", "usd_per_hour", "{:.2f}"),
             ("cost per 1M output tokens (USD)", "usd_per_million_output_tokens", "{:.3f}"),
             ("cost of the GPU hours (USD)", "gpu_hours_cost_usd", "{:.4f}"))
    for label, key, fmt in money:
        value = report.get(key)
        rows.append((label, "unknown" if value is None else fmt.format(value)))
    return rows


TTFT_PART_LABELS = (("prefill_queue", "prefill queue"), ("prefill", "prefill"),
                    ("kv_transfer", "KV transfer"), ("decode_queue", "decode queue"),
                    ("first_decode", "first decode pass"))


def ttft_breakdown_table(report: Mapping[str, Any]) -> Table | None:
    """The parts of the TTFT (queued, transferred, computed) the report has, or None."""
    parts = [(name, label) for name, label in TTFT_PART_LABELS
             if f"mean_ttft_{name}_ms" in report]
    if not parts:
        return None
    table = Table(title="TTFT breakdown (ms)", show_header=True, header_style="bold")
    table.add_column("part")
    stats = ("mean", "median", "p90", "p99", "max")
    for col in stats:
        table.add_column(col, justify="right")
    for name, label in parts:
        table.add_row(label, *(f"{report.get(f'{k}_ttft_{name}_ms', 0.0):.2f}" for k in stats))
    return table


def calibration_tables(doc: Mapping[str, Any]) -> list[Table]:
    """A calibration file's fit as tables: each point's error before, after and
    cross-validated, the overall errors, and the fitted values per role."""
    fit = doc["fit"]

    def pct(measured: float | None, lat: Mapping[str, Any] | None, key: str) -> str:
        if lat is None or measured is None or lat.get(key) is None:
            return "-"
        return f"{100.0 * (lat[key] / measured - 1.0):+.1f}%"

    points = Table("point", "TTFT ms", "before", "after", "cross-val.", "TPOT ms", "before",
                   "after", "cross-val.", title="error per measured point (predicted / "
                   "measured - 1)")
    for p in fit["points"]:
        m = p["measured"]
        row = [p["label"]]
        for key in ("ttft_ms", "tpot_ms"):
            row.append("-" if m[key] is None else f"{m[key]:.2f}")
            row += [pct(m[key], p[which], key)
                    for which in ("before", "after", "cross_validated")]
        points.add_row(*row)
    overall = Table("mean abs. error", "before", "after", "cross-validated",
                    title="over all points")
    for key, name in (("ttft_mape_percent", "TTFT"), ("tpot_mape_percent", "TPOT")):
        overall.add_row(name, *("-" if fit[w][key] is None else f"{fit[w][key]:.1f}%"
                                for w in ("before", "after", "cross_validated")))
    values = Table("role", "constant", "value", "fitted", title="calibrated values")
    for role, entry in doc["roles"].items():
        for key, value in entry["values"].items():
            values.add_row(role, key, f"{value:.4g}",
                           "yes" if key in entry["fitted"] else "no (neutral)")
    return [points, overall, values]
