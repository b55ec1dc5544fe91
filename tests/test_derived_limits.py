"""Quantities derived from several inputs are bounded like the inputs: the scheduler ranks
of a role (replicas x attention_data), the longest KV transfer of a P/D deployment; trace
numbers past a float's range are refused like any out-of-range number. Each refusal names
the inputs, in a config and in a payload alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.cli import main
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

REPO = Path(__file__).resolve().parents[1]
DISAGG = (REPO / "examples" / "configs" / "llama70b_disagg.toml").read_text(encoding="utf-8")
RANKS = """\
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.parallelism]
replicas = {replicas}
attention_data = {attention_data}
[engine.workers.aggregated.timing]
type = "fixed"
prefill_ms = 1.0
decode_ms = 1.0
[traffic.source]
type = "synthetic"
[traffic.load]
type = "concurrency"
concurrency = 1
[traffic.stop]
requests = 2
"""


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    capsys.readouterr()
    code = main(list(argv))
    _, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, err.splitlines()


def test_ranks_up_to_the_limit_compile(capsys: pytest.CaptureFixture[str]) -> None:
    Path("c.toml").write_text(RANKS.format(replicas=4096, attention_data=16), encoding="utf-8")
    assert run(capsys, "compile", "c.toml", "-o", "p.json") == (0, ["wrote p.json (engine vllm)"])


@pytest.mark.parametrize(("replicas", "attention_data"), [(4096, 32), (4096, 1024), (128, 1024)])
def test_more_scheduler_ranks_than_a_replay_holds_are_refused(
        capsys: pytest.CaptureFixture[str], replicas: int, attention_data: int) -> None:
    Path("c.toml").write_text(RANKS.format(replicas=4096, attention_data=16), encoding="utf-8")
    assert run(capsys, "compile", "c.toml", "-o", "p.json")[0] == 0
    data = json.loads(Path("p.json").read_text(encoding="utf-8"))
    data["roles"]["aggregated"].update(replicas=replicas, attention_data=attention_data)
    Path("p.json").write_text(json.dumps(data), encoding="utf-8")
    Path("c.toml").write_text(RANKS.format(replicas=replicas, attention_data=attention_data),
                              encoding="utf-8")
    ranks = replicas * attention_data
    expected = [
        f"error: engine.workers.aggregated.parallelism: replicas x attention_data = {replicas} "
        f"x {attention_data} = {ranks} scheduler ranks, more than the 65536 a replay holds "
        "[out-of-range]",
        "  hint: lower replicas or attention_data (a replay of fewer replicas with the same "
        "load per replica gives the same latencies)"]
    assert run(capsys, "validate", "c.toml") == (1, expected)
    assert run(capsys, "replay", "p.json", "--quiet") == (1, expected)


@pytest.mark.parametrize(("bytes_per_token", "bandwidth", "ok"), [
    (81920, 25.0, True), (2**40, 1e-9, False), (81920, 1e-6, True), (81920, 1e-9, False)])
def test_a_kv_transfer_longer_than_a_replay_spans_is_refused(
        capsys: pytest.CaptureFixture[str], bytes_per_token: int, bandwidth: float,
        ok: bool) -> None:
    config = DISAGG.replace("bandwidth_gb_per_second = 25.0",
                            f"bandwidth_gb_per_second = {bandwidth!r}\n"
                            f"bytes_per_token = {bytes_per_token}")
    Path("c.toml").write_text(config, encoding="utf-8")
    code, err = run(capsys, "validate", "c.toml")
    if ok:
        assert (code, err) == (0, [])
        return
    ms = 131072 * bytes_per_token / bandwidth / 1e6
    assert (code, err) == (1, [
        f"error: engine.kv_transfer.bandwidth_gb_per_second: a 131072-token prompt at "
        f"bytes_per_token = {bytes_per_token} takes {ms:.3g} ms to cross {bandwidth:g} GB/s, "
        "more than the 1e+12 ms a replay spans [out-of-range]",
        "  hint: raise bandwidth_gb_per_second, or check bytes_per_token"])
