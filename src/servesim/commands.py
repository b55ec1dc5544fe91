"""Every ``servesim`` command: its help line, and where its arguments and its handler are
defined. The core (``compile`` ... ``calibrate``) is :mod:`servesim.cli`'s; beside it,
``models``, ``gpus`` and ``init`` (what is known, and a starter config), and ``sweep``,
``search`` and ``report`` (which deployment?).

A command's module is imported only when that command runs or prints its ``--help``:
``servesim --help`` imports none of them (:mod:`servesim.arguments`).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple


class Command(NamedTuple):
    """A command: its one-line help, and where its arguments and its handler are defined
    (``module:function``)."""

    help: str
    arguments: str
    handler: str


def load(ref: str) -> Any:
    """The function ``module:function`` names, its module imported."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _command(help: str, arguments: str, handler: str) -> Command:
    return Command(help, f"servesim.{arguments}", f"servesim.{handler}")


COMMANDS = {
    "compile": _command("compile a TOML config into an engine payload",
                        "arguments:compile_arguments", "cli:run_compile"),
    "validate": _command("check a config, and the trace and timing tables it names, without "
                         "writing a payload", "arguments:validate_arguments", "cli:run_validate"),
    "inspect": _command("show every resolved value and where it came from",
                        "arguments:inspect_arguments", "cli:run_inspect"),
    "schema": _command("print a JSON Schema", "arguments:schema_arguments", "cli:run_schema"),
    "plugins": _command("list registered engines, backends, timing providers and trace "
                        "formats, and where they come from",
                        "arguments:plugins_arguments", "cli:run_plugins"),
    "replay": _command("replay the traffic of a config or payload",
                       "arguments:replay_arguments", "cli:run_replay"),
    "calibrate": _command("fit the config's timing to measured benchmark results and write a "
                          "calibration file", "arguments:calibrate_arguments",
                          "cli:run_calibrate"),
    "models": _command("list the known model ids (shipped configs and aliases)",
                       "catalog_command:model_arguments", "catalog_command:run_models"),
    "gpus": _command("list the known GPUs (engine.hardware names)",
                     "catalog_command:gpu_arguments", "catalog_command:run_gpus"),
    "init": _command("write a commented starter config for a model and a GPU",
                     "init_command:add_arguments", "init_command:run_init"),
    "sweep": _command("replay every combination of config values; one row per point",
                      "sweep.command:add_arguments", "sweep.command:run_sweep"),
    "search": _command("find the deployment that maximises an objective under SLA "
                       "constraints (servesim[search], Optuna)",
                       "search.command:add_arguments", "search.command:run_search"),
    "report": _command("write an HTML report of sweep/search results or of a replay "
                       "(servesim[report])", "report.command:add_arguments",
                       "report.command:run_report"),
}
