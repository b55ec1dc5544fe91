"""Speculation x prefix_match_unit on the inferred Kimi K3 geometry, end to end.

Kimi K3 at TP8 with FP8 KV and a requested block of 128 tokens resolves to 1536-token
blocks (state-cache sizing). With speculation (canonical ``engine.speculation`` or the
legacy ``nextn`` form) ``prefix_match_unit`` must equal that resolved block size; without
speculation any divisor of it is allowed. The compiler checks it per role, and
``servesim replay`` re-checks a hand-edited payload with the same rule before replaying.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servesim.cli import main
from servesim.compiler import compile_text, default_registry
from servesim.errors import CompileError
from servesim.payload import dump_payload, load_payload

CANONICAL_MTP = ('speculation = { kind = "mtp", num_speculative_tokens = 3, '
                 "acceptance_rates = [1.0, 1.0, 0.2] }")
CANONICAL_NGRAM = ('speculation = { kind = "ngram", num_speculative_tokens = 2, '
                   "acceptance_rates = [0.8, 0.6] }")
LEGACY = "nextn = 3\nnextn_accepted = 2.2"
FORMS = [CANONICAL_MTP, CANONICAL_NGRAM, LEGACY]
FORM_IDS = ["canonical-mtp", "canonical-ngram", "legacy-nextn"]

TRAFFIC = """
[traffic.source]
type = "synthetic"
input_tokens = 4000
output_tokens = 6
cached_prefix_tokens = 3968

[traffic.load]
type = "concurrency"
concurrency = 1

[traffic.stop]
requests = 3
"""


def _role(name: str, tensor: int, unit: int | None) -> str:
    pmu = f"prefix_match_unit = {unit}\n" if unit is not None else ""
    return f"""
[engine.workers.{name}.parallelism]
tensor = {tensor}
[engine.workers.{name}.kv_cache]
block_size = 128
{pmu}[engine.workers.{name}.kv_cache.capacity]
type = "fixed"
blocks = 64
[engine.workers.{name}.kv_cache.state_cache]
[engine.workers.{name}.timing]
type = "fixed"
prefill_ms = 20.0
decode_ms = 2.0
"""


def kimi(speculation: str = "", unit: int | None = None) -> str:
    return f"""
[engine]
model = "moonshotai/Kimi-K3"
hardware = "b200_sxm"
kvcache_quant_mode = "fp8"
context_length = 32768
{speculation}
{_role("aggregated", 8, unit)}
{TRAFFIC}"""


def kimi_pd(speculation: str = "", prefill_unit: int | None = None,
            decode_unit: int | None = None) -> str:
    return f"""
