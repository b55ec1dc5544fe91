"""``--executor ray`` against a local Ray instance: the same rows as local processes, the
config's files shipped through the object store, and a clear message without Ray."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servesim.sweep.ray_executor import local_copies

from .conftest import run

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "examples" / "traces" / "mooncake_small.jsonl"
TRACED = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h100_sxm"\n'
          "[engine.workers.aggregated]\n"
          '[engine.workers.aggregated.timing]\ntype = "fixed"\nprefill_ms = 20.0\n'
          "decode_ms = 5.0\n"
          '[traffic.source]\ntype = "trace"\npaths = ["trace.jsonl"]\nformat = "mooncake"\n'
          "block_size = 512\n"
          '[traffic.load]\ntype = "trace_timestamps"\n')


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_ray_gives_the_rows_of_local_processes(ray_instance: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    lines = TRACE.read_text(encoding="utf-8").splitlines(keepends=True)
    Path("trace.jsonl").write_text("".join(lines[:10]), encoding="utf-8")
    Path("traced.toml").write_text(TRACED, encoding="utf-8")
    for config in ("tiny.toml", "traced.toml"):
        args = ["sweep", config, "--set",
                "engine.workers.aggregated.parallelism.replicas=1,2",
                "--set", "engine.workers.aggregated.parallelism.tensor=1,3"]
        code, _, err = run(capsys, *args, "-o", "ray.json", "--executor", "ray")
        assert code == 0, err
        assert run(capsys, *args, "-o", "local.json", "-j", "2")[0] == 0
        assert Path("ray.json").read_bytes() == Path("local.json").read_bytes()


def test_a_search_runs_on_ray(ray_instance: Any, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("optuna")
    Path("space.toml").write_text(
        'constraints = ["tpot_ms.p99 <= 10"]\ntrials = 4\n[parameters]\n'
        '"engine.workers.aggregated.parallelism.replicas" = [1, 2]\n', encoding="utf-8")
    code, out, err = run(capsys, "search", "tiny.toml", "--space", "space.toml",
                         "--executor", "ray", "-j", "2")
    assert code == 0, err
    assert "Best deployments" in out


def test_a_node_without_the_driver_s_files_gets_copies(tmp_path: Path) -> None:
    here = tmp_path / "trace.jsonl"
    here.write_bytes(b"abc\n")
    elsewhere = str(tmp_path / "gone" / "trace.jsonl")  # the driver's path, not on this node
    copies = local_copies({str(here): b"abc\n", elsewhere: b"xyz\n"})
    assert copies[str(here)] == str(here)
    assert copies[elsewhere] != elsewhere
    assert Path(copies[elsewhere]).read_bytes() == b"xyz\n"
    assert Path(copies[elsewhere]).name == "trace.jsonl"


def test_without_ray_the_executor_says_what_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)
    code, _, err = run(capsys, "sweep", "tiny.toml", "--set",
                       "engine.workers.aggregated.parallelism.replicas=1,2", "-o", "r.json",
                       "--executor", "ray")
    assert code == 1 and "pip install 'servesim[ray]'" in err
    assert not Path("r.json").exists()
