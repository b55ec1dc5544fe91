"""``timing.type = "measured"``: pass prices from measured kernel tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

from servesim.backends import policy_of
from servesim.errors import Diagnostic, ReplayError
from servesim.payload import RoleArgs, TimingArgs
from servesim.rules import timing_values
from servesim.timing import make_timer
from servesim.timing.analytical import timer_from_role
from servesim.timing.measured import (
    Axes,
    MeasuredGrid,
    MeasuredTimer,
    _lerp,
    _moe_mode,
    grid_key,
)

MEASURED = """
[engine]
model = "meta-llama/Meta-Llama-3.1-8B"
hardware = "{gpu}"
backend = "vllm"
gemm_quant_mode = "{quant}"
kvcache_quant_mode = "fp8"
[engine.workers.aggregated.scheduler]
max_sequences = 16
max_batched_tokens = 2048
[engine.workers.aggregated.timing]
type = "measured"
[traffic.source]
type = "synthetic"
input_tokens = 512
output_tokens = 16
[traffic.load]
type = "concurrency"
concurrency = 4
[traffic.stop]
requests = 12
"""


def _role(**timing: Any) -> RoleArgs:
    return RoleArgs(worker_type="aggregated", backend="vllm",
                    model="meta-llama/Meta-Llama-3.1-8B", hardware="h100_sxm",
                    max_sequences=4, max_batched_tokens=256, max_model_len=1024,
                    timing=TimingArgs(type="measured", **timing))


def _grid(role: RoleArgs) -> MeasuredGrid:
    """A grid whose decode price is batch + context / 1000 and prefill price
    batch x new tokens / 100 + prefix / 1000, on the role's axes."""
    a = Axes.for_role(role)
    decode = tuple(b + c / 1000 for b in a.batch for c in a.context)
    prefill = tuple(b * n / 100 + p / 1000 for b in a.batch for n in a.new_tokens
                    for p in a.prefix)
    return MeasuredGrid(source="test tables", axes=a, decode=decode, prefill=prefill,
                        floor_ms=0.5)


def test_interpolation_is_exact_at_nodes_and_linear_between() -> None:
    axes = ((0.0, 1.0, 3.0), (0.0, 2.0))
    values = (0.0, 2.0, 1.0, 3.0, 3.0, 5.0)  # f(x, y) = x + y
    assert _lerp(values, axes, (1.0, 2.0)) == 3.0
    assert _lerp(values, axes, (2.0, 1.0)) == pytest.approx(3.0)
    assert _lerp(values, axes, (9.0, -4.0)) == 3.0  # clamped to the grid's corner (3, 0)


def test_axes_cover_the_roles_limits() -> None:
    a = Axes.for_role(_role())
    assert a.batch == (1, 2, 4)
    assert a.new_tokens[-1] >= 256 and a.context[-1] >= 1024 and a.prefix[0] == 0
    unchunked = attrs.evolve(_role(), enable_chunked_prefill=False)
    assert Axes.for_role(unchunked).new_tokens[-1] >= 1024  # a whole prompt in one pass


def test_timer_prices_from_the_grid() -> None:
    role = _role()
    grid = _grid(role)
    analytical = timer_from_role(role)
    mixing = MeasuredTimer(grid, analytical, standalone=False)
    alone = MeasuredTimer(grid, analytical, standalone=True)
    assert mixing.decode_ms(2, 2 * 512, 512, 0) == pytest.approx(2 + 512 / 1000, rel=0.05)
    assert mixing.decode_ms(0, 0, 0, 0) == 0.0
    # a prefill forward alone, or what it adds to a decode forward (less the floor)
    assert alone.prefill_ms(1, 256, 0) == pytest.approx(2.56)
    assert mixing.prefill_ms(1, 256, 0) == pytest.approx(2.56 - 0.5)
    assert mixing.prefill_ms(1, 128, 128) == 0.0  # nothing new
    assert mixing.request_ms(100) == analytical.request_ms(100)  # the default front end


def test_an_uncovered_role_is_priced_by_the_default_timing() -> None:
    role = _role()
    analytical = timer_from_role(role)
    note = Diagnostic(code="timing-fallback", message="not covered", severity="warning")
    t = MeasuredTimer(None, analytical, standalone=False, fallback=note)
    assert t.decode_ms(3, 900, 300, 900) == analytical.decode_ms(3, 900, 300, 900)
    assert t.prefill_ms(2, 200, 0) == analytical.prefill_ms(2, 200, 0)
    assert t.fallback is note and "fallback" in t.source


def test_grid_key_changes_with_what_changes_a_price() -> None:
    role = _role()
    axes = Axes.for_role(role)
    vllm, trtllm = policy_of("vllm"), policy_of("trtllm")
    key = grid_key(role, axes, vllm)
    assert grid_key(role, axes, vllm) == key
    assert grid_key(role, axes, trtllm) != key
    for changed in (attrs.evolve(role, tensor=2), attrs.evolve(role, hardware="h200_sxm"),
                    attrs.evolve(role, timing=TimingArgs(type="measured", kv_quant="fp8")),
                    attrs.evolve(role, timing=TimingArgs(type="measured",
                                                         backend_version="previous"))):
        assert grid_key(changed, Axes.for_role(changed), vllm) != key


