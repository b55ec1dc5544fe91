"""Optional extras: a feature that needs one imports it here, and a user without it is told
what to install instead of getting a traceback."""

from __future__ import annotations

import importlib
from typing import Any

from servesim import codes
from servesim.errors import Diagnostic, ServesimError


def require(module: str, extra: str, feature: str, location: str) -> Any:
    """``module`` imported, or an error saying that ``feature`` needs ``servesim[extra]``."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ServesimError([Diagnostic(
            code=codes.MISSING_EXTRA, location=location,
            message=f"{feature} needs {module.split('.')[0]}, which is not installed",
            hint=f"pip install 'servesim[{extra}]'")]) from None
