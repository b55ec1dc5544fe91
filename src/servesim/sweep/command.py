"""``servesim sweep CONFIG --set KEY=V1,V2,... -o RESULTS``: replay every point of a grid.

Each point is the config with its overrides, compiled, validated and replayed; an invalid
point is reported with its diagnostics and skipped. The rows go to one results file, in
point order, the same whatever the executor and the number of workers.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from servesim import codes
from servesim.compiler.source import SourceText
from servesim.errors import Diagnostic, ServesimError
from servesim.plugins.manager import EngineRegistry
from servesim.sweep.executors import EXECUTORS, check_jobs, default_jobs, open_executor
from servesim.sweep.progress import TrialProgress
from servesim.sweep.results import render, results_format, write_atomic
from servesim.sweep.space import parse_settings, points
from servesim.sweep.trial import Base, Task, input_files
from servesim.version import __version__

EXIT_OK, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 130


def add_executor_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N",
                   help="local worker processes (default: every core)")
    p.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="run trials in local processes, or on a Ray cluster (servesim[ray])")
    p.add_argument("--address", default=None, metavar="ADDRESS",
                   help="the Ray cluster (ray://HEAD:10001; default: RAY_ADDRESS, else a "
                   "local Ray instance)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--html", default=None, metavar="REPORT.html",
                   help="also write an HTML report of the results (servesim[report])")


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("config", help="config file (TOML)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a config value, or several to sweep (repeatable)")
    s.add_argument("--zip", action="store_true",
                   help="take the swept values side by side instead of every combination")
    s.add_argument("-o", "--output", required=True, metavar="RESULTS",
                   help="results file: .csv, .json or .parquet (pyarrow)")
    add_executor_options(s)


def load_base(config: str, settings: Sequence[str], plugins: Sequence[str]) -> tuple[
        Base, tuple[Any, ...]]:
    """The shared config and the sweep axes of ``settings``."""
    fixed, axes = parse_settings(settings)
    source = SourceText.from_path(config)
    base = Base(text=source.text, name=source.name,
                base_dir=str(source.base_dir) if source.base_dir else None,
                overrides=fixed, plugins=tuple(plugins))
    return base, axes


def check_outputs(base: Base, registry: EngineRegistry, outputs: dict[str, str | None],
                  inputs: list[str]) -> None:
    """Before any trial: no output is a file the run reads (its config, trace, timing
    tables, ``inputs``) or another output; ``--html`` has its extra."""
    from servesim.cli import _not_an_input

    _not_an_input(outputs, [*inputs, *input_files(base, registry)])
    if outputs.get("--html"):
        from servesim.report.page import import_plotly

        import_plotly()


def collect(base: Base, tasks: Sequence[Task], args: argparse.Namespace,
            err: Console) -> tuple[list[dict[str, Any]], bool]:
    """Run ``tasks`` with a progress bar; the finished rows in point order, and whether
    every task finished (False after Ctrl-C)."""
    jobs = check_jobs(args.jobs) if args.jobs is not None else default_jobs()
    rows: dict[int, dict[str, Any]] = {}
    try:  # the workers start before the progress bar's thread
        with open_executor(base, executor=args.executor, jobs=min(jobs, max(1, len(tasks))),
                           address=args.address) as executor, \
                TrialProgress(err, len(tasks), not args.quiet) as bar:
            for index, row in executor.run(tasks):
                rows[index] = row
                bar.advance()
    except KeyboardInterrupt:
        return [rows[i] for i in sorted(rows)], False
    return [rows[i] for i in sorted(rows)], True


def metadata(command: str, args: argparse.Namespace, base: Base) -> dict[str, Any]:
    return {"servesim_version": __version__, "command": command,
            "config": Path(args.config).name, "config_sha256": base.sha256,
            "settings": list(args.set)}


def report_invalid(err: Console, rows: Iterable[dict[str, Any]], params: Sequence[str]) -> None:
    for row in rows:
        if row["status"] != "ok":
            where = ", ".join(f"{k}={row.get(k)}" for k in params) or "the config"
            err.print(f"point {row['point']} ({where}) {row['status']}, skipped: "
                      f"{row['error']}", markup=False)


def run_sweep(args: argparse.Namespace, registry: EngineRegistry, out: Console,
              err: Console) -> int:
    from servesim.cli import _output_path

    output = _output_path(args.output, "-o")
    assert output is not None
    fmt = results_format(args.output)
    html = _output_path(args.html, "--html")
    base, axes = load_base(args.config, args.set, args.plugin)
    check_outputs(base, registry, {"-o": args.output, "--html": args.html}, [args.config])
    params = [a.name for a in axes]
    tasks = list(enumerate(points(axes, zipped=args.zip)))
    rows, complete = collect(base, tasks, args, err)
    meta = {**metadata("sweep", args, base), "zip": bool(args.zip)}
    write_atomic(output, render(rows, meta, params, fmt))
    report_invalid(err, rows, params)
    if not complete:
        err.print(f"interrupted: {len(rows)} of {len(tasks)} points finished; their rows are "
                  f"in {args.output}", markup=False)
        return EXIT_INTERRUPTED
    out.print(results_table(rows, params))
    err.print(f"wrote {args.output} ({len(rows)} points)", markup=False)
    return finish(err, html, meta, rows, params, args.config, "point of the sweep")


def finish(err: Console, html: Path | None, meta: dict[str, Any], rows: list[dict[str, Any]],
           params: list[str], location: str, what: str) -> int:
    """The HTML report, if asked for; an input error when no ``what`` could be replayed."""
    if html:
        from servesim.report.page import write_report

        write_report(html, meta, rows, params)
        err.print(f"wrote {html}", markup=False)
    if rows and all(row["status"] != "ok" for row in rows):
        raise ServesimError([Diagnostic(code=codes.NO_VALID_POINT, location=location,
                                        message=f"no {what} could be replayed",
                                        hint="the reasons are listed above")])
    return EXIT_OK


SHOWN = (("gpus", "GPUs", "{:.0f}"), ("p99_ttft_ms", "TTFT p99 ms", "{:.1f}"),
         ("p99_tpot_ms", "TPOT p99 ms", "{:.2f}"),
         ("output_tok_s_per_gpu", "out tok/s/GPU", "{:.1f}"),
         ("goodput_rps_per_gpu", "goodput rps/GPU", "{:.3f}"),
         ("usd_per_million_output_tokens", "$/M out tok", "{:.3f}"))


def results_table(rows: Sequence[dict[str, Any]], params: Sequence[str],
                  title: str | None = None) -> Any:
    from rich import box
    from rich.table import Table

    short = [p.rpartition(".")[2] for p in params]
    heads = short if len(set(short)) == len(short) else list(params)
    table = Table("point", *heads, *(label for _, label, _ in SHOWN), box=box.SIMPLE_HEAD,
                  title=title)
    for row in rows:
        cells = [_fmt(row.get(key), spec) if row["status"] == "ok" else
                 ("" if i else row["status"]) for i, (key, _, spec) in enumerate(SHOWN)]
        table.add_row(str(row["point"]), *(str(row.get(k)) for k in params), *cells)
    return table


def _fmt(value: Any, spec: str) -> str:
    return "-" if not isinstance(value, (int, float)) else spec.format(value)
