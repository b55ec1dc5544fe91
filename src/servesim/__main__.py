"""``python -m servesim``."""

from servesim.cli import main

raise SystemExit(main())
