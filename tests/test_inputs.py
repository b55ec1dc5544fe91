"""One bounded reader for every whole input file (config, payload, model config.json,
timing table): regular files only, read no further than a limit; none can hang the
process or exhaust its memory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servesim.catalog import MAX_MODEL_CONFIG_BYTES, _model_files, _resource_dir
from servesim.cli import main
from servesim.compiler.source import MAX_CONFIG_BYTES
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

CONFIG = """\
[engine]
model = "m"
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
TABLE = CONFIG.replace('type = "fixed"\nprefill_ms = 1.0\ndecode_ms = 1.0',
                       'type = "table"\npath = "t.csv"').replace('model = "m"',
                                                                 'model = "Qwen/Qwen3-32B"')
NOT_REGULAR = "is not a regular file (a device, pipe or socket), expected"


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    Path("m").mkdir()
    Path("c.toml").write_text(CONFIG, encoding="utf-8")
    Path("tc.toml").write_text(TABLE, encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, err.splitlines()


def _model_config() -> bytes:
    return _resource_dir("models").joinpath(_model_files()["Qwen/Qwen3-32B"]).read_bytes()


def test_a_model_folder_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    Path("m/config.json").write_bytes(b"\xef\xbb\xbf" + _model_config())  # a BOM is fine
    assert run(capsys, "validate", "c.toml") == (0, [])


@pytest.mark.parametrize("make", ["dev_zero", "fifo", "huge"])
def test_a_model_config_json_that_is_no_bounded_file_is_refused(
        capsys: pytest.CaptureFixture[str], make: str) -> None:
    cfg = Path("m/config.json")
    if make == "dev_zero":
        cfg.symlink_to("/dev/zero")
    elif make == "fifo":
        os.mkfifo(cfg)
    else:
        cfg.write_bytes(b" " * (MAX_MODEL_CONFIG_BYTES + 1))
    code, err = run(capsys, "validate", "c.toml")
    problem = (f"file is over {MAX_MODEL_CONFIG_BYTES} bytes, the most a model's config.json "
               "may be" if make == "huge" else f"{NOT_REGULAR} a model's config.json")
    where = Path("m/config.json").absolute()
    assert (code, err) == (1, [f"error: engine.model: cannot read {where}: {problem} "
                               "[bad-model-config]"])


@pytest.mark.parametrize(("name", "make"), [("c.toml", "fifo"), ("p.json", "fifo"),
                                            ("p.json", "dev_zero"), ("p.json", "huge")])
def test_a_config_or_payload_that_is_no_bounded_file_is_refused(
        capsys: pytest.CaptureFixture[str], name: str, make: str) -> None:
    Path(name).unlink(missing_ok=True)
    if make == "fifo":
        os.mkfifo(name)
    elif make == "dev_zero":
        Path(name).symlink_to("/dev/zero")
    else:
        Path(name).write_bytes(b" " * (MAX_CONFIG_BYTES + 1))
    what = "a TOML file" if name.endswith(".toml") else "a JSON payload"
    problem = (f"file is over {MAX_CONFIG_BYTES} bytes, the most {what} may be [file-too-large]"
               if make == "huge" else f"{NOT_REGULAR} {what} [file-unreadable]")
    assert run(capsys, "replay", name, "--quiet") == (1, [f"error: {name}: {problem}"])


@pytest.mark.parametrize("make", ["fifo", "dev_zero"])
def test_a_timing_table_that_is_no_regular_file_is_refused(
        capsys: pytest.CaptureFixture[str], make: str) -> None:
    if make == "fifo":
        os.mkfifo("t.csv")
    else:
        Path("t.csv").symlink_to("/dev/zero")
    code, err = run(capsys, "validate", "tc.toml")
    assert code == 1
    assert err[0] == (f"error: {Path('t.csv').absolute()}: cannot read the timing table: "
                      f"{NOT_REGULAR} a timing table (CSV) [timing-table-invalid]")


def test_a_csv_cell_past_the_csv_module_s_limit_is_a_table_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("t.csv").write_text("batch_size,prefill_tokens,kv_read_tokens,latency_ms\n"
                             f'1,1,0,"{"9" * 200_000}\n', encoding="utf-8")
    code, err = run(capsys, "validate", "tc.toml")
    assert code == 1
    assert err[0] == (f"error: {Path('t.csv').absolute()}:2: not a CSV row: field larger than "
                      "field limit (131072) [timing-table-invalid]")


def test_a_timing_table_with_a_byte_order_mark_is_read(
        capsys: pytest.CaptureFixture[str]) -> None:
    rows = ["batch_size,prefill_tokens,kv_read_tokens,latency_ms"]
    rows += [f"{b},{n},0,{1 + b + n / 100}" for b in (1, 64) for n in (1, 8192)]
    rows += [f"{b},0,{kv},{1 + b / 10 + kv / 1e5}" for b in (1, 64) for kv in (0, 1 << 20)]
    Path("t.csv").write_bytes(b"\xef\xbb\xbf" + ("\n".join(rows) + "\n").encode())
    assert run(capsys, "validate", "tc.toml") == (0, [])
