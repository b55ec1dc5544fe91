"""``servesim calibrate``: the command, its file, its warnings and its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim import __version__
from servesim.cli import main
from servesim.compiler import compile_file
from servesim.plugins.manager import EngineRegistry, get_plugin_manager

DATA = Path(__file__).resolve().parent / "data"
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated.parallelism]
tensor = {tp}
[engine.workers.aggregated.timing]
type = "{timing}"
"""
FILES = ("vllm_bench_serve.json", "profile_export_aiperf.json")


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    # the fixtures at small loads (every replay of the suite runs under the auditor)
    vllm = json.loads((DATA / FILES[0]).read_text())
    vllm.update(max_concurrency=2, completed=8, total_input_tokens=8 * 1024,
                total_output_tokens=8 * 32, mean_ttft_ms=140.0, mean_tpot_ms=16.5)
    (tmp_path / FILES[0]).write_text(json.dumps(vllm, indent=2))
    aiperf = json.loads((DATA / FILES[1]).read_text())
    aiperf["input_config"]["loadgen"]["concurrency"] = 6
    aiperf["request_count"]["avg"] = 18
    aiperf["output_sequence_length"]["avg"] = 32
    aiperf["time_to_first_token"]["avg"] = 190.0
    aiperf["inter_token_latency"]["avg"] = 19.0
    (tmp_path / FILES[1]).write_text(json.dumps(aiperf, indent=2))
    return tmp_path


def config(tp: int = 2, timing: str = "default") -> str:
    Path("deploy.toml").write_text(CONFIG.format(tp=tp, timing=timing))
    return "deploy.toml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_calibrate_writes_a_versioned_file_with_provenance_a_config_can_use(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "calibrate", config(), *FILES, "-o", "cal.json")
    assert code == 0, err
    doc = json.loads(Path("cal.json").read_text())
    assert (doc["format"], doc["version"], doc["servesim_version"]) == (
        "servesim-calibration", 1, __version__)
    assert doc["config"]["file"] == "deploy.toml"
    assert doc["fit"]["output_spread"] == 0.2  # the config sets no output_range_ratio
    assert [(m["file"], m["format"], m["points"]) for m in doc["measurements"]] == [
        ("vllm_bench_serve.json", "vllm-bench-serve", 1),
        ("profile_export_aiperf.json", "profile-export", 1)]
    import hashlib

    assert doc["measurements"][0]["sha256"] == hashlib.sha256(
        Path(FILES[0]).read_bytes()).hexdigest()
    role = doc["roles"]["aggregated"]
    assert role["timing_type"] == "default"
    assert {"prefill_scale", "decode_scale", "front_end_ms"} <= set(role["fitted"])
    fit = doc["fit"]
    assert len(fit["points"]) == 2 and fit["points"][0]["cross_validated"] is not None
    assert fit["after"]["ttft_mape_percent"] < fit["before"]["ttft_mape_percent"]
    # the report: per point and overall, before / after / cross-validated
    assert "error per measured point" in out and "cross-validated" in out
    assert "wrote cal.json" in err
    assert "warning: 2 points over 2 loads: a fixed time per decode pass is not fitted" in err
    # a config uses it
    Path("deploy.toml").write_text(CONFIG.format(tp=2, timing="default")
                                   + 'calibration = "cal.json"\n')
    calibration = compile_file("deploy.toml", registry=REGISTRY).roles[
        "aggregated"].timing.calibration
    assert calibration is not None
    assert calibration.prefill_scale == role["values"]["prefill_scale"]


def test_calibrate_is_deterministic_and_json_output_is_the_file(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "calibrate", config(), *FILES, "-o", "a.json", "--quiet",
                       "--format", "json")
    assert code == 0
    assert out == Path("a.json").read_text()
    assert run(capsys, "calibrate", config(), *FILES, "-o", "b.json")[0] == 0
    assert Path("a.json").read_bytes() == Path("b.json").read_bytes()


