"""The fit: it recovers corrections from points servesim itself synthesised (with noise),
says which constants the data cannot determine, and cross-validates."""

from __future__ import annotations

import random
from pathlib import Path

import attrs
import pytest

from servesim.calibrate.fit import Target, _determined, fit, knobs_for, mape, solve
from servesim.calibrate.measurements import MeasuredPoint
from servesim.calibrate.run import predictor, targets
from servesim.compiler import compile_file
from servesim.payload import CalibrationArgs, Payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated.parallelism]
tensor = 2
[engine.workers.aggregated.timing]
type = "default"
"""
TRUE = CalibrationArgs(prefill_scale=1.3, decode_scale=0.85, front_end_ms=20.0)


@pytest.fixture(scope="module")
def payload(tmp_path_factory: pytest.TempPathFactory) -> Payload:
    path = tmp_path_factory.mktemp("fit") / "deploy.toml"
    path.write_text(CONFIG)
    return compile_file(str(path), registry=REGISTRY)


def synthesise(payload: Payload, shapes: list[tuple[int, int]], truth: CalibrationArgs,
               noise: float, seed: int = 7) -> list[MeasuredPoint]:
    """Points whose latencies are servesim's own with ``truth``, times 1 +- ``noise``."""
    rng = random.Random(seed)
    blank = [MeasuredPoint(label=f"c{c}-isl{isl}", format="test", input_tokens=isl,
                           output_tokens=32, ttft_ms=1.0, tpot_ms=1.0, concurrency=c,
                           requests=4 * c)
             for c, isl in shapes]
    predict = predictor(payload, blank, registry=REGISTRY, base_dir=None)
    out = []
    for i, p in enumerate(blank):
        ttft, tpot = predict(i, {"aggregated": truth})
        assert ttft is not None and tpot is not None
        out.append(attrs.evolve(p, ttft_ms=ttft * (1 + rng.uniform(-noise, noise)),
                                tpot_ms=tpot * (1 + rng.uniform(-noise, noise))))
    return out


def run_fit(payload: Payload, points: list[MeasuredPoint],
            progress: list[tuple[str, int, int]] | None = None) -> object:
    return fit(targets(points), ["aggregated"],
               predictor(payload, points, registry=REGISTRY, base_dir=None),
               progress=None if progress is None else lambda *a: progress.append(a))


def test_fit_recovers_known_constants_from_noisy_synthesised_points(payload: Payload) -> None:
    points = synthesise(payload, [(2, 512), (8, 512), (2, 2048), (8, 2048)], TRUE, 0.01)
    progress: list[tuple[str, int, int]] = []
    result = run_fit(payload, points, progress)
    # the progress bar's feed: each phase counts its replays up to its total
    phases = [p for i, p in enumerate(progress) if i == 0 or progress[i - 1][0] != p[0]]
    assert phases[0] == ("as configured", 1, 4)
    assert phases[-1] == ("cross-validating", 1, 4) and progress[-1] == (
        "cross-validating", 4, 4)
    assert any(name == "sensitivities" and total == 16 for name, _, total in phases)
    got = result.values["aggregated"]  # type: ignore[attr-defined]
    assert got.prefill_scale == pytest.approx(TRUE.prefill_scale, rel=0.1)
    assert got.decode_scale == pytest.approx(TRUE.decode_scale, rel=0.05)
    assert got.front_end_ms == pytest.approx(TRUE.front_end_ms, abs=8.0)
    # two prompt lengths: the per-token front end could be fitted, but its truth is 0, so
    # it predicts no left-out point better and keeps its neutral value, with a note
    fitted = result.fitted["aggregated"]  # type: ignore[attr-defined]
    assert fitted == ["prefill_scale", "decode_scale", "front_end_ms"]
    assert got.front_end_ms_per_1k_tokens == 0.0
    assert any("not fitted: aggregated.front_end_ms_per_1k_tokens" in w
               for w in result.warnings)  # type: ignore[attr-defined]
    for p in result.points:  # type: ignore[attr-defined]
        assert p.after[0] == pytest.approx(p.target.ttft_ms, rel=0.05)
        assert p.after[1] == pytest.approx(p.target.tpot_ms, rel=0.03)
        assert p.cross is not None
    # before: the uncalibrated timing is off by the true corrections
    pairs = [(p.before, p.after, p.target) for p in result.points]  # type: ignore[attr-defined]
    assert mape([(b[1], t.tpot_ms) for b, _, t in pairs]) > 3 * mape(  # type: ignore[operator]
        [(a[1], t.tpot_ms) for _, a, t in pairs])
    assert mape([(b[0], t.ttft_ms) for b, _, t in pairs]) > 3 * mape(  # type: ignore[operator]
        [(a[0], t.ttft_ms) for _, a, t in pairs])


def test_fit_at_one_load_and_length_warns_and_keeps_front_end_neutral(
        payload: Payload) -> None:
    points = synthesise(payload, [(4, 1024)], TRUE, 0.0)
    result = run_fit(payload, points)
    warnings = " ".join(result.warnings)  # type: ignore[attr-defined]
    assert "every point was measured at one load" in warnings
    assert "too few for a cross-validated error" in warnings
    assert result.points[0].cross is None  # type: ignore[attr-defined]


