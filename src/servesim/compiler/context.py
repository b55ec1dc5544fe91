"""What every pass may consult besides its input: the engine registry."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    from servesim.plugins.manager import EngineRegistry


@attrs.frozen
class CompileContext:
    registry: EngineRegistry | None = None
    base_dir: Path | None = None  # relative trace paths resolve against the config's folder
