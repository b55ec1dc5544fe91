"""``servesim report INPUT -o report.html``: the HTML page of a results file (``sweep``,
``search``) or of one replay (its ``-o`` report, with ``--requests`` its
``--requests-out`` lines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.plugins.manager import EngineRegistry


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("input", help="a results file (.csv, .json, .parquet) or a replay's -o report")
    r.add_argument("-o", "--output", required=True, metavar="REPORT.html")
    r.add_argument("--requests", metavar="REQUESTS.jsonl",
                   help="a replay's --requests-out file: time series and distributions")


def params_of(row: dict[str, Any]) -> list[str]:
    """The swept keys: the columns between ``point`` and ``status``."""
    names = list(row)
    if "point" not in names or "status" not in names:
        return []
    return names[names.index("point") + 1:names.index("status")]


def _replay_report(path: str) -> dict[str, Any] | None:
    """The replay report in ``path``, or None when it is a results file."""
    if Path(path).suffix.lower() != ".json":
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None  # read_results names the problem
    return data if isinstance(data, dict) and "rows" not in data else None


def run_report(args: argparse.Namespace, registry: EngineRegistry, out: Console,
               err: Console) -> int:
    from servesim.cli import _not_an_input, _output_path
    from servesim.report.page import import_plotly, write_replay_report, write_report
    from servesim.report.series import read_spans
    from servesim.sweep.results import read_results

    output = _output_path(args.output, "-o")
    assert output is not None
    _not_an_input({"-o": args.output}, [args.input, *([args.requests] if args.requests else [])])
    import_plotly()
    report = _replay_report(args.input)
    if report is not None:
        if "num_requests" not in report:
            raise ServesimError([Diagnostic(
                code=codes.RESULTS_FILE, location=args.input,
                message="neither a results file nor a replay report",
                hint="give the -o file of `servesim sweep`, `search` or `replay`")])
        spans = read_spans(args.requests) if args.requests else []
        write_replay_report(output, report, spans)
    else:
        meta, rows = read_results(args.input)
        write_report(output, meta, rows, params_of(rows[0]) if rows else [])
    err.print(f"wrote {args.output}", markup=False)
    return 0
