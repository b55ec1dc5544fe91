"""The commands beside the compile/replay core: ``models``, ``gpus`` and ``init`` (what is
known, and a starter config), and ``sweep``, ``search`` and ``report`` (which deployment?).

They live beside :mod:`servesim.cli`, which registers their parsers and handlers here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def add_parsers(sub: Any) -> None:
    from servesim.catalog_command import add_parsers as add_catalog
    from servesim.init_command import add_parser as add_init
    from servesim.report.command import add_parser as add_report
    from servesim.search.command import add_parser as add_search
    from servesim.sweep.command import add_parser as add_sweep

    add_catalog(sub)
    add_init(sub)
    add_sweep(sub)
    add_search(sub)
    add_report(sub)


def handlers() -> dict[str, Callable[..., int]]:
    from servesim.catalog_command import run_gpus, run_models
    from servesim.init_command import run_init
    from servesim.report.command import run_report
    from servesim.search.command import run_search
    from servesim.sweep.command import run_sweep

    return {"models": run_models, "gpus": run_gpus, "init": run_init, "sweep": run_sweep,
            "search": run_search, "report": run_report}
