"""A timer's ``decode_steps_ms`` (a run of steady passes priced in one call) gives the
floats of ``decode_ms`` pass by pass, and the engines replay alike with or without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.catalog import load_gpu, load_model
from servesim.cli import main
from servesim.timing.analytical import AnalyticalTimer, build_geometry, load_constants
from servesim.timing.polynomial import PolynomialTimer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "configs"


def _timers() -> list[object]:
    geometries = [
        build_geometry(load_model("Qwen/Qwen3-32B"), load_gpu("h100_sxm"), tensor=2),
        build_geometry(load_model("deepseek-ai/DeepSeek-R1"), load_gpu("b200_sxm"), tensor=8,
                       moe_expert=8, speculative_tokens=2),
        build_geometry(load_model("openai/gpt-oss-120b"), load_gpu("h200_sxm"), tensor=4,
                       moe_tensor=4),
    ]
    return [PolynomialTimer(), *(AnalyticalTimer(g, load_constants()) for g in geometries)]


TIMERS = _timers()


@settings(max_examples=60, deadline=None)
@given(which=st.integers(0, len(TIMERS) - 1), batch=st.integers(1, 512),
       active=st.integers(0, 4_000_000), total=st.integers(0, 8_000_000),
       steps=st.integers(0, 40))
def test_decode_steps_are_decode_ms_pass_by_pass(which: int, batch: int, active: int,
                                                  total: int, steps: int) -> None:
    timer = TIMERS[which]
    series = timer.decode_steps_ms(batch, active, total, steps)  # type: ignore[attr-defined]
    by_pass = []
    for j in range(steps):
        a = active + batch * j
        by_pass.append(timer.decode_ms(batch, a, a // batch, total))  # type: ignore[attr-defined]
    assert series == by_pass


@pytest.mark.parametrize(("example", "timer", "fewer"), [
    # default timing, 8 attention-DP ranks (fewer requests: the tests audit every step)
    ("deepseek_r1_trtllm_attention_dp", AnalyticalTimer, ["--set", "traffic.stop.requests=48"]),
    ("qwen3_32b_disagg_sessions", AnalyticalTimer, []),  # P/D sessions
    ("kimi_k3_speculation", PolynomialTimer, []),  # speculative bursts
])
def test_replay_is_the_same_without_decode_steps(example: str, timer: type, fewer: list[str],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    reports = []
    for run in ("with", "without"):
        if run == "without":  # the engines fall back to a decode_ms call per pass
            monkeypatch.delattr(timer, "decode_steps_ms")
        out = tmp_path / f"{run}.json"
        assert main(["replay", str(EXAMPLES / f"{example}.toml"), "-o", str(out),
                     *fewer, "--quiet"]) == 0
        report = json.loads(out.read_text())
        report.pop("wall_time_ms", None)
        reports.append(report)
    assert reports[0] == reports[1]
    assert reports[0]["completed_requests"] > 0

