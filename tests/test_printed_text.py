"""Text a user or a plugin supplies is printed as it is: never read as rich markup, and
with every unprintable character (a newline, an escape) written as its escape, so that a
file name, a TOML key or a plugin's description can neither crash the CLI nor forge an
output line nor drive the terminal."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.cli import main
from servesim.engines.base import Engine, ReplayResult
from servesim.plugins import hookimpl
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV
from servesim.render import shown

CONFIG = """\
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 1.0
decode_ms = 1.0
[traffic.source]
type = "synthetic"
input_tokens = 16
output_tokens = 2
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
requests = 2
"""


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    Path("c.toml").write_text(CONFIG, encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize("name", ["[/x]r.json", "[bold]r.json", "[red]r[/red].json",
                                  "r:smile:.json"])
def test_an_output_name_with_brackets_is_written_and_named_as_given(
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    code, _, err = run(capsys, "replay", "c.toml", "--quiet", "-o", name)
    assert (code, err) == (0, f"wrote {name}\n")
    assert json.loads(Path(name).read_text(encoding="utf-8"))["completed_requests"] == 2
    code, _, err = run(capsys, "compile", "c.toml", "-o", name)
    assert (code, err) == (0, f"wrote {name} (engine vllm)\n")


def test_a_config_name_with_brackets_is_printed_as_given(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("d[").mkdir()
    Path("d[/x].toml").write_text(CONFIG, encoding="utf-8")  # folder "d[", markup "[/x]"
    code, out, _ = run(capsys, "validate", "d[/x].toml")
    assert (code, out) == (0, "ok: d[/x].toml is valid (engine vllm; roles aggregated)\n")


def test_a_newline_in_a_file_name_cannot_forge_an_error_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "validate", "a\nerror: b.toml")
    assert (code, err) == (1, "error: a\\nerror: b.toml: file not found [file-not-found]\n")


def test_an_escape_in_a_toml_key_is_printed_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    Path("k.toml").write_text(CONFIG.replace("[engine]\n", '[engine]\n"x\\u001b[2Jy" = 1\n'),
                              encoding="utf-8")
    code, _, err = run(capsys, "validate", "k.toml")
    assert code == 1
    assert err.splitlines()[0].startswith("error: engine.x\\x1b[2Jy: unknown key")
    assert "\x1b" not in err


class _Shouting(Engine):
    NAME = "shouting[/bold]"
    MODES: ClassVar[tuple[str, ...]] = ("aggregated",)
    DESCRIPTION = "replays [/x] nothing\x1b[31m\nerror: forged"

    def replay(self, payload, workload, sink, *, progress=None):  # type: ignore[no-untyped-def]
        return ReplayResult(end_ms=0.0, gpu_seconds={})


def test_a_plugin_description_with_markup_and_escapes_is_listed_as_text(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("shouting_plugin")
    module.servesim_register_engines = hookimpl(  # type: ignore[attr-defined]
        lambda: [_Shouting])
    monkeypatch.setitem(sys.modules, "shouting_plugin", module)
    code, out, err = run(capsys, "--plugin", "shouting_plugin", "plugins")
    assert (code, err) == (0, "")
    assert "shouting[/bold]" in out
    assert "replays [/x] nothing\\x1b[31m\\nerror: forged" in out
    assert "\x1b" not in out and "error: forged" not in out.replace("\\nerror: forged", "")


def test_shown_escapes_only_what_is_not_printable() -> None:
    assert shown("r[/x].json") == "r[/x].json"
    assert shown("tab\there") == "tab\\there"
    assert shown("a\u202eb") == "a\\u202eb"
    assert shown("ünïcode ok") == "ünïcode ok"


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.sampled_from("[]/\\\n\x1b\x07\r\u202e ab:é"), min_size=1,
               max_size=12))
def test_any_output_name_is_echoed_on_one_line_without_control_characters(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str) -> None:
    name = f"o{text.replace('/', '_')}.json"
    code, _, err = run(capsys, "compile", "c.toml", "-o", name)
    assert code == 0
    assert err == f"wrote {shown(name)} (engine vllm)\n"
    assert err.count("\n") == 1 and "\x1b" not in err and "\r" not in err


def test_a_stage_printed_as_text_shows_control_characters_escaped(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("k.toml").write_text(CONFIG.replace('model = "Qwen/Qwen3-32B"',
                                             'model = "Qwen\\u009b2J\\u202e"'), encoding="utf-8")
    code, out, _ = run(capsys, "compile", "k.toml", "--stop-after", "parse", "--format", "text")
    assert code == 0
    assert '"model": "Qwen\\u009b2J\\u202e"' in out
    assert "\x9b" not in out and "\u202e" not in out
