"""Command-line interface: ``servesim compile|validate|inspect|schema|plugins|replay|calibrate``.

Exit codes: 0 success, 1 the input is wrong (diagnostics on stderr) or the output cannot
be written (a reader of stdout that went away included), 2 usage error, 130 interrupted.
A traceback means a bug in servesim, never bad input (``SERVESIM_TRACEBACK=1`` adds the
traceback of an exception a plugin raised to its diagnostic).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import importlib
import json
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from servesim import codes
from servesim.arguments import parser
from servesim.commands import COMMANDS, load
from servesim.compiler import compile_source
from servesim.compiler.source import SourceText, read_input
from servesim.console import open_closed_streams
from servesim.errors import Diagnostic, PayloadError, PluginError, ReplayError, ServesimError
from servesim.files import identity, is_special, whole_file
from servesim.payload import (
    Payload,
    anchor_paths,
    dump_payload,
    files_named,
    load_payload,
    payload_files,
)
from servesim.plugins.manager import (
    PLUGIN_FAULTS,
    TRACEBACK_ENV,
    EngineRegistry,
    get_plugin_manager,
)
from servesim.render import shown

EXIT_OK, EXIT_INPUT, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
UNLIMITED_WIDTH = 100_000  # a console's width where it has no terminal's (piped)


class TimedOut(KeyboardInterrupt):
    """The ``--timeout`` alarm: ends a replay where it stands, as Ctrl-C does."""


@contextlib.contextmanager
def _deadline(seconds: float | None) -> Iterator[None]:
    """Raise :class:`TimedOut` in the main thread after ``seconds`` of wall-clock time."""
    if seconds is None or not hasattr(signal, "setitimer") \
            or threading.current_thread() is not threading.main_thread():
        yield  # (a signal handler is the main thread's: elsewhere no limit can be set)
        return

    def alarm(signum: int, frame: object) -> None:
        raise TimedOut

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def config_source(path: str | Path, settings: list[str]) -> SourceText:
    """The config at ``path`` with the ``--set`` changes ``settings``."""
    from servesim.compiler.overrides import parse_override

    return SourceText.from_path(path, tuple(parse_override(t) for t in settings))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); its exit code."""
    open_closed_streams()
    return run(parser().parse_args(argv))


