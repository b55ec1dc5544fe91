"""The commands that answer "which deployment?": ``sweep``, ``search`` and ``report``.

They live beside :mod:`servesim.cli`, which registers their parsers and handlers here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def add_parsers(sub: Any) -> None:
    from servesim.report.command import add_parser as add_report
    from servesim.search.command import add_parser as add_search
    from servesim.sweep.command import add_parser as add_sweep

    add_sweep(sub)
    add_search(sub)
    add_report(sub)


def handlers() -> dict[str, Callable[..., int]]:
    from servesim.report.command import run_report
    from servesim.search.command import run_search
    from servesim.sweep.command import run_sweep

    return {"sweep": run_sweep, "search": run_search, "report": run_report}