def test_a_deployment_other_than_the_configs_is_named(
        capsys: pytest.CaptureFixture[str]) -> None:
    header, row = (DATA / "silicon_rows.csv").read_text().splitlines()[:2]
    Path("rows.csv").write_text(header + "\n" + row.replace(",1024,128,", ",256,8,")
                                .replace("silicon_concurrency=8", "silicon_concurrency=2")
                                + "\n")
    code, _, err = run(capsys, "calibrate", config(tp=4), "rows.csv", "-o", "cal.json")
    assert code == 0
    assert "record tp_size '2', the config '4': replayed with the config's" in err


@pytest.mark.parametrize(("argv", "message"), [
    (("calibrate", "deploy.toml", FILES[0], "-o", FILES[0]), "this run reads this file"),
    (("calibrate", "deploy.toml", FILES[0], "-o", "deploy.toml"), "this run reads this file"),
    (("calibrate", "deploy.toml", "missing.json", "-o", "cal.json"),
     "missing.json: file not found"),
    (("calibrate", "deploy.toml", "deploy.toml", "-o", "cal.json"), "not valid JSON"),
    (("calibrate", "deploy.toml", FILES[0], "-o", "cal.json", "--output-spread", "nan"),
     "--output-spread: must be in [0, 1], got nan"),
    (("calibrate", "deploy.toml", FILES[0], "-o", "cal.json", "--output-spread", "1.5"),
     "--output-spread: must be in [0, 1], got 1.5"),
    (("calibrate", "deploy.toml", FILES[0], "-o", "cal.json", "--output-spread", "-0.1"),
     "--output-spread: must be in [0, 1], got -0.1"),
])
def test_bad_input_gets_a_diagnostic_and_writes_nothing(
        capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    config()
    before = {p.name: p.read_bytes() for p in Path().iterdir()}
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert message in err
    assert "Traceback" not in err
    assert {p.name: p.read_bytes() for p in Path().iterdir()} == before


def test_too_many_points_are_refused_before_any_replay(
        capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(Path(FILES[0]).read_text())
    Path("many.json").write_text(json.dumps([doc] * 201))
    code, _, err = run(capsys, "calibrate", config(), "many.json", "-o", "cal.json")
    assert code == 1 and "201 measured points; calibrate on at most 200" in err
    assert not Path("cal.json").exists()


def test_fixed_timing_has_nothing_to_calibrate(capsys: pytest.CaptureFixture[str]) -> None:
    Path("deploy.toml").write_text(CONFIG.format(tp=2, timing="fixed")
                                   + "prefill_ms = 10\ndecode_ms = 5\n")
    code, _, err = run(capsys, "calibrate", "deploy.toml", FILES[0], "-o", "cal.json")
    assert code == 1
    assert "fixed timing has nothing to calibrate" in err and not Path("cal.json").exists()


def test_output_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "calibrate", config(), FILES[0])
    assert code == 2 and "-o/--output" in err


PD = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.prefill.parallelism]
tensor = 2
[engine.workers.prefill.timing]
type = "default"
{extra}
[engine.workers.decode.parallelism]
tensor = 2
[engine.workers.decode.timing]
type = "default"
{extra}
[engine.kv_transfer]
bandwidth_gb_per_second = 50.0
"""


def test_a_disaggregated_deployment_calibrates_each_pool(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("pd.toml").write_text(PD.format(extra=""))
    code, _, err = run(capsys, "calibrate", "pd.toml", *FILES, "-o", "pd.json", "--quiet")
    assert code == 0, err
    roles = json.loads(Path("pd.json").read_text())["roles"]
    # each pool fits its own work (whether the front end is determined too depends on how
    # much of the measured TTFT the prefill explains at the shipped constants)
    assert roles["prefill"]["fitted"][0] == "prefill_scale"
    assert set(roles["prefill"]["fitted"]) <= {"prefill_scale", "front_end_ms"}
    assert roles["decode"]["fitted"] == ["decode_scale"]
    Path("pd.toml").write_text(PD.format(extra='calibration = "pd.json"'))
    payload = compile_file("pd.toml", registry=REGISTRY)
    decode = payload.roles["decode"].timing.calibration
    assert decode is not None and decode.decode_scale == roles["decode"]["values"][
        "decode_scale"]