def run(args: argparse.Namespace) -> int:
    """Run the command ``args`` parsed; its exit code."""
    # markup and emoji codes off: a file name or a plugin's text is printed as it is,
    # brackets and colons included
    out = Console(file=sys.stdout, highlight=False, markup=False, emoji=False)
    err = Console(stderr=True, highlight=False, markup=False, emoji=False, soft_wrap=True)
    try:
        # what plugins print goes to stderr: stdout holds only our output (a JSON report)
        with contextlib.redirect_stdout(sys.stderr):
            registry = _registry(args.plugin)
            return load(COMMANDS[args.command].handler)(args, registry, out, err)
    except ServesimError as exc:
        from servesim.render import print_diagnostics

        print_diagnostics(err, exc.diagnostics)
        _plugin_traceback(exc)
        return EXIT_INPUT
    except KeyboardInterrupt:
        err.print("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as rich does
        _drop_stdout()
        return EXIT_INPUT
    except OSError as exc:  # writing our output failed (a full disk, say); reading is checked
        _drop_stdout()
        err.print(f"error: cannot write the output: {shown(exc)}")
        return EXIT_INPUT


def _plugin_traceback(exc: ServesimError) -> None:
    """With ``SERVESIM_TRACEBACK=1``, the full traceback of what a plugin raised."""
    cause = exc.__cause__
    if isinstance(exc, PluginError) and cause is not None \
            and os.environ.get(TRACEBACK_ENV) == "1":
        sys.stderr.write("".join(traceback.format_exception(cause)))


def _drop_stdout() -> None:
    """Point stdout at the null device, so that the flush at exit cannot fail again."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _registry(modules: list[str]) -> EngineRegistry:
    plugins = []
    for name in modules:
        try:
            plugins.append(importlib.import_module(name))
        except PLUGIN_FAULTS as exc:
            raise ServesimError([Diagnostic(
                code=codes.PLUGIN_IMPORT, location=f"--plugin {name}",
                message=f"cannot import plugin module: {type(exc).__name__}: {exc}")]) from exc
    return EngineRegistry.collect(get_plugin_manager(plugins=plugins))


def run_compile(args: argparse.Namespace, registry: EngineRegistry, out: Console,
                err: Console) -> int:
    from servesim.compiler.model.resolved import ResolvedConfig, ValidatedConfig
    from servesim.render import resolved_tree

    output = _output_path(args.output, "-o")
    _not_an_input({"-o": args.output}, [args.config])
    source = config_source(args.config, args.set)
    artifact = compile_source(source, registry=registry, stop_after=args.stop_after)
    data = artifact.to_data()  # the trace, tables and models it names, once resolved
    _not_an_input({"-o": args.output}, [args.config, *files_named(data)])
    if isinstance(artifact, Payload):
        from servesim.sla import sla_deprecations

        _warn(err, sla_deprecations(artifact.sla))
        relative_to = str(output.resolve().parent) if output else os.getcwd()
        text = dump_payload(artifact, relative_to=relative_to)
        if output:
            _write_output(output, text, "-o")
            err.print(f"wrote {shown(args.output)} (engine {shown(artifact.engine)})")
        else:
            out.file.write(text)
        return EXIT_OK
    if output:  # a stage's values, as JSON: a file is for a program to read
        _write_output(output, json.dumps(data, indent=2, sort_keys=True) + "\n", "-o")
        err.print(f"wrote {shown(args.output)} (stage {args.stop_after})")
    elif args.format == "json":
        out.file.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    elif isinstance(artifact, (ResolvedConfig, ValidatedConfig)):

        resolved = artifact.resolved if isinstance(artifact, ValidatedConfig) else artifact
        out.print(resolved_tree(resolved))
    else:
        out.print_json(data=data, ensure_ascii=True)  # no control character is shown raw
    return EXIT_OK


def run_validate(args: argparse.Namespace, registry: EngineRegistry, out: Console,
                 err: Console) -> int:
    from servesim.replay import check_input_files
    from servesim.sla import sla_deprecations

    try:
        payload = compile_source(config_source(args.config, args.set), registry=registry)
        diags = [*sla_deprecations(payload.sla),
                 *check_input_files(payload, registry=registry)]
        if any(d.severity == "error" for d in diags):
            raise ServesimError(diags)
    except ServesimError as exc:
        if args.format == "text":
            raise
        _write_validation(out, args.config, None, exc.diagnostics)
        return EXIT_INPUT
    if args.format == "json":
        _write_validation(out, args.config, payload, diags)
        return EXIT_OK
    _warn(err, diags)
    roles = ", ".join(payload.roles)
    out.print(shown(f"ok: {args.config} is valid (engine {payload.engine}; roles {roles})"))
    return EXIT_OK


def _write_validation(out: Console, config: str, payload: Payload | None,
                      diags: Sequence[Diagnostic]) -> None:
    """``validate --format json``: the verdict, with every error and warning."""
    def entry(d: Diagnostic) -> dict[str, Any]:
        return {"where": d.where, "code": d.code, "message": d.message, "hint": d.hint,
                "path": list(d.path), "location": d.location, "stage": d.stage}

    doc: dict[str, Any] = {
        "config": config, "valid": payload is not None,
        "engine": payload.engine if payload else None,
        "roles": list(payload.roles) if payload else [],
        "diagnostics": [entry(d) for d in diags if d.severity == "error"],
        "warnings": [entry(d) for d in diags if d.severity == "warning"]}
    out.file.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def run_inspect(args: argparse.Namespace, registry: EngineRegistry, out: Console,
                err: Console) -> int:
    resolved = compile_source(config_source(args.config, args.set), registry=registry,
                              stop_after="validate").resolved
    if args.format == "json":
        out.file.write(json.dumps(resolved.to_data(), indent=2, sort_keys=True) + "\n")
    else:
        from servesim.render import resolved_tree

        out.print(resolved_tree(resolved))
    return EXIT_OK


def run_schema(args: argparse.Namespace, registry: EngineRegistry, out: Console,
               err: Console) -> int:
    from servesim.schemas import add_engine_options, load_schema

    schema = load_schema(args.which)
    if args.which == "config":  # the options of every registered engine, plugins' included
        add_engine_options(schema, registry)
    out.file.write(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    return EXIT_OK


def run_plugins(args: argparse.Namespace, registry: EngineRegistry, out: Console,
                err: Console) -> int:
    def where(plugin: str) -> dict[str, str]:
        return {"plugin": plugin, "source": registry.source(plugin).describe()}

    rows: list[dict[str, Any]] = [
        {"kind": "engine", "name": n, "class": f"{c.__module__}.{c.__qualname__}",
         "modes": list(c.MODES), "description": c.DESCRIPTION, **where(o)}
        for n, c, o in registry.items()]
    rows += [{"kind": "backend", "name": n, "class": f"{type(b).__module__}.{type(b).__qualname__}",
              "modes": [], "description": b.DESCRIPTION, **where(o)}
             for n, b, o in registry.backend_items()]
    for kind, items in (("timing", registry.timing_items()),
                        ("router", registry.router_items()),
                        ("trace-format", registry.format_items())):
        rows += [{"kind": kind, "name": n, "class": f"{f.__module__}.{f.__qualname__}",
                  "modes": [], "description": (f.__doc__ or "").strip().split("\n")[0],
                  **where(o)} for n, f, o in items]
    if args.format == "json":
        out.file.write(json.dumps(rows, indent=2) + "\n")
        return EXIT_OK
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table("kind", "name", "modes", "registered by", "description", box=box.SIMPLE_HEAD)
    for row in rows:
        source = registry.source(row["plugin"])
        origin = row["plugin"] if source.kind in ("builtin", "module") \
            else f"{row['plugin']} ({source.package or 'in-process'})"
        table.add_row(Text(row["kind"], no_wrap=True), Text(shown(row["name"]), no_wrap=True),
                      Text(shown(", ".join(map(str, row["modes"])))), Text(shown(origin)),
                      Text(shown(row["description"])))
    if not out.is_terminal:  # piped or redirected: no row is cut or wrapped
        out = Console(file=out.file, width=UNLIMITED_WIDTH, highlight=False, markup=False,
                      emoji=False)
    out.print(table)
    return EXIT_OK


def _warn(err: Console, warnings: Sequence[Diagnostic]) -> None:
    """Warnings on stderr, one per line like errors: ``warning: path: message [code]``."""
    for d in warnings:
        err.print(f"warning: {shown(d.where)}: {shown(d.message)} [{shown(d.code)}]")
        if d.hint:
            err.print(f"  hint: {shown(d.hint)}")


def load_input(path: str, registry: EngineRegistry,
               settings: Sequence[str] = ()) -> tuple[Payload, Path | None]:
    """A payload from a TOML config (compiled, with the ``--set`` changes ``settings``) or
    a JSON payload file (loaded and checked)."""
    p = Path(path)
    if p.suffix.lower() != ".json":
        payload: Payload = compile_source(config_source(p, list(settings)), registry=registry)
        return payload, None
    if settings:
        raise PayloadError([Diagnostic(
            code=codes.BAD_OVERRIDE, location=f"--set {settings[0]}",
            message="--set changes a TOML config, and this is a compiled payload",
            hint="replay the config with --set, or compile it again with the change")])
    raw = read_input(p, "a JSON payload", PayloadError)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # nested too deep, too long
        where = f"{path}:{exc.lineno}:{exc.colno}" if isinstance(exc, json.JSONDecodeError) \
            else path
        raise PayloadError([Diagnostic(code=codes.PAYLOAD_JSON, location=where,
                                       message=f"not a JSON payload: {exc}")]) from None
    if isinstance(data, dict):
        anchor_paths(data, str(p.resolve().parent))  # paths in a payload file are file-relative
    return load_payload(data, name=path), None


def run_replay(args: argparse.Namespace, registry: EngineRegistry, out: Console,
               err: Console) -> int:
    from servesim.engines.kernel.audit import check_invariants
    from servesim.progress import ReplayProgress, replay_size
    from servesim.progress import shown as progress_shown
    from servesim.render import (
        report_summary,
        report_table,
        sla_table,
        speculation_table,
        ttft_breakdown_table,
    )
    from servesim.replay import replay_payload

    output = _output_path(args.output, "-o")
    requests_out = _output_path(args.requests_out, "--requests-out")
    payload, base_dir = load_input(args.input, registry, args.set)
    _not_an_input({"-o": args.output, "--requests-out": args.requests_out},
                  [args.input, *payload_files(payload)])
    progress = ReplayProgress(*replay_size(payload, tuple(registry.trace_formats), base_dir))
    audit = check_invariants() if args.check_invariants else contextlib.nullcontext()
    try:
        with progress_shown(progress, err, quiet=args.quiet), audit, _deadline(args.timeout):
            outcome = replay_payload(payload, registry=registry, base_dir=base_dir,
                                     requests_out=requests_out,
                                     progress=progress.virtual_time,
                                     on_record=progress.request_ended)
    except KeyboardInterrupt as exc:
        kept = f"; finished requests are in {shown(args.requests_out)}" \
            if args.requests_out else ""
        why = f"stopped by --timeout {args.timeout:g}" if isinstance(exc, TimedOut) \
            else "interrupted"
        err.print(f"{why} at {progress.where()}: no report written{kept}")
        return EXIT_INTERRUPTED
    _warn(err, outcome.warnings)
    report = outcome.report
    if report.get("num_requests", 0) and not report.get("completed", 0):
        raise ReplayError([_nothing_completed(args.input, report)])
    text = json.dumps(report, indent=2, sort_keys=True) + "\n"
    if output:
        try:
            _write_output(output, text, "-o")
        except ServesimError:  # the replay is done: its report goes to stdout instead
            out.file.write(text)
            raise
    if args.format == "json":
        out.file.write(text)
    else:
        out.print(report_summary(report, wall_time_ms=outcome.wall_time_ms))
        out.print(report_table(report))
        for extra in (ttft_breakdown_table(report), speculation_table(report),
                      sla_table(report)):
            if extra is not None:
                out.print(extra)
        if args.output:
            err.print(f"wrote {shown(args.output)}")
    return EXIT_OK


def _nothing_completed(where: str, report: dict[str, Any]) -> Diagnostic:
    """A replay in which no request completed: its figures would all be zero."""
    from servesim.render import INCOMPLETE_WHY, REJECTED_WHY

    parts = [f"{report.get(f'{status}_requests', 0)} {status} ({why})"
             for status, why in (("rejected", REJECTED_WHY), ("incomplete", INCOMPLETE_WHY))
             if report.get(f"{status}_requests", 0)]
    return Diagnostic(
        code=codes.NOTHING_COMPLETED, location=where,
        message=f"no request of {report['num_requests']} completed: {'; '.join(parts)}",
        hint="shorten the prompts or raise engine.context_length and the KV cache "
        "(kv_cache.memory_fraction, more GPUs per worker); or let the replay run longer")


def run_calibrate(args: argparse.Namespace, registry: EngineRegistry, out: Console,
                  err: Console) -> int:
    from servesim.calibrate.measurements import read_measurements
    from servesim.calibrate.run import calibrate, document, output_spread
    from servesim.render import calibration_tables

    # the range of traffic.source.output_range_ratio, which it stands for (NaN fails too)
    if args.output_spread is not None and not 0.0 <= args.output_spread <= 1.0:
        raise ServesimError([Diagnostic(
            code=codes.BAD_ARGUMENT, location="--output-spread",
            message=f"must be in [0, 1], got {args.output_spread}",
            hint="0.2 spreads output lengths by +-20%; 0 replays the clients in lockstep")])
    output = _output_path(args.output, "-o")
    assert output is not None
    _not_an_input({"-o": args.output}, [args.config, *args.measurements])
    source = SourceText.from_path(args.config)
    payload: Payload = compile_source(source, registry=registry)
    files = [read_measurements(Path(m)) for m in args.measurements]
    bar = _steps(err, not args.quiet and err.is_terminal)
    with bar:
        result, warnings = calibrate(payload, files, registry=registry,
                                     base_dir=Path(args.config).resolve().parent,
                                     spread=args.output_spread, progress=bar.update)
    doc = document(payload, result, config=args.config, files=files, warnings=warnings,
                   spread=output_spread(payload, args.output_spread))
    text = json.dumps(doc, indent=2, sort_keys=True) + "\n"
    _write_output(output, text, "-o")
    if args.format == "json":
        out.file.write(text)
    else:
        for table in calibration_tables(doc):
            out.print(table)
        err.print(f"wrote {args.output}")
    for warning in warnings:
        err.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    return EXIT_OK


class _steps:
    """A transient progress bar of the replays of each phase of a calibration."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console, self.enabled = console, enabled
        self._bar: Any = None
        self._task: Any = None
        self._phase = ""

    def __enter__(self) -> _steps:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("replaying", total=None)
        return self

    def update(self, phase: str, done: int, total: int) -> None:
        if self._bar is None:
            return
        if phase != self._phase:
            self._phase = phase
            self._bar.reset(self._task, total=total, description=f"replaying: {phase}")
        self._bar.update(self._task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def _output_path(arg: str | None, flag: str) -> Path | None:
    """``arg`` as the file an option writes, checked before any work is done (so that a
    replay's results are not lost to a path that cannot be written): not a folder, a name
    the file system takes, in a folder that exists or can be made and that we may write.
    Nothing is created here: a folder is made only when the output is written."""
    if arg is None:
        return None
    try:
        if not arg:
            raise FileNotFoundError(2, "the path is empty")
        if arg.endswith(("/", os.sep)) or os.path.isdir(arg):
            raise IsADirectoryError(21, "it is a folder")
        target = Path(os.path.realpath(arg))
        if not is_special(target):  # a device or pipe is written in place
            folder = target.parent
            while not folder.exists() and folder != folder.parent:
                folder = folder.parent
            if not folder.is_dir():
                raise NotADirectoryError(20, f"{folder} is not a folder")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise PermissionError(13, f"the folder {folder} is not writable")
            if len(os.fsencode(target.name)) > _name_max(folder):
                raise OSError(36, "the file name is too long")
    except OSError as exc:
        raise _write_error(flag, arg, exc) from None
    return Path(arg)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _not_an_input(outputs: dict[str, str | None], inputs: list[str]) -> None:
    """Refuse an output file that is one of the run's ``inputs`` or another output: writing
    it would destroy what the run reads, or what the other option wrote. Files are compared
    by identity (device and inode), so a hard or symbolic link to an input is that input."""
    reads = ("this run reads this file (its config, payload, trace, timing table or model "
             "config.json): writing it would destroy it")
    seen: dict[object, str] = {identity(p): reads for p in inputs}
    seen.pop(None, None)
    for flag, arg in outputs.items():
        if not arg:
            continue
        key: object = identity(arg) or os.path.realpath(arg)
        problem = seen.get(key)
        if problem:
            raise ServesimError([Diagnostic(
                code=codes.OUTPUT_PATH, location=f"{flag} {arg}", message=problem,
                hint="give the path of another file")])
        seen[key] = f"this is also the {flag} file: one output would overwrite the other"


def _write_error(flag: str, arg: str, exc: OSError) -> ServesimError:
    if exc.errno == errno.ENXIO:  # a FIFO opened without blocking
        problem = "it is a pipe that no process reads"
    else:
        problem = str(exc.strerror or exc)
    return ServesimError([Diagnostic(
        code=codes.OUTPUT_PATH, location=f"{flag} {arg}",
        message=f"cannot write this file: {problem}",
        hint="give the path of a file in a folder you can write")])


def _write_output(path: Path, text: str, flag: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (see :func:`servesim.files.whole_file`)."""
    try:
        with whole_file(path) as f:
            f.write(text)
    except OSError as exc:
        raise _write_error(flag, str(path), exc) from None
