"""The ``servesim`` command line: exit codes, output streams, stages, atomic writes.

Exit codes: 0 success, 1 bad input (diagnostics on stderr, never a traceback), 2 usage.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servesim import __version__
from servesim.build_info import build
from servesim.cli import main
from servesim.compiler import compile_file
from servesim.payload import dump_payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.schemas import load_schema

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "configs"
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
QWEN = '[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n' \
    "[engine.workers.aggregated]\n"
KIMI = (EXAMPLES / "kimi_k3_state_cache.toml").read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a scratch folder (relative names in messages) with a wide console."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    return tmp_path


def write(name: str, text: str) -> str:
    Path(name).write_text(text, encoding="utf-8")
    return name


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:  # argparse: usage errors (2), --help/--version (0)
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# --- exit codes -----------------------------------------------------------------------------

def test_compile_prints_the_payload(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compile", write("ok.toml", QWEN))
    assert (code, err) == (0, "")
    payload = compile_file("ok.toml", registry=REGISTRY)
    assert out == dump_payload(payload, relative_to=os.getcwd())
    assert json.loads(out)["roles"]["aggregated"]["block_size"] == 64


def test_validate_ok(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "validate", write("ok.toml", QWEN))
    assert (code, out.strip(), err) == (
        0, "ok: ok.toml is valid (engine vllm; roles aggregated)", "")


@pytest.mark.parametrize("command", [["compile"], ["validate"], ["inspect"],
                                     ["compile", "--stop-after", "parse"],
                                     ["inspect", "--format", "json"]])
def test_bad_input_exits_1_with_diagnostics_on_stderr(capsys: pytest.CaptureFixture[str],
                                                      command: list[str]) -> None:
    bad = write("bad.toml", QWEN + "[engine.workers.aggregated.kv_cache]\nblok_size = 4\n")
    code, out, err = run(capsys, *command, bad)
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "error: engine.workers.aggregated.kv_cache.blok_size: unknown key 'blok_size' (allowed "
        "here: block_size, prefix_caching, bytes_per_token, capacity, state_cache, "
        "prefix_match_unit, host_offload, g3_offload) [unknown-key]",
        "  hint: did you mean 'block_size'?"]


def test_every_diagnostic_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "validate", write("bad.toml", '[engine]\nmodel = "x"\n'))
    assert code == 1
    assert err.splitlines() == [
        "error: engine.hardware: required key 'hardware' is missing [missing-key]",
        "error: engine.workers: required key 'workers' is missing [missing-key]"]


def test_missing_file_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "compile", "nowhere.toml") == (
        1, "", "error: nowhere.toml: file not found [file-not-found]\n")


@pytest.mark.parametrize("argv", [
    [], ["compile"], ["frobnicate"], ["compile", "x.toml", "--stop-after", "emit"],
    ["compile", "x.toml", "--format", "yaml"], ["validate"], ["inspect"],
    ["inspect", "x.toml", "--format", "yaml"], ["schema"], ["schema", "engine"],
    ["plugins", "--format", "yaml"], ["plugins", "extra"],
])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, "")
    assert "usage: servesim" in err and "Traceback" not in err


def test_schema_prints_the_committed_schema(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVESIM_DISABLE_PLUGIN_AUTOLOAD", "1")  # installed plugins add options
    for which in ("config", "payload"):
        code, out, err = run(capsys, "schema", which)
        assert (code, err) == (0, "")
        assert json.loads(out) == load_schema(which)


def test_plugins(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plugins", "--format", "json")
    assert code == 0
    rows = {(row["kind"], row["name"]): row for row in json.loads(out)}
    assert rows["engine", "vllm"]["modes"] == ["aggregated"]
    assert rows["engine", "disagg"]["modes"] == ["disaggregated"]
    assert rows["backend", "sglang"]["class"] == "servesim.backends.sglang.Sglang"
    assert {name for kind, name in rows if kind == "backend"} == {"vllm", "sglang", "trtllm"}
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "vllm" in out and "disagg" in out and "trtllm" in out and "servesim.builtin" in out


def test_a_plugin_that_cannot_be_imported_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--plugin", "no_such_servesim_plugin", "plugins")
    assert (code, out) == (1, "")
    assert err == ("error: --plugin no_such_servesim_plugin: cannot import plugin module: "
                   "ModuleNotFoundError: No module named 'no_such_servesim_plugin' "
                   "[plugin-import]\n")


def test_version_in_a_subprocess() -> None:
    done = subprocess.run([sys.executable, "-m", "servesim", "--version"], capture_output=True,
                          text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (
        0, f"servesim {__version__} ({build()})\n", "")


# --- stages ------------------------------------------------------------------------------------

@pytest.mark.parametrize("stage", ["parse", "resolve", "validate", "lower"])
def test_stop_after_each_stage_prints_json(capsys: pytest.CaptureFixture[str],
                                           stage: str) -> None:
    config = write("k3.toml", KIMI)
    code, out, err = run(capsys, "compile", config, "--stop-after", stage, "--format", "json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    if stage == "parse":  # only what was authored
        kv = data["engine"]["workers"]["aggregated"]["kv_cache"]
        assert kv["block_size"] == 128 and "bytes_per_token" not in kv
        assert data["engine"]["kvcache_quant_mode"] == "fp8"
    elif stage in ("resolve", "validate"):
        assert data["roles"]["aggregated"]["block_size"] == 1536
        assert data["provenance"]["engine.workers.aggregated.kv_cache.block_size"] == {
            "origin": "derived", "formula": "block_size 1536 = 128 x ceil(814080/73728)"}
    else:
        assert data["schema_version"] == 1 and data["engine"] == "vllm"
        assert data["roles"]["aggregated"]["block_size"] == 1536
        assert "provenance" in data and "metadata" not in data


def test_stop_after_validate_is_where_cross_layer_rules_fail(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = write("k3.toml", KIMI.replace("[engine]\n", "[engine]\nnextn = 1\n"
                                                          "nextn_accepted = 0.5\n"))
    assert run(capsys, "compile", config, "--stop-after", "resolve")[0] == 0
    code, out, err = run(capsys, "compile", config, "--stop-after", "validate")
    assert (code, out) == (1, "")
    assert err.splitlines() == [
        "error: engine.workers.aggregated.kv_cache.prefix_match_unit: prefix_match_unit does "
        "not support speculative decoding (speculation or nextn > 0) unless it equals the "
        "resolved block_size 1536, got 128 [prefix-match-unit-speculation]",
        "  hint: set prefix_match_unit = 1536 or remove it"]


def test_stop_after_text_format(capsys: pytest.CaptureFixture[str]) -> None:
    config = write("k3.toml", KIMI)
    code, out, _ = run(capsys, "compile", config, "--stop-after", "resolve", "--format", "text")
    assert code == 0
    assert "block_size = 1536  (derived: block_size 1536 = 128 x ceil(814080/73728))" in out
    code, out, _ = run(capsys, "compile", config, "--stop-after", "parse", "--format", "text")
    assert code == 0 and json.loads(out)["engine"]["model"] == "moonshotai/Kimi-K3"


# --- inspect --------------------------------------------------------------------------------

def test_inspect_marks_every_value_and_shows_the_k3_formula(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "inspect", write("k3.toml", KIMI))
    assert (code, err) == (0, "")
    lines = [line.lstrip("│├└─ ") for line in out.splitlines()]
    assert "block_size = 1536  (derived: block_size 1536 = 128 x ceil(814080/73728))" in lines
    assert "tensor = 8  (authored)" in lines
    assert "replicas = 1  (defaulted)" in lines
    assert "preemption_mode = \"lifo\"  (defaulted: vLLM default)" in lines
    assert "num_gpu_blocks = 512  (authored: capacity.blocks)" in lines
    assert "state_blocks = 3  (derived: ceil(61046784 / (1536 x 13824)) = 3)" in lines
    assert "input_tokens = 24300  (authored)" in lines


def test_inspect_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", write("ok.toml", QWEN), "--format", "json")
    assert code == 0
    prov = json.loads(out)["provenance"]
    assert prov["engine.workers.aggregated.kv_cache.block_size"] == {
        "origin": "defaulted", "formula": "vllm default"}
    assert prov["engine.model"] == {"origin": "authored"}


# --- compile -o -----------------------------------------------------------------------------------

def test_compile_output_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = str(EXAMPLES / "mooncake_trace.toml")
    code, out, err = run(capsys, "compile", config, "-o", "out/payload.json")
    assert (code, out) == (0, "")
    assert err == "wrote out/payload.json (engine vllm)\n"
    written = (tmp_path / "out" / "payload.json").read_text(encoding="utf-8")
    assert written == dump_payload(compile_file(config, registry=REGISTRY),
                                   relative_to=str(tmp_path / "out"))
    # the trace path is relative to the payload's folder and points at the real trace
    trace = json.loads(written)["workload"]["source"]["path"]
    assert not os.path.isabs(trace)
    assert (tmp_path / "out" / trace).resolve() == (REPO / "examples" / "traces"
                                                    / "mooncake_small.jsonl").resolve()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["payload.json"]


def test_compile_output_is_untouched_when_compiling_fails(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("payload.json").write_text("previous\n", encoding="utf-8")
    bad = write("bad.toml", QWEN.replace("h200_sxm", "h201"))
    code, _, err = run(capsys, "compile", bad, "-o", "payload.json")
    assert code == 1 and "[unknown-hardware]" in err
    assert Path("payload.json").read_text(encoding="utf-8") == "previous\n"
    assert sorted(p.name for p in Path().iterdir()) == ["bad.toml", "payload.json"]


def test_compile_output_is_atomic(capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    Path("payload.json").write_text("previous\n", encoding="utf-8")
    config = write("ok.toml", QWEN)

    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    code, _, err = run(capsys, "compile", config, "-o", "payload.json")
    assert (code, err) == (130, "interrupted\n")
    # the old file is intact and no temporary file is left behind
    assert Path("payload.json").read_text(encoding="utf-8") == "previous\n"
    assert sorted(p.name for p in Path().iterdir()) == ["ok.toml", "payload.json"]


TRACE_CONFIG = QWEN + '[traffic.source]\ntype = "trace"\npaths = ["trace.jsonl"]\n'
ROW = '{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1]}\n'


@pytest.mark.parametrize(("trace", "config", "expected"), [
    (None, TRACE_CONFIG, "/trace.jsonl: trace file not found [trace-unreadable]"),
    (ROW + '{"timestamp": 1, "input_len\n', TRACE_CONFIG,
     "/trace.jsonl:2: invalid JSON: Unterminated string"),
    (ROW, TRACE_CONFIG.replace("[engine.workers.aggregated]\n", "[engine.workers.aggregated]"
                               '\ntiming = { type = "table", path = "t.csv" }\n'),
     "/t.csv: cannot read the timing table: file not found"),
])
def test_validate_reads_the_trace_and_the_timing_tables(
        capsys: pytest.CaptureFixture[str], trace: str | None, config: str,
        expected: str) -> None:
    if trace is not None:
        write("trace.jsonl", trace)
    code, out, err = run(capsys, "validate", write("c.toml", config))
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and expected in err  # the path as the replay shows it


def test_a_timing_table_that_is_no_file_is_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    write("trace.jsonl", ROW)
    Path("t.csv").mkdir()
    config = TRACE_CONFIG.replace("[engine.workers.aggregated]\n", "[engine.workers.aggregated]"
                                  '\ntiming = { type = "table", path = "t.csv" }\n')
    code, _, err = run(capsys, "validate", write("c.toml", config))
    assert code == 1 and ("/t.csv: cannot read the timing table: is a directory, expected a "
                          "timing table (CSV)") in err


@pytest.mark.parametrize("argv", [
    ["replay", "c.toml", "--quiet", "--requests-out", "trace.jsonl"],
    ["replay", "c.toml", "--quiet", "-o", "./c.toml"],
    ["compile", "c.toml", "-o", "c.toml"],
    ["replay", "c.toml", "--quiet", "-o", "same.json", "--requests-out", "same.json"],
])
def test_an_output_that_is_an_input_or_the_other_output_is_refused(
        capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    write("trace.jsonl", ROW)
    write("c.toml", TRACE_CONFIG)
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    flag, arg = argv[-2:]
    problem = ("this is also the -o file: one output would overwrite the other"
               if arg == "same.json" else "this run reads this file (its config, payload, "
               "trace, timing table or model config.json): writing it would destroy it")
    assert err.splitlines()[0] == f"error: {flag} {arg}: {problem} [output-path]"
    assert (Path("trace.jsonl").read_text(), Path("c.toml").read_text()) == (ROW, TRACE_CONFIG)
    assert not Path("same.json").exists()


@pytest.mark.parametrize(("content", "expected"), [
    ('{"a": ' * 5000 + "1" + "}" * 5000, "p.json: not a JSON payload: maximum recursion depth "
                                          "exceeded"),
    ('{"schema_version": 1' + "1" * 5000 + "}", "p.json: not a JSON payload: Exceeds the limit"),
    (None, "p.json: is a directory, expected a JSON payload [file-unreadable]"),
])
def test_a_payload_file_that_cannot_be_read_is_an_input_error(
        capsys: pytest.CaptureFixture[str], content: str | None, expected: str) -> None:
    if content is None:
        Path("p.json").mkdir()
    else:
        write("p.json", content)
    code, out, err = run(capsys, "replay", "p.json", "--quiet")
    assert (code, out) == (1, "")
    assert err.startswith(f"error: {expected}")


def test_a_timing_table_error_names_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    write("trace.jsonl", ROW)
    config = TRACE_CONFIG.replace("[engine.workers.aggregated]\n", "[engine.workers.aggregated]"
                                  '\ntiming = { type = "table", path = "t.csv" }\n')
    code, _, err = run(capsys, "validate", write("c.toml", config))
    assert code == 1 and "hint: check engine.workers.aggregated.timing.path" in err


def test_a_payload_given_for_a_config_says_which_command_takes_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, payload, _ = run(capsys, "compile", write("c.toml", QWEN))
    code, _, err = run(capsys, "validate", write("p.json", payload))
    assert code == 1
    assert err == ("error: p.json:1:1: invalid TOML: Invalid statement [toml-syntax]\n"
                   "  hint: this looks like a JSON payload: `servesim replay` takes one, the "
                   "other commands a TOML config\n")


@pytest.mark.parametrize(("timing", "expected"), [
    ('type = "polynomial"\npath = "t.csv"', "timing.path: polynomial timing rejects path"),
    ('type = "table"', "timing.path: table timing requires path (a CSV file)"),
    ('type = "polynomial"\nprefill_ms = 1.0',
     "timing: polynomial timing rejects fixed timing values (prefill_ms, decode_ms)"),
])
def test_a_timing_table_holds_only_its_type_s_keys(capsys: pytest.CaptureFixture[str],
                                                   timing: str, expected: str) -> None:
    config = QWEN + f"[engine.workers.aggregated.timing]\n{timing}\n"
    code, _, err = run(capsys, "validate", write("c.toml", config))
    assert code == 1
    assert f"error: engine.workers.aggregated.{expected} [timing-" in err


def test_a_misspelt_timing_type_is_the_only_problem_of_its_table(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = QWEN + '[engine.workers.aggregated.timing]\ntype = "fixd"\nprefill_ms = 1.0\n' \
        "decode_ms = 1.0\n"
    code, _, err = run(capsys, "validate", write("c.toml", config))
    assert code == 1
    (error,) = [line for line in err.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: engine.workers.aggregated.timing.type: unknown timing type "
                            "'fixd' (registered: default, fixed, ")


def test_compile_output_to_a_folder_is_refused_before_compiling(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("out").mkdir()
    code, out, err = run(capsys, "compile", write("ok.toml", QWEN), "-o", "out")
    assert (code, out) == (1, "")
    assert err.startswith("error: -o out: cannot write this file: it is a folder [output-path]")
    assert list(Path("out").iterdir()) == []


@pytest.mark.parametrize(("command", "flag", "arg", "problem"), [
    ("compile", "-o", "", "the path is empty"),
    ("replay", "--requests-out", "", "the path is empty"),
    ("replay", "-o", "new/", "it is a folder"),  # a folder to be, not a file named "new"
])
def test_an_empty_or_folder_output_path_is_refused(
        capsys: pytest.CaptureFixture[str], command: str, flag: str, arg: str,
        problem: str) -> None:
    code, out, err = run(capsys, command, write("ok.toml", QWEN), flag, arg)
    assert (code, out) == (1, "")
    assert err.startswith(f"error: {flag} {arg}: cannot write this file: {problem} "
                          "[output-path]")
    assert sorted(p.name for p in Path().iterdir()) == ["ok.toml"]


def test_compile_writes_an_earlier_stage_to_the_output_file(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "compile", write("ok.toml", QWEN), "--stop-after", "resolve",
                         "-o", "stage.json")
    assert (code, out, err) == (0, "", "wrote stage.json (stage resolve)\n")
    stage = json.loads(Path("stage.json").read_text(encoding="utf-8"))
    assert stage["roles"]["aggregated"]["model"] == "Qwen/Qwen3-32B"


def test_compile_output_writes_through_a_link_with_a_new_file_s_permissions(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("kept").mkdir()
    Path("link.json").symlink_to("kept/payload.json")
    code, _, _ = run(capsys, "compile", write("ok.toml", QWEN), "-o", "link.json")
    assert code == 0
    assert Path("link.json").is_symlink()  # the link stays; its target gets the payload
    assert json.loads(Path("kept/payload.json").read_text(encoding="utf-8"))["engine"] == "vllm"
    umask = os.umask(0)
    os.umask(umask)
    assert Path("kept/payload.json").stat().st_mode & 0o777 == 0o666 & ~umask


def test_closed_stdout_is_not_a_crash(capsys: pytest.CaptureFixture[str],
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdout", None)  # `servesim ... >&-`
    assert main(["validate", write("ok.toml", QWEN)]) == 0


class _FullDisk:
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        raise ValueError("no file descriptor")


def test_stdout_that_cannot_be_written_exits_1_with_a_message(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    config = write("ok.toml", QWEN)
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    assert main(["compile", config]) == 1
    assert capsys.readouterr().err == (
        "error: cannot write the output: [Errno 28] No space left on device\n")


# --- no traceback for any bad input ------------------------------------------------------------

BAD_INPUTS = {
    "empty": "",
    "syntax": "[engine\n",
    "binary": "\x00\x01\x02",
    "root-array": "engine = [1, 2]\n",
    "scalar-workers": '[engine]\nmodel = "m"\nhardware = "h"\nworkers = 3\n',
    "nan": QWEN + '[traffic.load]\ntype = "poisson"\nrequests_per_second = nan\n',
    "huge": QWEN + f"[traffic.load]\nconcurrency = {2**64}\n",
    "unknown-model": QWEN.replace("Qwen/Qwen3-32B", "Qwen/Qwen9"),
    "model-name-too-long-for-a-path": QWEN.replace("Qwen/Qwen3-32B", "x" * 300),
    "model-in-an-unknown-home": QWEN.replace("Qwen/Qwen3-32B", "~nosuchuser/model"),
    "no-kv-budget": QWEN.replace("Qwen/Qwen3-32B", "Qwen/Qwen3-235B-A22B").replace(
        "h200_sxm", "l40s"),
    "kv-dtype": QWEN.replace("[engine]\n", '[engine]\nkvcache_quant_mode = "nvfp4"\n'),
    "state-cache-pp": KIMI.replace("tensor = 8", "tensor = 8\npipeline = 2"),
    "pmu-speculation": KIMI.replace("[engine]\n", "[engine]\nnextn = 2\nnextn_accepted = 1.0\n"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
@pytest.mark.parametrize("command", ["compile", "validate", "inspect"])
def test_no_traceback_for_bad_input(capsys: pytest.CaptureFixture[str], name: str,
                                    command: str) -> None:
    config = write(f"{name}.toml", BAD_INPUTS[name])
    code, out, err = run(capsys, command, config)
    assert (code, out) == (1, "")
    assert err.startswith("error: ") and "Traceback" not in err


def test_non_utf8_file(capsys: pytest.CaptureFixture[str]) -> None:
    Path("latin1.toml").write_bytes(b"[engine]\nmodel = '\xe9'\n")
    assert run(capsys, "validate", "latin1.toml") == (
        1, "", "error: latin1.toml: not UTF-8 text (byte 18) [not-utf8]\n")


def test_directory_instead_of_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    Path("configs").mkdir()
    assert run(capsys, "compile", "configs") == (
        1, "", "error: configs: is a directory, expected a TOML file [file-unreadable]\n")


def test_ctrl_c_while_the_cli_loads_exits_130(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    import builtins

    from servesim import console

    real_import = builtins.__import__

    def interrupted(name: str, *args: object, **kwargs: object) -> object:
        if name == "servesim.cli":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", interrupted)
    assert console.run(["plugins"]) == 130
    assert capsys.readouterr().err == "interrupted\n"


def test_a_model_folder_is_named_relative_to_the_config_like_a_trace(
        capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.resources import files

    catalog = files("servesim.catalog") / "models" / "meta-llama--Meta-Llama-3.1-8B.json"
    Path("deploy/llama").mkdir(parents=True)
    Path("deploy/llama/config.json").write_text(catalog.read_text(encoding="utf-8"))
    Path("deploy/c.toml").write_text(QWEN.replace('"Qwen/Qwen3-32B"', '"llama"'))
    assert run(capsys, "validate", "deploy/c.toml")[0] == 0  # not ./llama
    code, _, err = run(capsys, "compile", "deploy/c.toml", "-o", "out/p.json")
    assert code == 0, err
    assert json.loads(Path("out/p.json").read_text())["roles"]["aggregated"]["model"] == \
        "../deploy/llama"  # relative to the payload, so both can move together
    code, out, err = run(capsys, "replay", "out/p.json", "--quiet", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["completed_requests"] > 0
    Path("llama").mkdir()  # a folder of that name beside the caller is not the one meant
    Path("deploy/llama/config.json").unlink()
    Path("deploy/llama").rmdir()
    code, _, err = run(capsys, "validate", "deploy/c.toml")
    assert code == 1 and "no model folder 'llama' next to the config" in err
