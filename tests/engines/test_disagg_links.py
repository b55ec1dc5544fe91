"""P/D transfers sharing a link: which transfers share one (``kv_transfer.sharing``), the
TTFTs that follow, and the report's transfer figures.

Fixed timing as in test_disagg: a prefill pass takes P = 10 ms, a decode pass D = 1 ms; a
token's KV is 1e6 B, so a 16-token prompt is 16e6 B, 16 ms alone on a 1 GB/s link.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest

from servesim.cli import main
from servesim.compiler import SourceText, compile_source
from servesim.engines.kernel.requests import RequestSpec
from servesim.replay import replay

from .conftest import Sim
from .test_disagg import D, P, assert_drained, decode_role, link, prefill_role, run_pd

PROMPT = 16
ALONE = 16.0  # ms: 16 tokens x 1e6 B at 1 GB/s


def burst(n: int, out: int = 2) -> list[RequestSpec]:
    return [Sim.spec(i, PROMPT, out) for i in range(n)]


def roomy(**kw: Any) -> dict[str, Any]:
    """Room for 16 prompts of 4 blocks in one pass."""
    return {"num_gpu_blocks": 96, "max_sequences": 16, "max_batched_tokens": 512, **kw}


def shared(sharing: str) -> Any:
    return attrs.evolve(link(1.0), sharing=sharing)


@pytest.mark.parametrize(("sharing", "transfer"), [("prefill_worker", 16 * ALONE),
                                                   ("decode_worker", 16 * ALONE),
                                                   ("none", ALONE)])
def test_sixteen_simultaneous_handoffs_share_the_link(sharing: str, transfer: float) -> None:
    # One prefill pass computes all 16 prompts (0-10 ms); the decode worker reserves all 16
    # at 10 ms and the 16 transfers start together: 1/16 GB/s each, so all end at
    # 10 + 256 ms, where one decode pass emits every first token. Without sharing each
    # takes its 16 ms alone.
    records, stats, replay = run_pd(burst(16), kv=shared(sharing),
                                    prefill=prefill_role(**roomy()),
                                    decode=decode_role(**roomy()))
    for r in records.values():
        assert r.kv_transfer_start_ms == P
        assert r.kv_transfer_end_ms == P + transfer
        assert r.token_times[0] - r.arrival_ms == P + transfer + D
    assert stats.transfers == 16 and stats.transfer_ms == 16 * transfer
    assert stats.links == {
        "kv_transfers": 16, "mean_kv_transfer_ms": transfer,
        "median_kv_transfer_ms": transfer, "p99_kv_transfer_ms": transfer,
        "max_kv_transfer_ms": transfer, "mean_kv_transfer_uncontended_ms": ALONE,
        "max_concurrent_kv_transfers": 16 if sharing != "none" else 1}
    assert_drained(replay)


@pytest.mark.parametrize(("sharing", "prefill_replicas", "decode_replicas", "transfer"), [
    ("prefill_worker", 2, 1, ALONE),  # two sources, one destination
    ("decode_worker", 2, 1, 2 * ALONE),
    ("prefill_worker", 1, 2, 2 * ALONE),  # one source, two destinations
    ("decode_worker", 1, 2, ALONE),
])
def test_which_transfers_share_a_link(sharing: str, prefill_replicas: int,
                                      decode_replicas: int, transfer: float) -> None:
    # Two requests at 0, placed round-robin: both prefills end at 10 ms and both transfers
    # start then; they share a link only if they leave the same prefill worker
    # (prefill_worker) or reach the same decode worker (decode_worker).
    records, _, _ = run_pd(burst(2), kv=shared(sharing),
                           prefill=prefill_role(**roomy(replicas=prefill_replicas)),
                           decode=decode_role(**roomy(replicas=decode_replicas)))
    assert [r.kv_transfer_end_ms for r in records.values()] == [P + transfer] * 2


def test_a_transfer_joining_late_slows_the_one_in_flight() -> None:
    # A prefill worker taking one prompt per pass: request 0's prefill ends at 10 ms, its
    # 32-token transfer (32 ms alone) starts; request 1's ends at 20 ms, when request 0 has
    # 22e6 B left. Shared: 0.5 GB/s each; request 1's 16e6 B are done at 20 + 32 = 52 ms,
    # request 0 then has 6e6 B left: 6 ms alone, ending at 58 ms (48e6 B in 48 ms).
    specs = [Sim.spec(0, 32, 2), Sim.spec(1, PROMPT, 2)]
    records, stats, replay = run_pd(specs, kv=link(1.0),
                                    prefill=prefill_role(**roomy(max_sequences=1)),
                                    decode=decode_role(**roomy()))
    assert (records[0].kv_transfer_end_ms, records[1].kv_transfer_end_ms) == (58.0, 52.0)
    assert records[1].kv_transfer_start_ms == 2 * P
    assert stats.links["mean_kv_transfer_uncontended_ms"] == (32.0 + 16.0) / 2
    assert stats.links["mean_kv_transfer_ms"] == (48.0 + 32.0) / 2
    assert_drained(replay)


def test_a_transfer_with_nothing_to_send_does_not_take_a_share() -> None:
    # destination_missing: request 1 repeats request 0's 16-token prompt, resident on the
    # decode rank, so its transfer has no bytes: it ends where it starts and request 2,
    # transferring at the same time, keeps the whole link.
    same = Sim.prompt((1, PROMPT))
    specs = [Sim.spec(0, same, 40), Sim.spec(1, same, 2, arrival=30.0),
             Sim.spec(2, PROMPT, 2, arrival=30.0)]
    records, stats, _ = run_pd(specs, kv=link(1.0, mode="destination_missing"),
                               prefill=prefill_role(**roomy()), decode=decode_role(**roomy()))
    assert records[1].kv_transfer_start_ms == records[1].kv_transfer_end_ms == 40.0
    assert records[2].kv_transfer_end_ms == 40.0 + ALONE
    assert stats.links["max_concurrent_kv_transfers"] == 1


CONFIG = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.prefill.scheduler]
max_sequences = 16
[engine.workers.prefill.timing]
type = "fixed"
prefill_ms = 10.0
decode_ms = 0.0
[engine.workers.decode.timing]
type = "fixed"
prefill_ms = 0.0
decode_ms = 1.0
[engine.kv_transfer]
bytes_per_token = 1000000
bandwidth_gb_per_second = 1.0
{sharing}
[traffic.source]
type = "synthetic"
input_tokens = 16
output_tokens = 4
[traffic.load]
type = "concurrency"
concurrency = 16
[traffic.stop]
requests = 16
"""


