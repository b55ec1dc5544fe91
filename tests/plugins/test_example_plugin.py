"""The installable example plugin (examples/custom_engine_plugin), found through its entry
point exactly as a user's package would be. CI installs it; without it these tests skip."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim.plugins.manager import EngineRegistry, get_plugin_manager

pytest.importorskip(
    "servesim_static_batch",
    reason="the example plugin is not installed: pip install -e examples/custom_engine_plugin")

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "examples" / "custom_engine_plugin" / "configs"


def test_the_entry_point_registers_the_example(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    registry = EngineRegistry.collect(get_plugin_manager())
    assert registry.origin("static-batch") == "static_batch"
    source = registry.source("static_batch")
    assert (source.kind, source.package) == ("entry-point", "servesim-static-batch 0.1.0")
    assert "linear" in registry.timing_providers and "csv" in registry.trace_formats


@pytest.mark.parametrize("config", ["static_batch.toml", "csv_trace.toml"])
def test_servesim_replays_with_the_installed_plugin(config: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SERVESIM_DISABLE_PLUGIN_AUTOLOAD"}
    done = subprocess.run(
        [sys.executable, "-m", "servesim", "replay", str(CONFIGS / config), "--quiet",
         "--format", "json", "--requests-out", str(tmp_path / "requests.jsonl")],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    report = json.loads(done.stdout)
    assert report["engine"] == "static-batch"
    assert report["completed_requests"] == report["num_requests"] > 0
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    assert len(lines) == report["num_requests"]


def test_without_autoload_the_engine_is_unknown(tmp_path: Path) -> None:
    env = {**os.environ, "SERVESIM_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "servesim", "validate", str(CONFIGS / "static_batch.toml")],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path)
    assert done.returncode == 1
    assert "engine.engine: unknown engine 'static-batch' (registered: disagg, vllm) " \
        "[unknown-engine]" in done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "servesim", "--plugin", "servesim_static_batch.plugin",
         "validate", str(CONFIGS / "static_batch.toml")],
        capture_output=True, text=True, check=False, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
