"""The ``servesim`` command's entry point: :func:`servesim.cli.main`, imported only once
it runs, so that Ctrl-C while the CLI's modules load ends the command like Ctrl-C later
(exit 130, no traceback)."""

from __future__ import annotations

import sys


def run() -> int:
    try:
        from servesim.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        return 130
    return main()
