"""Finding a deployment (--set, sweep, search, report): a tiny config with fixed step times
and a few requests, in a scratch folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesim.cli import main

TINY = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
        "[engine.workers.aggregated]\n"
        '[engine.workers.aggregated.timing]\ntype = "fixed"\nprefill_ms = 20.0\n'
        "decode_ms = 5.0\n"
        '[traffic.source]\ntype = "synthetic"\ninput_tokens = 128\noutput_tokens = 8\n'
        '[traffic.load]\ntype = "poisson"\nrequests_per_second = 4.0\nseed = 7\n'
        "[traffic.stop]\nrequests = 12\n"
        "[evaluation.sla]\nttft_ms = 500\nitl_ms = 50\n")


@pytest.fixture(autouse=True)
def _workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    Path("tiny.toml").write_text(TINY, encoding="utf-8")
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err