[engine]
model = "moonshotai/Kimi-K3"
hardware = "b200_sxm"
kvcache_quant_mode = "fp8"
context_length = 32768
mode = "disaggregated"
{speculation}
{_role("prefill", 8, prefill_unit)}
{_role("decode", 4, decode_unit)}
[engine.kv_transfer]
bandwidth_gb_per_second = 50.0
{TRAFFIC}"""


def _messages(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compile_text(text)
    return [d.message for d in info.value.diagnostics]


def _write(tmp_path: Path, text: str, name: str = "cfg.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- the compiler ---------------------------------------------------------------------------


def test_kimi_k3_resolves_to_1536_token_blocks() -> None:
    role = compile_text(kimi()).roles["aggregated"]
    assert role.block_size == 1536 and role.kv_bytes_per_token == 13824
    assert role.state_cache is not None and role.state_cache.bytes_per_request == 61046784
    assert role.state_cache.state_blocks == 3 and role.state_cache.source == "inferred"


@pytest.mark.parametrize("unit", [None, 128, 512, 1536])
def test_without_speculation_any_divisor_of_the_resolved_block_is_allowed(
        unit: int | None) -> None:
    assert compile_text(kimi(unit=unit)).roles["aggregated"].prefix_match_unit == unit


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
def test_speculation_with_the_resolved_block_as_unit_is_allowed(speculation: str) -> None:
    role = compile_text(kimi(speculation, 1536)).roles["aggregated"]
    assert role.prefix_match_unit == 1536 and role.speculation is not None


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
@pytest.mark.parametrize("unit", [128, 512])
def test_speculation_with_a_sub_block_unit_is_rejected(speculation: str, unit: int) -> None:
    # 128 is the *requested* block size; the role runs with 1536
    assert _messages(kimi(speculation, unit)) == [
        "prefix_match_unit does not support speculative decoding (speculation or nextn > 0) "
        f"unless it equals the resolved block_size 1536, got {unit}"]


def test_legacy_nextn_is_normalised_to_the_canonical_form() -> None:
    legacy = compile_text(kimi(LEGACY, 1536)).roles["aggregated"].speculation
    canonical = compile_text(kimi(CANONICAL_MTP, 1536)).roles["aggregated"].speculation
    assert legacy == canonical
    assert legacy is not None and legacy.acceptance_rates == (1.0, 1.0, 0.2)


def test_disaggregated_roles_are_checked_each_with_its_own_block_size() -> None:
    payload = compile_text(kimi_pd(CANONICAL_MTP, prefill_unit=1536))
    prefill, decode = payload.roles["prefill"], payload.roles["decode"]
    assert prefill.block_size == 1536 and decode.block_size != 1536
    decode_block = decode.block_size
    # the prefill's block size is not the decode's; half the decode block divides it
    half = decode_block // 2
    assert compile_text(kimi_pd(prefill_unit=1536, decode_unit=half)).roles[
        "decode"].prefix_match_unit == half
    assert _messages(kimi_pd(CANONICAL_MTP, prefill_unit=1536, decode_unit=half)) == [
        "prefix_match_unit does not support speculative decoding (speculation or nextn > 0) "
        f"unless it equals the resolved block_size {decode_block}, got {half}"]
    assert _messages(kimi_pd(CANONICAL_MTP, prefill_unit=1536, decode_unit=1536)) == [
        "prefix_match_unit must be a positive divisor of the resolved block_size "
        f"{decode_block}, got 1536"]
    ok = compile_text(kimi_pd(LEGACY, prefill_unit=1536, decode_unit=decode_block))
    assert ok.roles["decode"].prefix_match_unit == decode_block
    # without speculation a divisor of each role's block is enough
    assert compile_text(kimi_pd(prefill_unit=128, decode_unit=128)).roles[
        "decode"].prefix_match_unit == 128


# -- the CLI -------------------------------------------------------------------------------


# Requests of 4000 tokens sharing 3968 (31 units of 128), one after the other. Unit 128:
# the first request's prefill stops at 3968 and leaves a checkpoint there. Unit 1536 (with
# speculation): it stops at 3072, the last block boundary. MTP also drops one more block
# from the 3072-token hit: no checkpoint at 1536 remains, so nothing is reused.
@pytest.mark.parametrize(("speculation", "reused"), [
    ("", 3968), (CANONICAL_MTP, 0), (CANONICAL_NGRAM, 3072), (LEGACY, 0)],
    ids=["none", *FORM_IDS])
def test_cli_validates_compiles_and_replays_accepted_variants(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], speculation: str,
        reused: int) -> None:
    cfg = _write(tmp_path, kimi(speculation, 1536 if speculation else 128))
    assert _cli(capsys, "validate", str(cfg))[0] == 0
    payload_path = tmp_path / "payload.json"
    assert _cli(capsys, "compile", str(cfg), "-o", str(payload_path))[0] == 0
    reports = []
    for source in (cfg, payload_path):
        report_path = tmp_path / f"report-{source.suffix[1:]}.json"
        code, _, err = _cli(capsys, "replay", str(source), "-o", str(report_path), "--quiet")
        assert code == 0, err
        reports.append(json.loads(report_path.read_text()))
    for report in reports:
        assert report["completed_requests"] == 3
        assert report["total_output_tokens"] == 18
        assert report["prefix_cache_reused_ratio"] == pytest.approx(2 * reused / 12000)
    keys = ("completed_requests", "total_output_tokens", "prefix_cache_reused_ratio",
            "mean_ttft_ms", "mean_e2e_latency_ms")
    assert [reports[0][k] for k in keys] == [reports[1][k] for k in keys]


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
def test_cli_rejects_a_sub_block_unit_with_speculation(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], speculation: str) -> None:
    cfg = _write(tmp_path, kimi(speculation, 128))
    for command in ("validate", "compile", "replay"):
        code, _, err = _cli(capsys, command, str(cfg))
        assert code == 1
        assert "engine.workers.aggregated.kv_cache.prefix_match_unit" in err
        assert "resolved block_size 1536, got 128" in err


def test_inspect_shows_the_legacy_normalisation(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path) -> None:
    code, out, _ = _cli(capsys, "inspect", str(_write(tmp_path, kimi(LEGACY, 1536))))
    assert code == 0
    flat = " ".join(out.split())
    assert 'kind = "mtp"' in flat and "acceptance_rates = [1.0, 1.0, 0.2]" in flat
    assert "nextn_accepted = 2.2" in flat
    assert "block_size = 1536" in flat


# -- hand-edited payloads ------------------------------------------------------------------


def _payload_dict(text: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(dump_payload(compile_text(text)))
    return data


def _replay_payload(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                    data: dict[str, Any]) -> tuple[int, str]:
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    code, _, err = _cli(capsys, "replay", str(path), "--quiet", "--format", "json")
    return code, err


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
def test_a_hand_edited_sub_block_unit_is_rejected_at_handoff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], speculation: str) -> None:
    data = _payload_dict(kimi(speculation, 1536))
    assert _replay_payload(tmp_path, capsys, data)[0] == 0
    data["roles"]["aggregated"]["prefix_match_unit"] = 128
    code, err = _replay_payload(tmp_path, capsys, data)
    assert code == 1
    assert ("engine.workers.aggregated.kv_cache.prefix_match_unit: prefix_match_unit does not "
            "support speculative decoding") in " ".join(err.split())
    assert "resolved block_size 1536, got 128" in err


def test_hand_added_speculation_next_to_a_sub_block_unit_is_rejected(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = _payload_dict(kimi(unit=128))
    assert _replay_payload(tmp_path, capsys, data)[0] == 0
    data["roles"]["aggregated"]["speculation"] = {
        "kind": "ngram", "num_speculative_tokens": 2, "acceptance_rates": [0.5, 0.5],
        "seed": 1}
    code, err = _replay_payload(tmp_path, capsys, data)
    assert code == 1 and "got 128" in err
    data["roles"]["aggregated"]["prefix_match_unit"] = 1536
    assert _replay_payload(tmp_path, capsys, data)[0] == 0


def test_a_hand_edited_block_size_is_checked_against_the_unit(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the rule reads the payload's block size (the one the engine will run with)
    data = _payload_dict(kimi(CANONICAL_NGRAM, 1536))
    role = data["roles"]["aggregated"]
    role["block_size"] = 3072
    role["state_cache"]["state_blocks"] = 2  # keep the state-cache geometry consistent
    code, err = _replay_payload(tmp_path, capsys, data)
    assert code == 1 and "resolved block_size 3072, got 1536" in err


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
def test_disaggregated_payload_handoff(speculation: str) -> None:
    engine = default_registry().get("disagg")
    assert engine is not None
    text = kimi_pd(speculation, prefill_unit=1536)
    payload = load_payload(json.loads(dump_payload(compile_text(text))))
    assert engine.validate_payload(payload) == []
    decode_block = payload.roles["decode"].block_size
    data = json.loads(dump_payload(payload))
    data["roles"]["decode"]["prefix_match_unit"] = decode_block
    assert engine.validate_payload(load_payload(data)) == []
    data["roles"]["decode"]["prefix_match_unit"] = decode_block // 2
    edited = load_payload(data)
    assert [(d.path, d.code) for d in engine.validate_payload(edited)] == [
        (("engine", "workers", "decode", "kv_cache", "prefix_match_unit"),
         "prefix-match-unit-speculation")]
    messages = [d.message for d in engine.validate_payload(edited)]
    assert f"resolved block_size {decode_block}, got {decode_block // 2}" in messages[0]
    # without speculation the same sub-block unit is accepted
    data["roles"]["decode"].pop("speculation")
    data["roles"]["prefill"].pop("speculation")
    assert engine.validate_payload(load_payload(data)) == []


@pytest.mark.parametrize("speculation", FORMS, ids=FORM_IDS)
def test_cli_disaggregated_validate_and_payload_handoff(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], speculation: str) -> None:
    accepted = _write(tmp_path, kimi_pd(speculation, prefill_unit=1536), "pd.toml")
    assert _cli(capsys, "validate", str(accepted))[0] == 0
    payload_path = tmp_path / "pd.json"
    assert _cli(capsys, "compile", str(accepted), "-o", str(payload_path))[0] == 0
    data = json.loads(payload_path.read_text())
    decode_block = data["roles"]["decode"]["block_size"]
    rejected = _write(tmp_path, kimi_pd(speculation, prefill_unit=1536,
                                        decode_unit=decode_block // 2), "bad.toml")
    code, _, err = _cli(capsys, "validate", str(rejected))
    assert code == 1
    assert "engine.workers.decode.kv_cache.prefix_match_unit" in err
    # the same unit written into the payload by hand is refused before any replay
    data["roles"]["decode"]["prefix_match_unit"] = decode_block // 2
    code, err = _replay_payload(tmp_path, capsys, data)
    assert code == 1
    assert f"resolved block_size {decode_block}, got {decode_block // 2}" in err
    assert "engine.workers.decode.kv_cache.prefix_match_unit" in err
