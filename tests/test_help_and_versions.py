"""What the command line says about itself: help examples, versions, validate as JSON,
plugin tracebacks on request, untruncated tables; and the replay API's one return type."""

from __future__ import annotations

import json
import platform
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import servesim
from servesim.arguments import EXAMPLES, parser
from servesim.build_info import build
from servesim.cli import main
from servesim.compiler import compile_file
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.replay import ReplayOutcome, replay, replay_payload

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "configs" / "qwen3_32b_h200.toml"
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
SMALL = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
         "[engine.workers.aggregated]\n[traffic.stop]\nrequests = 4\n")
BROKEN_PLUGIN = '''
import servesim

def deep():
    raise ValueError("the plugin's own bug")

@servesim.hookimpl
def servesim_register_engines():
    deep()
'''


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # --help, --version
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _plain(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", "1")


def commands() -> list[str]:
    sub = next(a for a in parser()._actions if a.dest == "command")
    return sorted(sub.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize("command", commands())
def test_every_command_help_ends_with_an_example_of_that_command(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, command, "--help")
    assert code == 0
    last = out.rstrip().splitlines()[-2:]
    assert last[0] == "example:"
    argv = shlex.split(last[1])
    assert argv[:2] == ["servesim", command]


def test_the_top_level_help_ends_with_an_example(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "--help")
    assert code == 0
    assert out.rstrip().splitlines()[-2:] == ["example:", f"  {EXAMPLES['replay']}"]


@pytest.mark.parametrize("command", ["compile", "validate", "inspect", "replay", "sweep"])
def test_the_help_examples_parse_and_name_a_shipped_config(command: str) -> None:
    argv = shlex.split(EXAMPLES[command])[1:]
    args = parser().parse_args(argv)
    assert args.command == command
    assert (REPO / argv[1]).is_file()


# what the help and a usage error need none of: rich, the IR's libraries, the plugin
# manager, the compiler, the engines, the commands' modules
HEAVY = ("rich", "attr", "attrs", "cattrs", "pluggy", "servesim.cli", "servesim.compiler",
         "servesim.engines", "servesim.errors", "servesim.payload", "servesim.catalog",
         "servesim.sweep", "servesim.search", "servesim.report", "servesim.init_command")
IMPORTED = """
import sys
from servesim.console import run
try:
    run()
except SystemExit:
    pass
print(" ".join(sorted(sys.modules)))
"""


@pytest.mark.parametrize("argv", [["--help"], ["replay", "--help"], ["no-such-command"]])
def test_the_entry_point_prints_help_or_a_usage_error_without_the_heavy_modules(
        argv: list[str]) -> None:
    done = subprocess.run([sys.executable, "-c", IMPORTED, *argv], capture_output=True,
                          text=True, check=True)
    loaded = done.stdout.split()
    assert "servesim.arguments" in loaded
    assert [m for m in loaded if m.split(".")[0] in HEAVY or m.startswith(HEAVY)] == []


def test_a_command_imports_its_module_when_it_runs() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORTED, "gpus", "--format", "json"],
                          capture_output=True, text=True, check=True)
    loaded = done.stdout.split()
    assert "servesim.catalog_command" in loaded and "servesim.sweep.command" not in loaded


