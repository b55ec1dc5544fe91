"""Outputs never destroy inputs: ``-o`` and ``--requests-out`` are compared with every file
a run reads by identity (device and inode), a model folder's ``config.json`` included;
they are written whole (a temporary file renamed on success), so a failed run leaves the
previous file in place; nothing is created before the input is found valid."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from servesim.catalog import _model_files, _resource_dir
from servesim.cli import main
from servesim.files import whole_file
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

ROW = '{"timestamp": %d, "input_length": 20, "output_length": 3, "hash_ids": [1, 2]}\n'
CONFIG = """\
[engine]
model = "m"
hardware = "h200_sxm"
[engine.workers.aggregated.timing]
type = "table"
path = "t.csv"
[traffic.source]
type = "trace"
paths = ["trace.jsonl"]
block_size = 16
[traffic.load]
type = "trace_timestamps"
"""
READS = ("this run reads this file (its config, payload, trace, timing table or model "
         "config.json): writing it would destroy it [output-path]")


def _table() -> str:
    rows = ["batch_size,prefill_tokens,kv_read_tokens,latency_ms"]
    for b in (1, 64):
        for new in (1, 4096):
            for kv in (0, 4096):
                rows.append(f"{b},{new},{kv},{1 + b * 0.01 + new * 0.001 + kv * 1e-4}")
        for kv in (0, 1 << 20):
            rows.append(f"{b},0,{kv},{1 + b * 0.01 + kv * 1e-6}")
    return "\n".join(rows) + "\n"


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    Path("m").mkdir()
    shutil.copyfile(_resource_dir("models").joinpath(_model_files()["Qwen/Qwen3-32B"]),
                    "m/config.json")
    Path("t.csv").write_text(_table(), encoding="utf-8")
    Path("trace.jsonl").write_text("".join(ROW % t for t in range(3)), encoding="utf-8")
    Path("c.toml").write_text(CONFIG, encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err.splitlines()


def test_the_harness_replays(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", "c.toml", "--quiet", "--format", "json")
    assert (code, err) == (0, [])
    assert json.loads(out)["completed_requests"] == 3


@pytest.mark.parametrize("argv", [
    ["replay", "c.toml", "--quiet", "-o", "m/config.json"],
    ["replay", "c.toml", "--quiet", "--requests-out", "m/config.json"],
    ["compile", "c.toml", "-o", "m/config.json"],
    ["compile", "c.toml", "-o", "trace.jsonl"],
    ["compile", "c.toml", "-o", "t.csv"],
    ["compile", "c.toml", "--stop-after", "resolve", "-o", "t.csv"],
    ["replay", "c.toml", "--quiet", "--requests-out", "hard-link"],
    ["replay", "c.toml", "--quiet", "-o", "table-link"],
    ["compile", "c.toml", "-o", "config-link"],
])
def test_no_output_may_be_a_file_the_run_reads(capsys: pytest.CaptureFixture[str],
                                               argv: list[str]) -> None:
    os.link("trace.jsonl", "hard-link")
    os.link("t.csv", "table-link")
    os.link("m/config.json", "config-link")
    before = {p: Path(p).read_bytes() for p in ("trace.jsonl", "t.csv", "m/config.json")}
    code, out, err = run(capsys, *argv)
    assert (code, out) == (1, "")
    assert err[0] == f"error: {argv[-2]} {argv[-1]}: {READS}"
    assert {p: Path(p).read_bytes() for p in before} == before


def test_a_payload_s_files_are_inputs_too(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "compile", "c.toml", "-o", "p.json")[0] == 0
    os.link("m/config.json", "link.json")
    code, _, err = run(capsys, "replay", "p.json", "--quiet", "--requests-out", "link.json")
    assert (code, err[0]) == (1, f"error: --requests-out link.json: {READS}")


def test_a_failed_replay_leaves_the_previous_requests_file(
        capsys: pytest.CaptureFixture[str]) -> None:
    Path("requests.jsonl").write_text("previous\n", encoding="utf-8")
    with open("trace.jsonl", "a", encoding="utf-8") as f:
        f.write('{"timestamp": 9, "input_length": "x"}\n')
    code, _, err = run(capsys, "replay", "c.toml", "--quiet", "--requests-out",
                       "requests.jsonl")
    assert code == 1 and err[0].startswith("error: ")
    assert Path("requests.jsonl").read_text(encoding="utf-8") == "previous\n"
    assert sorted(os.listdir(".")) == ["c.toml", "m", "requests.jsonl", "t.csv", "trace.jsonl"]


def test_a_replay_replaces_the_requests_file_whole(capsys: pytest.CaptureFixture[str]) -> None:
    Path("requests.jsonl").write_text("previous\n", encoding="utf-8")
    os.chmod("requests.jsonl", 0o640)
    assert run(capsys, "replay", "c.toml", "--quiet", "--requests-out", "requests.jsonl")[0] == 0
    lines = Path("requests.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == [0, 1, 2]
    assert os.stat("requests.jsonl").st_mode & 0o777 == 0o640


def test_no_folder_is_made_for_an_input_found_invalid(capsys: pytest.CaptureFixture[str]) -> None:
    Path("bad.toml").write_text("[engine]\nmodel = 1\n", encoding="utf-8")
    for argv in (["replay", "bad.toml", "--quiet", "-o", "new/r.json", "--requests-out",
                  "new2/q.jsonl"], ["compile", "bad.toml", "-o", "new3/p.json"]):
        assert run(capsys, *argv)[0] == 1
    assert not any(Path(p).exists() for p in ("new", "new2", "new3"))
    code, _, err = run(capsys, "replay", "c.toml", "--quiet", "-o", "new/deeper/r.json")
    assert (code, err) == (0, ["wrote new/deeper/r.json"])


@pytest.mark.parametrize("length", [246, 250, 255])
def test_an_output_name_of_up_to_255_bytes_is_written(capsys: pytest.CaptureFixture[str],
                                                      length: int) -> None:
    name = "r" * (length - 5) + ".json"
    assert run(capsys, "compile", "c.toml", "-o", name)[0] == 0
    assert json.loads(Path(name).read_text(encoding="utf-8"))["engine"] == "vllm"


def test_an_output_name_past_256_bytes_is_refused_before_work(
        capsys: pytest.CaptureFixture[str]) -> None:
    name = "r" * 252 + ".json"
    code, _, err = run(capsys, "replay", "c.toml", "--quiet", "-o", name)
    assert (code, err[0]) == (1, f"error: -o {name}: cannot write this file: the file name is "
                              "too long [output-path]")


def test_a_pipe_without_a_reader_is_refused_instead_of_blocking(
        capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo("fifo")
    code, _, err = run(capsys, "compile", "c.toml", "-o", "fifo")
    assert (code, err[0]) == (1, "error: -o fifo: cannot write this file: it is a pipe that no "
                              "process reads [output-path]")


def test_a_pipe_with_a_reader_is_written_in_place(capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo("fifo")
    got: list[bytes] = []
    fd = os.open("fifo", os.O_RDONLY | os.O_NONBLOCK)  # a reader, before the writer opens

    def read() -> None:
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            got.append(f.read())

    assert run(capsys, "compile", "c.toml", "-o", "fifo")[0] == 0
    reader = threading.Thread(target=read)
    reader.start()
    reader.join(timeout=60)
    assert json.loads(got[0])["engine"] == "vllm"


def test_two_writers_of_one_output_leave_one_whole_file() -> None:
    with whole_file("out.txt") as first, whole_file("out.txt") as second:
        first.write("a" * 100_000)
        second.write("b" * 50_000)
        second.flush()
        first.write("a" * 100_000)
    assert Path("out.txt").read_text(encoding="utf-8") in ("a" * 200_000, "b" * 50_000)
    assert os.listdir(".").count("out.txt") == 1
    assert not [p for p in os.listdir(".") if p.startswith(".servesim-")]


def test_an_exception_leaves_the_previous_file() -> None:
    Path("out.txt").write_text("previous", encoding="utf-8")
    with pytest.raises(ZeroDivisionError), whole_file("out.txt") as f:
        f.write("partial")
        raise ZeroDivisionError
    assert Path("out.txt").read_text(encoding="utf-8") == "previous"
    with pytest.raises(KeyboardInterrupt), whole_file("out.txt", keep_on_interrupt=True) as f:
        f.write("finished so far")
        raise KeyboardInterrupt
    assert Path("out.txt").read_text(encoding="utf-8") == "finished so far"
