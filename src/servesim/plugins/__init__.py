"""Plugin plumbing: hookspecs, the manager factory, the engine registry."""

from servesim.plugins.hookspecs import hookimpl

__all__ = ["hookimpl"]
