"""``python -m servesim``."""

from servesim.console import run

raise SystemExit(run())