def test_a_config_chooses_the_sharing_and_the_report_shows_the_contention() -> None:
    def report(sharing: str) -> dict[str, Any]:
        text = CONFIG.format(sharing=sharing)
        report: dict[str, Any] = replay(compile_source(
            SourceText(text=text, name="links.toml"))).report
        return report

    default, alone = report(""), report('sharing = "none"')
    assert default == report('sharing = "prefill_worker"')
    # 16 closed-loop requests at 0: one prefill pass, 16 transfers sharing 1 GB/s
    assert default["max_concurrent_kv_transfers"] == 16
    assert default["mean_kv_transfer_ms"] == default["p99_kv_transfer_ms"] == 16 * ALONE
    assert default["mean_kv_transfer_uncontended_ms"] == alone["mean_kv_transfer_ms"] == ALONE
    assert default["mean_ttft_ms"] == P + 16 * ALONE + D
    assert alone["mean_ttft_ms"] == P + ALONE + D


@pytest.mark.parametrize(("sharing", "row"), [
    ("", "KV link sharing up to 16 transfers on one link; p99 256.00 ms, mean 16.00 ms alone"),
    ('sharing = "none"', "KV link sharing none (one transfer per link at a time)"),
])
def test_the_summary_shows_the_link_sharing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            sharing: str, row: str) -> None:
    config = tmp_path / "links.toml"
    config.write_text(CONFIG.format(sharing=sharing), encoding="utf-8")
    assert main(["replay", str(config), "--quiet"]) == 0
    assert row in " ".join(capsys.readouterr().out.split())
