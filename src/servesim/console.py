"""The ``servesim`` command's entry point.

The command line is parsed before :mod:`servesim.cli` is imported: ``--help``,
``--version`` and a usage error import none of the compiler, the engines or rich. Ctrl-C
while the modules load ends the command like Ctrl-C later (exit 130, no traceback).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def open_closed_streams() -> None:
    """A standard stream the caller closed (``>&-``) writes to the null device."""
    for stream in ("stdout", "stderr"):
        if getattr(sys, stream) is None:
            setattr(sys, stream, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); its exit code."""
    open_closed_streams()
    try:
        from servesim.arguments import parser

        args = parser().parse_args(argv)
        from servesim.cli import run as run_command
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return run_command(args)