def test_a_column_the_others_explain_is_not_determined() -> None:
    targets_ = [Target("a", 100.0, 10.0, 1000, 4.0)]
    knobs, _ = knobs_for(["aggregated"], targets_ * 3)
    names = [k.field for k in knobs]
    assert names == ["prefill_scale", "decode_scale", "front_end_ms"]
    # one point: TTFT row and TPOT row; front end moves TTFT like prefill does
    jac = [[[0.9, 0.1, 0.9], [0.0, 1.0, 0.0]]]
    keep, notes = _determined(knobs, jac)
    assert keep == [True, True, False]
    assert "aggregated.front_end_ms" in notes[0]
    keep, notes = _determined(knobs, [[[0.9, 0.0, 0.4], [0.1, 0.0, 0.0]]])
    assert keep == [True, False, True] and "no measured latency depends on it" in notes[0]


def test_no_tpot_means_no_decode_scale() -> None:
    knobs, notes = knobs_for(["aggregated"], [Target("a", 100.0, None, 512, 1.0),
                                              Target("b", 200.0, None, 512, 8.0)])
    assert "decode_scale" not in [k.field for k in knobs]
    assert any("no point has more than one output token" in n for n in notes)


def test_solve_small_systems() -> None:
    assert solve([[2.0, 1.0], [1.0, 3.0]], [3.0, 5.0]) == pytest.approx([0.8, 1.4])
    assert solve([[0.0, 0.0], [0.0, 1.0]], [0.0, 2.0]) == pytest.approx([0.0, 2.0])


def test_the_replay_of_a_point_follows_its_load(payload: Payload, tmp_path: Path) -> None:
    base = MeasuredPoint(label="x", format="test", input_tokens=1024, output_tokens=64,
                         ttft_ms=1.0, tpot_ms=1.0, concurrency=2, requests=12)
    busy = attrs.evolve(base, concurrency=32, requests=96)
    rate = attrs.evolve(base, concurrency=None, request_rate=0.5, requests=10)
    predict = predictor(payload, [base, busy, rate], registry=REGISTRY, base_dir=None)
    neutral = {"aggregated": CalibrationArgs()}
    (t2, p2), (t32, p32), (tr, pr) = (predict(i, neutral) for i in range(3))
    assert t32 is not None and p32 is not None and t2 is not None and p2 is not None
    assert t32 > t2 and p32 > p2  # more clients queue and batch more
    assert tr is not None and pr is not None and tr < t32


def test_more_constants_when_the_data_spans_more() -> None:
    def fields(targets_: list[Target]) -> list[str]:
        return [k.field for k in knobs_for(["aggregated"], targets_)[0]]

    four = [Target(f"c{c}", 100.0, 10.0, 1024, float(c)) for c in (4, 8, 16, 32)]
    assert fields(four) == ["prefill_scale", "decode_scale", "front_end_ms"]
    six = four + [Target(f"c{c}", 100.0, 10.0, 1024, float(c)) for c in (64, 128)]
    assert fields(six)[-1] == "decode_step_ms"
    lengths = [*four, Target("long", 300.0, 12.0, 4096, 8.0)]
    assert "front_end_ms_per_1k_tokens" in fields(lengths)
    # a P/D deployment: the prefill role prices prompts and the front end, decode the rest
    split = [k.name for k in knobs_for(["prefill", "decode"], six)[0]]
    assert split == ["prefill.prefill_scale", "prefill.front_end_ms", "decode.decode_scale",
                     "decode.decode_step_ms"]


def test_cross_validation_keeps_a_constant_the_points_need(payload: Payload) -> None:
    truth = attrs.evolve(TRUE, front_end_ms_per_1k_tokens=60.0)
    shapes = [(2, 512), (8, 512), (2, 4096), (8, 4096), (4, 2048)]
    result = run_fit(payload, synthesise(payload, shapes, truth, 0.01))
    got = result.values["aggregated"]  # type: ignore[attr-defined]
    assert "front_end_ms_per_1k_tokens" in result.fitted["aggregated"]  # type: ignore[attr-defined]
    assert got.front_end_ms_per_1k_tokens == pytest.approx(60.0, abs=20.0)


def test_points_no_correction_explains_are_left_uncalibrated() -> None:
    """Four points whose errors no shared correction explains (each off its own way): every
    fitted set predicts the left-out points worse than none, so nothing is fitted."""
    offsets = [1.6, 0.6, 1.5, 0.7]  # measured = predicted x offset, alternating

    def predict(i: int, values: dict[str, CalibrationArgs]) -> tuple[float, float]:
        v = values["aggregated"]
        return 100.0 * v.prefill_scale + v.front_end_ms, 10.0 * v.decode_scale

    targets_ = [Target(f"p{i}", 100.0 * o, 10.0 / o, 1024, float(2 ** i))
                for i, o in enumerate(offsets)]
    result = fit(targets_, ["aggregated"], predict)
    assert result.fitted["aggregated"] == []
    assert result.values["aggregated"] == CalibrationArgs()
    assert any(w.startswith("not fitted: aggregated.prefill_scale") for w in result.warnings)
    for p in result.points:
        assert p.after == p.before == p.cross


def test_the_replays_spread_comes_from_the_flag_then_the_config(
        payload: Payload, tmp_path: Path) -> None:
    from servesim.calibrate.run import OUTPUT_SPREAD, output_spread

    assert output_spread(payload) == OUTPUT_SPREAD  # the config sets none
    path = tmp_path / "spread.toml"
    path.write_text(CONFIG + "[traffic.source]\ntype = \"synthetic\"\n"
                    "output_range_ratio = 0.05\n")
    own = compile_file(str(path), registry=REGISTRY)
    assert output_spread(own) == 0.05
    assert output_spread(own, 0.0) == 0.0  # --output-spread 0: the clients in lockstep
