"""Calibration files: a config's role reads its values, inspect shows where they came from,
the replay applies them, and every bad file gets a diagnostic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim.cli import main
from servesim.compiler import compile_file
from servesim.errors import CompileError
from servesim.payload import CalibrationArgs, dump_payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.timing.calibration import CalibratedTimer, calibration_document
from servesim.timing.fixed import FixedTimer

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated.timing]
type = "default"
calibration = "cal/calibrated.json"
[traffic.source]
type = "synthetic"
input_tokens = 512
output_tokens = 16
[traffic.load]
type = "concurrency"
concurrency = 4
[traffic.stop]
requests = 12
"""
VALUES = {"prefill_scale": 1.25, "decode_scale": 0.8, "decode_step_ms": 0.5,
          "front_end_ms": 7.0, "front_end_ms_per_1k_tokens": 2.0}


def document(**change: Any) -> dict[str, Any]:
    doc = calibration_document(
        {"aggregated": ("default", CalibrationArgs(**VALUES), ["prefill_scale"])},
        {"servesim_version": "0.1.0"})
    doc.update(change)
    return doc


@pytest.fixture
def config(tmp_path: Path) -> Path:
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "calibrated.json").write_text(json.dumps(document()))
    path = tmp_path / "deploy.toml"
    path.write_text(CONFIG)
    return path


def test_a_role_reads_its_values_relative_to_the_config(config: Path) -> None:
    payload = compile_file(str(config), registry=REGISTRY)
    c = payload.roles["aggregated"].timing.calibration
    assert c is not None
    assert {k: getattr(c, k) for k in VALUES} == VALUES
    assert c.file == "calibrated.json" and c.sha256 is not None and len(c.sha256) == 64
    # the payload carries the values, not the path: it replays without the file
    data = json.loads(dump_payload(payload))
    assert data["roles"]["aggregated"]["timing"]["calibration"]["prefill_scale"] == 1.25


def test_inspect_shows_calibrated_values_as_derived_from_their_file(
        config: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["inspect", str(config)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "prefill_scale" in x)
    assert "1.25" in line and "derived" in line and "calibrated.json" in line
    assert main(["inspect", str(config), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    key = "engine.workers.aggregated.timing.calibration.decode_scale"
    assert data["provenance"][key]["origin"] == "derived"
    assert "calibrated.json" in data["provenance"][key]["formula"]


def test_the_replay_applies_the_calibration(config: Path) -> None:
    from servesim.replay import replay

    calibrated = replay(compile_file(str(config), registry=REGISTRY))
    config.write_text(CONFIG.replace('calibration = "cal/calibrated.json"', ""))
    plain = replay(compile_file(str(config), registry=REGISTRY))
    assert calibrated["mean_ttft_ms"] > plain["mean_ttft_ms"] + 7.0  # front end, slower prompts
    assert calibrated["mean_tpot_ms"] < plain["mean_tpot_ms"]  # decode x 0.8 + 0.5 ms


def test_calibrated_timer_arithmetic() -> None:
    timer = CalibratedTimer(FixedTimer(prefill_ms=10.0, decode_ms=4.0),
                            CalibrationArgs(**VALUES))
    assert timer.prefill_ms(2, 100.0, 0.0) == pytest.approx(12.5)
    assert timer.decode_ms(3, 300, 100.0, 300) == pytest.approx(4.0 * 0.8 + 0.5)
    assert timer.decode_ms(0, 0, 0.0, 0) == 0.0  # an empty half stays free
    assert timer.request_ms(1000) == pytest.approx(7.0 + 2.0)
    negative = CalibratedTimer(FixedTimer(prefill_ms=10.0, decode_ms=4.0),
                               CalibrationArgs(front_end_ms=-50.0, decode_step_ms=-9.0))
    assert negative.request_ms(10) == 0.0 and negative.decode_ms(1, 1, 1.0, 1) == 0.0


BAD_FILES: list[tuple[str, str | bytes, str]] = [
    ("not json", "{", "is not JSON"),
    ("empty", "", "is empty"),
    ("a list", "[]", "must hold a JSON object"),
    ("another format", json.dumps({"format": "x"}), "is not a servesim calibration file"),
    ("newer version", json.dumps(document(version=2)), "calibration format version 2"),
    ("no roles", json.dumps(document(roles={})), "no \"roles\" object"),
    ("other role", json.dumps(document(roles={"decode": document()["roles"]["aggregated"]})),
     "holds no values for the 'aggregated' role (it has: decode)"),
    ("other timing", json.dumps(document(roles={"aggregated": {
        **document()["roles"]["aggregated"], "timing_type": "table"}})),
     "was fitted for 'table' timing, but this role uses 'default' timing"),
    ("unknown value", json.dumps(document(roles={"aggregated": {
        "timing_type": "default", "values": {"prefil_scale": 1.0}}})),
     "unknown key 'prefil_scale'"),
    ("nan value", json.dumps(document(roles={"aggregated": {
        "timing_type": "default", "values": {"decode_scale": float("nan")}}})),
     "values.decode_scale must be a finite number, got nan"),
    ("string value", json.dumps(document(roles={"aggregated": {
        "timing_type": "default", "values": {"decode_scale": "1"}}})),
     "values.decode_scale must be a finite number, got '1'"),
    ("zero scale", json.dumps(document(roles={"aggregated": {
        "timing_type": "default", "values": {"prefill_scale": 0}}})),
     "values.prefill_scale must be in [0.01, 100], got 0"),
    ("huge offset", json.dumps(document(roles={"aggregated": {
        "timing_type": "default", "values": {"front_end_ms": 1e30}}})),
     "values.front_end_ms must be in [-1000000, 1000000]"),
    ("not utf-8", b"\xff\xff", "is not JSON"),
]


@pytest.mark.parametrize(("content", "message"), [(c, m) for _, c, m in BAD_FILES],
                         ids=[name for name, _, _ in BAD_FILES])
def test_every_bad_calibration_file_gets_a_diagnostic(config: Path, content: str | bytes,
                                                      message: str) -> None:
    target = config.parent / "cal" / "calibrated.json"
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content)
    with pytest.raises(CompileError) as info:
        compile_file(str(config), registry=REGISTRY)
    (d,) = info.value.diagnostics
    assert d.code == "timing-calibration"
    assert d.path == ("engine", "workers", "aggregated", "timing", "calibration")
    assert message in d.message


def test_a_missing_calibration_file_is_named_relative_to_the_config(
        config: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (config.parent / "cal" / "calibrated.json").unlink()
    assert main(["validate", str(config)]) == 1
    err = capsys.readouterr().err
    assert "engine.workers.aggregated.timing.calibration: calibration file" in err
    assert "not found" in err and "relative to the config" in err
