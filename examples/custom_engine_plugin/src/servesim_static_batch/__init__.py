"""servesim-static-batch: an example servesim plugin (a static-batching engine).

Installed, it registers through the ``servesim`` entry-point group (see
``pyproject.toml``); :mod:`servesim_static_batch.plugin` holds the hook implementations.
"""

from servesim_static_batch.engine import StaticBatchEngine, StaticBatchOptions

__version__ = "0.1.0"
__all__ = ["StaticBatchEngine", "StaticBatchOptions", "__version__"]
