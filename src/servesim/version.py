"""servesim's version: written into every payload and report (``servesim_version``)."""

__version__ = "0.1.0"
