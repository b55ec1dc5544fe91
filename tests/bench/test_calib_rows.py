"""The calibration bench's row checks (bench/calib.py)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import calib


def _row(concurrency: int, tpot_ms: float, **changes: object) -> calib.Row:
    fields: dict[str, object] = dict(
        id=f"c{concurrency}", backend="vllm", system="h100_sxm", model="m", mode="agg",
        isl=1024, osl=1024, concurrency=concurrency, tp=4, dp=1, moe_tp=1, moe_ep=1,
        gemm_quant="fp8", moe_quant="", ttft_ms=100.0, tpot_ms=tpot_ms)
    fields.update(changes)
    return calib.Row(**fields)  # type: ignore[arg-type]


def test_a_tpot_under_half_of_a_lower_concurrency_is_inconsistent() -> None:
    rows = [_row(4, 4.0), _row(64, 10.0), _row(512, 4.7)]
    assert [r.id for r in calib.inconsistent(rows)] == ["c512"]


def test_noise_and_faster_rows_at_lower_concurrency_are_kept() -> None:
    # c64 below c32 but not under half of it (noise), and c4 below every higher one
    rows = [_row(4, 4.0), _row(32, 15.0), _row(64, 9.7)]
    assert calib.inconsistent(rows) == []


@pytest.mark.parametrize("change", [
    {"tp": 8}, {"isl": 8192}, {"osl": 8192}, {"gemm_quant": "bf16"}, {"system": "b200_sxm"},
    {"backend": "sglang"}, {"mode": "disagg"},
])
def test_only_the_same_deployment_is_compared(change: dict[str, object]) -> None:
    rows = [_row(64, 10.0, **change), _row(512, 4.7)]
    assert calib.inconsistent(rows) == []


def test_an_inconsistent_row_is_reported_not_replayed() -> None:
    row = _row(512, 4.7, excluded="not a steady state")
    with pytest.raises(calib.Unsupported, match="not a steady state"):
        calib.setup(row, max_tokens=calib.MAX_TOKENS)


def test_the_shipped_rows_flag_only_the_h100_gpt_oss_concurrency_512_rows() -> None:
    flagged = [r for r in calib.load_rows() if r.excluded.startswith("TPOT under half")]
    assert flagged
    assert {(r.system, r.backend, r.model, r.concurrency) for r in flagged} == {
        ("h100_sxm", "vllm", "openai/gpt-oss-120b", 512)}


def test_the_validation_rows_are_of_gpus_the_fit_never_sees() -> None:
    fitted = {r.system for r in calib.load_rows()}
    unfitted = calib.load_rows(calib.DATA.parent / "validation_gpus.csv")
    assert unfitted
    assert not {r.system for r in unfitted} & fitted


def _one_row_per_partition() -> list[calib.Row]:
    found: dict[tuple[str, ...], calib.Row] = {}
    for row in calib.load_rows():
        if calib.counted(row):
            found.setdefault(row.partition, row)
    return list(found.values())


@pytest.mark.parametrize("row", _one_row_per_partition(), ids=lambda r: "-".join(r.partition))
def test_each_row_replays_through_a_config_servesim_validate_accepts(
        row: calib.Row, tmp_path: Path, servesim_cli: Callable[..., Any]) -> None:
    try:
        s = calib.setup(row, max_tokens=calib.MAX_TOKENS)
    except calib.Unsupported:
        pytest.skip("not replayable")
    config = tmp_path / "row.toml"
    config.write_text(s.config, encoding="utf-8")
    result = servesim_cli("validate", config)
    assert result.code == 0, result.err
    # one rule for every row: an FP8 KV cache exactly where the weights are FP8 or FP4
    quantised = row.gemm_quant in ("fp8", "fp8_block", "nvfp4") or \
        s.geometry.moe_quant == "mxfp4"  # gpt-oss: the checkpoint's MXFP4 experts
    assert ('kvcache_quant_mode = "fp8"' in s.config) is quantised
    assert "output_range_ratio = 0.2" in s.config


def test_every_aggregated_validation_partition_can_be_replayed() -> None:
    replayable: dict[tuple[str, ...], int] = {}
    for row in calib.load_rows(calib.DATA.parent / "validation_gpus.csv"):
        if calib.counted(row):
            try:
                calib.setup(row, max_tokens=calib.MAX_TOKENS)
                ok = 1
            except calib.Unsupported:
                ok = 0
            replayable[row.partition] = replayable.get(row.partition, 0) + ok
    assert len(replayable) >= 15
    assert [p for p, n in replayable.items() if not n] == []


@pytest.mark.parametrize("concurrency", [1, 4, 16])
def test_repricing_a_recording_gives_the_replays_figures(concurrency: int) -> None:
    # The fit re-prices one recording with thousands of constant sets instead of
    # replaying; what it sees must be what bench/accuracy.py's replay gives. A request
    # sent when a pass ends waits for the next one, as in the replay, whose front end
    # overlaps that wait: re-pricing may count the front end's latency once more. (The
    # recording bins the KV tokens of decode passes by 1.6%, hence the tolerances.) This
    # holds while the front end is shorter than a pass, as it is here (a few ms).
    from servesim.timing.analytical import AnalyticalTimer, load_constants

    row = _row(concurrency, 10.0, model="Qwen/Qwen3-32B", isl=700, osl=40, tp=1)
    s = calib.setup(row, max_tokens=calib.MAX_TOKENS)
    assert isinstance(s, calib.Setup)
    constants = load_constants().with_values(**{
        "vllm.request_ms": 2.0, "vllm.request_us_per_token": 1.0,
        "vllm.request_layer_us": 1.0, "vllm.request_moe_layer_us": 0.0})
    timer = AnalyticalTimer(s.geometry, constants)
    pass_ms = timer.decode_ms(concurrency, concurrency * 740, 740.0, concurrency * 740)
    assert timer.request_ms(row.isl) < pass_ms
    replayed = calib.replay(s, constants)
    ttft, tpot = calib.record(s).evaluate(timer)
    assert tpot == pytest.approx(replayed.tpot_ms, rel=1e-3)
    slack = 1e-3 * replayed.ttft_ms
    assert replayed.ttft_ms - slack <= ttft <= replayed.ttft_ms + timer.request_ms(row.isl) + slack


def test_a_group_off_by_one_factor_leaves_no_error_within_it() -> None:
    assert calib.level_floor([[2.0, 2.0, 2.0], [0.5, 0.5]]) == pytest.approx(0.0)


def test_the_error_within_a_group_stays_and_finer_groups_remove_it() -> None:
    assert calib.level_floor([[1.0, 2.0]]) > 0.0
    assert calib.level_floor([[1.0], [2.0]]) == pytest.approx(0.0)


@pytest.mark.parametrize("ratios", [[1.0, 2.0, 4.0], [0.3, 0.9, 1.1, 1.2], [1.5]])
def test_the_best_scale_minimises_the_groups_absolute_error(ratios: list[float]) -> None:
    def cost(k: float) -> float:
        return sum(abs(k * r - 1.0) for r in ratios)

    best = cost(calib.best_scale(ratios))
    assert all(best <= cost(k / 100) + 1e-12 for k in range(1, 400))


def test_a_measurement_carried_twice_counts_once_under_its_recorded_version() -> None:
    # one export leaves the version out and names the model differently
    rows = [_row(64, 10.0, id="a", model="m-v3", version=""),
            _row(64, 10.0, id="b", model="m-r1", version="0.5.9"),
            _row(64, 10.0, id="c", model="m-r1", version="0.5.9")]
    assert [r.id for r in calib.repeats(rows)] == ["a", "c"]


def test_an_export_rounded_to_two_decimals_repeats_the_exact_one() -> None:
    exact = _row(32, 18.513764939850052, id="exact", ttft_ms=208.3183024878963)
    rounded = _row(32, 18.51, id="rounded", ttft_ms=208.32)
    assert [r.id for r in calib.repeats([exact, rounded])] == ["rounded"]


@pytest.mark.parametrize(("concurrency", "tpot_ms", "change"), [
    (64, 10.01, {}), (64, 10.0, {"ttft_ms": 100.01}), (32, 10.0, {}), (64, 10.0, {"tp": 8}),
    (64, 10.0, {"osl": 8192}), (64, 10.0, {"system": "b200_sxm"}),
    (64, 10.0, {"mode": "disagg"}),
])
def test_another_measurement_or_configuration_is_no_repeat(
        concurrency: int, tpot_ms: float, change: dict[str, object]) -> None:
    assert calib.repeats([_row(64, 10.0), _row(concurrency, tpot_ms, **change)]) == []


def test_a_repeated_row_is_reported_not_replayed() -> None:
    rows = calib.load_rows()
    repeated = [r for r in rows if r.excluded.startswith("repeats")]
    assert repeated
    with pytest.raises(calib.Unsupported, match="repeats another row's measurement"):
        calib.setup(repeated[0], max_tokens=calib.MAX_TOKENS)


def test_the_deepseek_r1_runs_filed_under_v3_are_loaded_as_r1() -> None:
    rows = calib.load_rows()
    refiled = [r for r in rows if r.id.startswith("dsr1_")]
    assert refiled
    assert {r.model for r in refiled} == {"deepseek-ai/DeepSeek-R1"}
    assert "deepseek-ai/DeepSeek-V3" not in {r.model for r in rows}


def _pd_pair(gpus: int = 36, **pools: int) -> tuple[calib.Row, calib.Row]:
    """An aggregated row recording ``gpus`` as its tensor parallelism and a disaggregated
    row of the same configuration recording both pools at ``pools`` (default: the same)."""
    pool = {"workers": 0, "tp": gpus, "dp": 1, "moe_tp": gpus, "moe_ep": 1}
    agg = _row(1075, 17.93, id="agg", system="gb200", backend="trtllm",
               model="org/DeepSeek-R1", tp=gpus, moe_tp=gpus)
    disagg = _row(1075, 17.97, id="disagg", system="gb200", backend="trtllm",
                  model="org/DeepSeek-R1", mode="disagg", tp=1, moe_tp=1,
                  pools={"prefill": {**pool, **pools}, "decode": pool})
    return agg, disagg


def test_an_aggregated_row_of_a_p_d_deployments_gpu_count_is_its_copy() -> None:
    agg, disagg = _pd_pair()
    assert calib.pd_copies([agg, disagg]) == [agg]


@pytest.mark.parametrize("change", [
    {"moe_ep": 36, "moe_tp": 1}, {"dp": 36, "tp": 1}, {"concurrency": 1024},
    {"isl": 8192}, {"system": "b200_sxm"},
])
def test_another_layout_or_configuration_is_no_p_d_copy(change: dict[str, object]) -> None:
    agg, disagg = _pd_pair()
    assert calib.pd_copies([dataclasses.replace(agg, **change), disagg]) == []


def test_eight_gpus_are_an_aggregated_deployment_of_their_own() -> None:
    # B200 exports record 8-GPU P/D pools beside aggregated runs of the same layout
    assert calib.pd_copies(list(_pd_pair(8))) == []


def test_pools_of_their_own_sizes_make_no_p_d_copy() -> None:
    agg, disagg = _pd_pair(tp=4, moe_tp=4)  # four prefill GPUs beside a 36-GPU decode pool
    assert calib.pd_copies([agg, disagg]) == []
    assert calib.pd_copies([agg]) == []


def test_the_shipped_p_d_copies_are_gb200_deepseek_rows_and_not_replayed() -> None:
    copies = [r for r in calib.load_rows() if r.excluded.startswith("a P/D run filed")]
    assert copies
    assert {(r.system, r.model) for r in copies} == {("gb200", "deepseek-ai/DeepSeek-R1")}
    with pytest.raises(calib.Unsupported, match="P/D run filed as aggregated"):
        calib.setup(copies[0], max_tokens=calib.MAX_TOKENS)