@pytest.mark.parametrize(("hardware", "backend", "moe_quant", "mode"), [
    ("b200_sxm", "trtllm", None, "w4a8_mxfp4_mxfp8"),  # Blackwell: MXFP8 activations
    ("gb300", "trtllm", "mxfp4", "w4a8_mxfp4_mxfp8"),
    ("h200_sxm", "trtllm", None, None),  # Hopper: the checkpoint's (BF16 activations)
    ("b200_sxm", "vllm", None, None),
    ("b200_sxm", "trtllm", "fp8", "fp8"),  # experts requantised: as asked
])
def test_mxfp4_experts_are_priced_by_the_kernels_the_backend_runs_on_the_gpu(
        hardware: str, backend: str, moe_quant: str | None, mode: str | None) -> None:
    role = attrs.evolve(_role(moe_quant=moe_quant), model="openai/gpt-oss-120b",
                        hardware=hardware)
    assert _moe_mode(role, policy_of(backend)) == mode


def test_without_the_extra_the_diagnostic_says_how_to_install_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)  # import fails
    with pytest.raises(ReplayError) as err:
        make_timer(_role())
    d = err.value.diagnostics[0]
    assert d.code == "timing-unavailable"
    assert d.path == ("engine", "workers", "aggregated", "timing", "type")
    assert "aiconfigurator-core" in d.message and "servesim[measured]" in (d.hint or "")


def test_only_measured_timing_reads_the_kv_precision_and_version() -> None:
    for key, value in (("kv_quant", "fp8"), ("backend_version", "current")):
        role = attrs.evolve(_role(), timing=TimingArgs(type="default", **{key: value}))
        problems = list(timing_values(role, ("engine", "workers", "aggregated")))
        assert [p.code for p in problems] == ["timing-quant"]
        assert f"rejects {key}, which only the measured timing reads" in problems[0].message
        assert not list(timing_values(_role(**{key: value}),
                                      ("engine", "workers", "aggregated")))


def test_resolve_records_the_kv_precision_and_version(compile_toml: Callable[..., Any]) -> None:
    text = MEASURED.format(gpu="h100_sxm", quant="fp8").replace(
        'kvcache_quant_mode = "fp8"', 'kvcache_quant_mode = "fp8"\nbackend_version = "current"')
    resolved = compile_toml(text, stop_after="resolve")
    timing = resolved.payload.roles["aggregated"].timing
    assert (timing.kv_quant, timing.backend_version, timing.gemm_quant) == (
        "fp8", "current", "fp8")
    prov = resolved.provenance["engine.workers.aggregated.timing.backend_version"]
    assert prov.origin == "derived" and prov.formula == "engine.backend_version 'current'"


# -- with the package (installed by the measured extra) ----------------------------------------

aic = pytest.importorskip("aiconfigurator_core", reason="the measured extra is not installed")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from servesim.timing import measured

    folder = tmp_path / "cache"
    monkeypatch.setenv("SERVESIM_CACHE_DIR", str(folder))
    monkeypatch.setattr(measured, "_GRIDS", {})
    return folder


def test_replay_with_measured_tables_names_its_source(
        replay_toml: Callable[..., Any], cache: Path) -> None:
    run = replay_toml(MEASURED.format(gpu="h100_sxm", quant="fp8"))
    assert run.report["completed_requests"] == 12
    source = run.report["timing_sources"]["aggregated"]
    assert source.startswith("aiconfigurator-core ") and "vllm" in source
    assert "h100_sxm" in source
    # the grid is cached on disk, and read back the same
    (cached,) = cache.glob("measured-*.json")
    grid = MeasuredGrid.from_json(json.loads(cached.read_text(encoding="utf-8")))
    assert grid.source == source and all(v > 0 for v in grid.decode)
    # priced from the tables: not the default timing's prices
    default = replay_toml(MEASURED.format(gpu="h100_sxm", quant="fp8").replace(
        'type = "measured"', 'type = "default"'))
    assert run.report["mean_ttft_ms"] != default.report["mean_ttft_ms"]


def test_a_damaged_cache_file_is_computed_again(
        compile_toml: Callable[..., Any], cache: Path) -> None:
    from servesim.timing import measured

    role = compile_toml(MEASURED.format(gpu="h100_sxm", quant="fp8")).roles["aggregated"]
    first = measured.grid_for(role)
    (cached,) = cache.glob("measured-*.json")
    cached.write_text("{not json", encoding="utf-8")
    measured._GRIDS.clear()
    assert measured.grid_for(role) == first
    assert json.loads(cached.read_text(encoding="utf-8"))["source"] == first.source


def test_a_cache_file_that_is_a_pipe_is_not_read(compile_toml: Callable[..., Any],
                                                  cache: Path) -> None:
    import os

    from servesim.timing import measured

    role = compile_toml(MEASURED.format(gpu="h100_sxm", quant="fp8")).roles["aggregated"]
    first = measured.grid_for(role)
    (cached,) = cache.glob("measured-*.json")
    cached.unlink()
    os.mkfifo(cached)  # no writer: reading it would block forever
    measured._GRIDS.clear()
    assert measured.grid_for(role) == first  # computed again, and the pipe replaced
    assert json.loads(cached.read_text(encoding="utf-8"))["source"] == first.source


def test_uncovered_role_warns_and_replays_with_the_default_timing(
        servesim_cli: Callable[..., Any], tmp_path: Path, cache: Path) -> None:
    config = tmp_path / "a100_nvfp4.toml"
    config.write_text(MEASURED.format(gpu="a100_sxm", quant="nvfp4"), encoding="utf-8")
    result = servesim_cli("validate", config)
    assert result.code == 0
    assert "warning: engine.workers.aggregated.timing.type: the measured kernel tables do " \
           "not cover this role" in result.err
    assert "[timing-fallback]" in result.err
    result = servesim_cli("replay", config, "--format", "json", "--quiet")
    assert result.code == 0 and "[timing-fallback]" in result.err
    report = json.loads(result.out)
    assert report["timing_sources"] == {"aggregated": "default timing (fallback)"}