def test_version_names_the_release_the_build_and_the_python(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"servesim {servesim.__version__} ({build()})"
    assert platform.python_version() in out
    from servesim.engines.kernel import core

    compiled = not (core.__file__ or "").endswith(".py")
    assert ("compiled build (mypyc)" if compiled else "pure-Python build") in out


def test_validate_as_json_reports_a_valid_config(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", str(CONFIG), "--format", "json")
    assert (code, err) == (0, "")
    doc = json.loads(out)
    assert doc["valid"] is True and doc["engine"] == "vllm"
    assert doc["roles"] == ["aggregated"] and doc["diagnostics"] == []


def test_validate_as_json_lists_every_error_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.replace("[engine.workers.aggregated]\n",
                                 "[engine.workers.aggregated.kv_cache]\nblock_size = 0\n"
                                 "prefix_caching = 3\n"), encoding="utf-8")
    code, out, err = run(capsys, "validate", str(bad), "--format", "json")
    assert (code, err) == (1, "")
    doc = json.loads(out)
    assert doc["valid"] is False and doc["engine"] is None
    wheres = sorted(d["where"] for d in doc["diagnostics"])
    assert wheres == ["engine.workers.aggregated.kv_cache.prefix_caching"]
    # (a type error stops the parse before the range checks, as in text mode)
    code, text_out, text_err = run(capsys, "validate", str(bad))
    assert (code, text_out) == (1, "")
    assert doc["diagnostics"][0]["message"] in text_err


def test_validate_as_json_carries_the_warnings(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "measured.toml"
    cfg.write_text(SMALL.replace("hardware = \"h200_sxm\"", "hardware = \"h100_sxm\"")
                   .replace("[engine.workers.aggregated]\n",
                            "[engine.workers.aggregated.timing]\ntype = \"measured\"\n"),
                   encoding="utf-8")
    code, out, err = run(capsys, "validate", str(cfg), "--format", "json")
    text_code, _out, text_err = run(capsys, "validate", str(cfg))
    doc = json.loads(out)
    assert code == text_code == 0 and err == ""
    assert [f"warning: {w['where']}: {w['message']} [{w['code']}]" for w in doc["warnings"]] \
        == [line for line in text_err.splitlines() if line.startswith("warning:")]


@pytest.fixture
def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "broken_plugin_mod.py").write_text(BROKEN_PLUGIN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "broken_plugin_mod"


def test_a_plugin_error_is_one_diagnostic_naming_the_traceback_switch(
        broken_plugin: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--plugin", broken_plugin, "plugins")
    assert (code, out) == (1, "")
    assert "Traceback" not in err
    assert "ValueError: the plugin's own bug" in err
    assert "SERVESIM_TRACEBACK=1 shows the full traceback" in " ".join(err.split())


def test_servesim_traceback_shows_the_plugin_traceback(
        broken_plugin: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SERVESIM_TRACEBACK", "1")
    code, out, err = run(capsys, "--plugin", broken_plugin, "plugins")
    assert (code, out) == (1, "")
    diagnostic, trace = err.split("Traceback (most recent call last):")
    assert "[plugin-error]" in diagnostic
    assert "in deep" in trace and "broken_plugin_mod.py" in trace
    assert trace.rstrip().endswith("ValueError: the plugin's own bug")


def test_plugins_table_is_not_cut_when_piped(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run(capsys, "plugins")
    assert code == 0
    lines = out.splitlines()
    for name, backend, _plugin in REGISTRY.backend_items():
        row = [line for line in lines if f" {name} " in line and "backend" in line]
        assert len(row) == 1 and backend.DESCRIPTION in row[0]
    assert max(len(line.rstrip()) for line in lines) > 80  # wider than the 80 columns


@pytest.fixture
def small(tmp_path: Path) -> str:
    (tmp_path / "small.toml").write_text(SMALL, encoding="utf-8")
    return str(tmp_path / "small.toml")


def test_replay_and_replay_payload_return_the_same_type(small: str) -> None:
    payload = compile_file(small, registry=REGISTRY)
    simple = replay(payload, registry=REGISTRY)
    full = replay_payload(payload, registry=REGISTRY)
    assert type(simple) is type(full) is ReplayOutcome
    assert simple.report == full.report
    assert servesim.replay_payload is replay_payload and servesim.ReplayOutcome is ReplayOutcome


def test_servesim_replay_replays_once_its_module_is_imported(small: str) -> None:
    """Importing the module ``servesim.replay`` makes it the package's attribute ``replay``,
    over the exported function: it replays too."""
    import servesim.replay

    payload = compile_file(small, registry=REGISTRY)
    outcome = servesim.replay(payload, registry=REGISTRY)  # type: ignore[operator]
    assert isinstance(outcome, ReplayOutcome)
    assert outcome.report == replay(payload, registry=REGISTRY).report


def test_the_outcome_still_reads_as_the_report_dict(small: str) -> None:
    """Compatible with the dict ``replay`` returned before."""
    outcome = replay(compile_file(small, registry=REGISTRY), registry=REGISTRY)
    assert outcome["completed_requests"] == 4
    assert dict(outcome) == outcome.report and len(outcome) == len(outcome.report)
    assert outcome.get("no such key") is None and "mean_ttft_ms" in outcome
    assert json.loads(json.dumps(dict(outcome))) == outcome.report

