"""``servesim search CONFIG --space SPACE.toml``: the best deployments under an SLA."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.plugins.manager import EngineRegistry
from servesim.search.space import MAX_TRIALS, SAMPLERS, Space, grid_size, load_space

EXIT_OK, EXIT_INTERRUPTED = 0, 130


def add_arguments(s: argparse.ArgumentParser) -> None:
    from servesim.sweep.command import add_executor_options

    s.add_argument("config", help="config file (TOML)")
    s.add_argument("--space", required=True, metavar="SPACE.toml",
                   help="parameters to vary, objectives, constraints, optional load search")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a config value for every trial (repeatable)")
    s.add_argument("--objective", action="append", default=[], metavar="METRIC",
                   help="replaces the space's objectives (repeatable: a Pareto front); "
                   "'minimize NAME' or 'maximize NAME' to say which way")
    s.add_argument("--constraint", action="append", default=[], metavar="'METRIC <= N'",
                   help="added to the space's constraints, e.g. 'ttft_ms.p99 <= 1000'")
    s.add_argument("--trials", type=int, default=None, help="trials in all (default: the "
                   "space's, else 32)")
    s.add_argument("--seed", type=int, default=None, help="sampler seed (default: the space's)")
    s.add_argument("--sampler", choices=SAMPLERS, default=None,
                   help="auto: TPE for one objective, NSGA-II for several")
    s.add_argument("-o", "--output", metavar="RESULTS",
                   help="results file: .csv, .json or .parquet, one row per trial")
    s.add_argument("--storage", metavar="STUDY.db",
                   help="keep the study in this SQLite file (default: beside -o, RESULTS.db)")
    s.add_argument("--resume", action="store_true",
                   help="continue the study in --storage up to --trials")
    s.add_argument("--top", type=int, default=5, help="best points to show")
    add_executor_options(s)


def _space(args: argparse.Namespace) -> Space:
    space = load_space(args.space, args.objective, args.constraint)
    changes: dict[str, Any] = {}
    if args.trials is not None:
        if not 1 <= args.trials <= MAX_TRIALS:
            raise ServesimError([Diagnostic(code=codes.BAD_SPACE,
                                            location=f"--trials {args.trials}",
                                            message=f"expected 1 to {MAX_TRIALS} trials")])
        changes["trials"] = args.trials
    if args.seed is not None:
        if not 0 <= args.seed < 2**32:
            raise ServesimError([Diagnostic(code=codes.BAD_SPACE, location=f"--seed {args.seed}",
                                            message="expected a seed from 0 to 2^32-1")])
        changes["seed"] = args.seed
    if args.top < 1:
        raise ServesimError([Diagnostic(code=codes.BAD_SPACE, location=f"--top {args.top}",
                                        message="expected at least 1 point to show")])
    if args.sampler is not None:
        changes["sampler"] = args.sampler
    if changes.get("sampler", space.sampler) == "grid":  # each combination once
        ranged = [p.name for p in space.parameters if not p.choices]
        if ranged:
            raise ServesimError([Diagnostic(
                code=codes.BAD_SPACE, location=f"{args.space}: parameters.{ranged[0]}",
                message="the grid sampler takes lists of choices only",
                hint="list the values to try, or use another sampler")])
        size = grid_size(space.parameters)
        given = space.trials if space.sampler == "grid" else size  # the file's, else all
        changes["trials"] = min(changes.get("trials", given), size)
    return attrs.evolve(space, **changes)


def _storage_path(args: argparse.Namespace) -> Path | None:
    if args.storage:
        return Path(args.storage)
    if args.output:
        return Path(args.output).with_suffix(".db")
    if args.resume:
        raise ServesimError([Diagnostic(code=codes.SEARCH_STORAGE, location="--resume",
                                        message="nothing to resume: no --storage or -o given",
                                        hint="give the --storage file of the search")])
    return None


def run_search(args: argparse.Namespace, registry: EngineRegistry, out: Console,
               err: Console) -> int:
    from servesim.cli import _output_path
    from servesim.search.optimize import (
        finished_trials,
        import_optuna,
        open_study,
        pareto,
        rows_of,
        search,
    )
    from servesim.sweep.command import (
        check_outputs,
        finish,
        load_base,
        metadata,
        report_invalid,
    )
    from servesim.sweep.executors import check_jobs, default_jobs, open_executor
    from servesim.sweep.progress import TrialProgress
    from servesim.sweep.results import render, results_format, write_atomic

    optuna = import_optuna()
    output = _output_path(args.output, "-o")
    fmt = results_format(args.output) if args.output else None
    html = _output_path(args.html, "--html")
    storage = _storage_path(args)
    base, axes = load_base(args.config, args.set, args.plugin)
    check_outputs(base, registry, {"-o": args.output, "--html": args.html,
                                   "--storage": str(storage) if storage else None},
                  [args.config, args.space])
    if storage is not None and storage.exists() and not args.resume:
        raise ServesimError([Diagnostic(
            code=codes.SEARCH_STORAGE, location=f"--storage {storage}",
            message="a search is already stored here",
            hint="add --resume to continue it, or remove the file for a new search")])
    if storage is not None and args.resume and not storage.exists():
        raise ServesimError([Diagnostic(code=codes.SEARCH_STORAGE, location=f"--storage {storage}",
                                        message="no search is stored here to resume")])
    space = _space(args)
    if axes:
        raise ServesimError([Diagnostic(
            code=codes.BAD_OVERRIDE, location=f"--set {axes[0].name}=...",
            message="search takes one value per --set", hint="put the choices in the space's "
            "[parameters] table")])
    base = attrs.evolve(base, load=space.load, constraints=space.constraints)
    jobs = check_jobs(args.jobs) if args.jobs is not None else default_jobs()
    fingerprint = {"config_sha256": base.sha256,
                   "space_sha256": hashlib.sha256(Path(args.space).read_bytes()).hexdigest(),
                   "settings": "\n".join(args.set),
                   "goals": "\n".join([*(f"{o.direction} {o.metric}" for o in space.objectives),
                                       *(str(c) for c in space.constraints), str(space.load)])}
    url = f"sqlite:///{storage.resolve()}" if storage is not None else None
    study = open_study(optuna, space, url, args.resume, fingerprint)
    done = finished_trials(study)
    total = max(space.trials, done)
    complete = True
    try:  # the workers start before the progress bar's thread
        with open_executor(base, executor=args.executor, jobs=min(jobs, space.trials),
                           address=args.address) as executor, \
                TrialProgress(err, total, not args.quiet, "trials", "search") as bar:
            for _ in range(done):
                bar.advance()
            search(study, space, executor, trials=space.trials,
                   on_row=lambda row: bar.advance())
    except KeyboardInterrupt:
        complete = False
    rows = rows_of(study)
    params = [p.name for p in space.parameters]
    meta = {**metadata("search", args, base), "space": Path(args.space).name,
            "space_sha256": fingerprint["space_sha256"],
            "objectives": [f"{o.direction} {o.metric}" for o in space.objectives],
            "constraints": [str(c) for c in space.constraints]}
    front = pareto(rows, space)
    front_points = {r["point"] for r in front}
    for row in rows:
        row["feasible"] = _feasible(row, space)
        row["pareto"] = row["point"] in front_points
    if output is not None and fmt is not None:
        write_atomic(output, render(rows, meta, params, fmt))
    if not complete:
        kept = f"; their rows are in {args.output}" if args.output else ""
        err.print(f"interrupted: {len(rows)} trials finished{kept}", markup=False)
        if storage is not None:
            err.print(f"continue with --resume --storage {storage}", markup=False)
        return EXIT_INTERRUPTED
    report_invalid(err, rows, params)
    _print_results(out, rows, front, space, params, args.top)
    if args.output:
        err.print(f"wrote {args.output} ({len(rows)} trials)", markup=False)
    return finish(err, html, meta, rows, params, args.space, "trial of the search")


def _feasible(row: dict[str, Any], space: Space) -> bool:
    from servesim.search.goals import meets

    return meets(row, space.constraints) and (space.load is None
                                              or row.get("max_load") is not None)


def _print_results(out: Console, rows: list[dict[str, Any]], front: list[dict[str, Any]],
                   space: Space, params: list[str], top: int) -> None:
    from rich import box
    from rich.table import Table

    from servesim.search.optimize import objective_values
    from servesim.sweep.metrics import column_name

    extra = [c.metric for c in space.constraints] + (["max_load"] if space.load else []) \
        + ["gpus", "usd_per_million_output_tokens"]
    metrics = list(dict.fromkeys([o.metric for o in space.objectives] + extra))
    feasible = [r for r in rows if _feasible(r, space) and objective_values(space, r)]
    sign = 1.0 if space.objectives[0].direction == "maximize" else -1.0
    ranked = sorted(feasible, key=lambda r: (-sign * (objective_values(space, r) or [0.0])[0],
                                             r["point"]))
    distinct = {tuple(str(r.get(p)) for p in params): r for r in reversed(ranked)}
    best = sorted(distinct.values(), key=ranked.index)[:top]
    title = "Pareto front" if len(space.objectives) > 1 else "Best deployments"
    shown = front if len(space.objectives) > 1 else best
    goals = ", ".join(f"{o.direction} {o.metric}" for o in space.objectives)
    conds = ", ".join(str(c) for c in space.constraints) or "no constraints"
    table = Table("trial", *(p.rpartition(".")[2] for p in params), *metrics,
                  box=box.SIMPLE_HEAD, title=f"{title}: {goals}; {conds}")
    for row in shown:
        table.add_row(str(row["point"]), *(str(row.get(p)) for p in params),
                      *(_cell(row.get(column_name(m))) for m in metrics))
    if shown:
        out.print(table)
    invalid = sum(1 for r in rows if r["status"] != "ok")
    out.print(f"{len(feasible)} of {len(rows)} trials met every constraint ({conds}); "
              f"{invalid} could not be replayed", markup=False)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
