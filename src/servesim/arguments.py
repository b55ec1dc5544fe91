"""The command line's grammar: ``servesim``'s parser, and each command's arguments.

Light to import: a command's arguments are declared (its module imported) only when that
command parses or prints its help, so ``servesim --help`` loads neither rich nor the
compiler (the entry point, :mod:`servesim.console`, parses before it imports
:mod:`servesim.cli`). The commands are listed in :mod:`servesim.commands`.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from servesim.commands import COMMANDS, load
from servesim.version import __version__

MAX_TIMEOUT_S = 1e7  # (past the timer's range; 115 days)
CONFIG = "examples/configs/qwen3_32b_h200.toml"
# what each command's --help ends with
EXAMPLES = {
    "compile": f"servesim compile {CONFIG} -o payload.json",
    "validate": f"servesim validate {CONFIG} --set traffic.load.concurrency=64",
    "inspect": f"servesim inspect {CONFIG} --format json",
    "schema": "servesim schema config > servesim.schema.json",
    "plugins": "servesim plugins --format json",
    "replay": f"servesim replay {CONFIG} -o report.json --requests-out requests.jsonl",
    "calibrate": f"servesim calibrate {CONFIG} bench_result.json -o calibrated.json",
    "sweep": f"servesim sweep {CONFIG} --set engine.workers.aggregated.parallelism.tensor=1,2,4 "
             "-o results.jsonl",
    "search": "servesim search examples/configs/llama70b_planner.toml "
              "--space examples/search/planner.toml",
    "report": "servesim report results.jsonl -o report.html",
    "models": "servesim models llama-3.1 --format json",
    "gpus": "servesim gpus --format json",
    "init": "servesim init --model meta-llama/Llama-3.1-8B-Instruct --gpu h100_sxm --out my.toml",
}


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: its arguments are declared when it parses or prints help."""

    arguments = ""  # ``module:function`` declaring them; emptied once they are

    def _declare(self) -> None:
        if self.arguments:
            declare, self.arguments = load(self.arguments), ""
            declare(self)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._declare()
        return super().parse_known_args(*args, **kwargs)

    def format_usage(self) -> str:
        self._declare()
        return super().format_usage()

    def format_help(self) -> str:
        self._declare()
        return super().format_help()


class _Version(argparse.Action):
    """``--version``: the release, and the build, looked up only when asked."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0,
                         help="show the version and the build, and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        from servesim.build_info import build

        sys.stdout.write(f"servesim {__version__} ({build()})\n")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    """``servesim``'s parser, every command's included."""
    p = argparse.ArgumentParser(prog="servesim", description="GPU-free LLM serving simulator.",
                                epilog=f"example:\n  {EXAMPLES['replay']}",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action=_Version)
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                   help="import MODULE and register it as a plugin (repeatable)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                           parser_class=_CommandParser)
    for name, command in COMMANDS.items():
        command_parser = sub.add_parser(name, help=command.help,
                                        epilog=f"example:\n  {EXAMPLES[name]}",
                                        formatter_class=argparse.RawDescriptionHelpFormatter)
        command_parser.arguments = command.arguments
    return p


def compile_arguments(c: argparse.ArgumentParser) -> None:
    from servesim.compiler.pipeline import STAGES

    c.add_argument("config", help="config file (TOML)")
    c.add_argument("-o", "--output", help="write the payload here (default: stdout)")
    c.add_argument("--stop-after", choices=STAGES, default="lower",
                   help="stop after this stage and print its result")
    c.add_argument("--format", choices=("json", "text"), default="json")
    add_set_option(c)


def validate_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("config")
    v.add_argument("--format", choices=("text", "json"), default="text",
                   help="text, or the result, diagnostics and warnings as JSON on stdout "
                   "(exit codes unchanged)")
    add_set_option(v)


def inspect_arguments(i: argparse.ArgumentParser) -> None:
    i.add_argument("config")
    i.add_argument("--format", choices=("text", "json"), default="text")
    add_set_option(i)


def schema_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("which", choices=("config", "payload"))


def plugins_arguments(pl: argparse.ArgumentParser) -> None:
    pl.add_argument("--format", choices=("text", "json"), default="text")


def replay_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument("input", help="config (.toml) or payload (.json)")
    r.add_argument("-o", "--output", help="write the report (JSON) here")
    r.add_argument("--requests-out", help="write one JSON line per request here")
    r.add_argument("--format", choices=("text", "json"), default="text",
                   help="stdout format: a summary table, or the report as JSON")
    r.add_argument("--quiet", action="store_true", help="no progress bar")
    r.add_argument("--timeout", type=_seconds, metavar="SECONDS",
                   help="stop the replay after this much wall-clock time, as Ctrl-C does "
                   "(exit 130, no report; finished requests are kept in --requests-out)")
    r.add_argument("--check-invariants", action="store_true",
                   help="audit block reference counts, pool totals, queues, virtual time and "
                   "terminal states at every step (slower; also SERVESIM_CHECK_INVARIANTS=1)")
    add_set_option(r)


def calibrate_arguments(cal: argparse.ArgumentParser) -> None:
    cal.add_argument("config", help="config file (TOML): the deployment that was measured")
    cal.add_argument("measurements", nargs="+", metavar="MEASUREMENTS",
                     help="CSV in silicon_dev.csv's columns, vllm bench serve result JSON, "
                     "or AIPerf / GenAI-Perf profile export JSON")
    cal.add_argument("-o", "--output", required=True,
                     help="write the calibration file (JSON) here")
    cal.add_argument("--format", choices=("text", "json"), default="text",
                     help="stdout format: tables, or the calibration file")
    cal.add_argument("--output-spread", type=float, default=None, metavar="FRACTION",
                     help="spread the replayed output lengths uniformly over mean x (1 +- "
                     "FRACTION), as a benchmark's clients drift apart (0: in lockstep; "
                     "default: the config's traffic.source.output_range_ratio, else 0.2)")
    cal.add_argument("--quiet", action="store_true", help="no progress bar")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"expected a number of seconds in (0, "
                                         f"{MAX_TIMEOUT_S:g}], got {text!r}")
    return value


def add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="set a config value: KEY a dotted path, VALUE a TOML value "
                        "(repeatable; a later one wins)")
