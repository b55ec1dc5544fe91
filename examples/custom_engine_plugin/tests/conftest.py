"""The plugin under test, for servesim's fixtures (``servesim.testing``).

servesim's pytest plugin is loaded automatically where servesim is installed; its
fixtures (``compile_toml``, ``replay_toml``, ``servesim_cli``, ...) use the plugins this
fixture returns, with entry-point autoloading off.
"""

from __future__ import annotations

from types import ModuleType

import pytest


@pytest.fixture
def servesim_plugins() -> list[ModuleType]:
    plugin = pytest.importorskip(
        "servesim_static_batch.plugin",
        reason="the example plugin is not installed: pip install -e examples/custom_engine_plugin")
    return [plugin]
