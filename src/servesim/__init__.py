"""servesim: a GPU-free simulator of LLM serving deployments."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
