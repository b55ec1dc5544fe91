"""The calibration prices what a user's config replays: for one row of every calibrated
(GPU, backend, model), the config a user would write for that deployment compiles to a
role whose default timing prices passes exactly as ``bench/calib.py`` prices the row."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import calib

from servesim.catalog import load_model
from servesim.compiler import compile_text
from servesim.compiler.passes.resolve_geometry import _QUANT_NAMES
from servesim.geometry import kv_bytes_per_token
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.timing import make_timer
from servesim.timing.analytical import AnalyticalTimer, load_constants

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
# the analytical model's weight precisions -> engine.gemm_quant_mode / moe_quant_mode: the
# compiler's own map, read backwards
CONFIG_QUANT = {table: config for config, table in _QUANT_NAMES.items()}


def _setups() -> list[calib.Setup]:
    found: dict[tuple[str, str, str], calib.Setup] = {}
    for row in calib.load_rows():
        key = (row.system, row.backend, row.model)
        if row.mode != "agg" or key in found:
            continue
        try:
            s = calib.setup(row, max_tokens=calib.MAX_TOKENS)
        except calib.Unsupported:
            continue
        assert isinstance(s, calib.Setup)
        found[key] = s
    return list(found.values())


SETUPS = _setups()


def _quant(s: calib.Setup) -> list[str] | None:
    """Config lines for the weight precision the row is priced with (None: no key can say
    it). gpt-oss rows are priced with the checkpoint's own precision, whatever the label."""
    if s.geometry.moe_quant == "mxfp4":
        return []
    labels = (("gemm_quant_mode", s.row.gemm_quant), ("moe_quant_mode", s.row.moe_quant))
    if any(q and q not in CONFIG_QUANT for _, q in labels):
        return None
    return [f'{key} = "{CONFIG_QUANT[q]}"' for key, q in labels if q]


def _config(s: calib.Setup, quant: list[str]) -> str:
    role = s.role
    model = load_model(role.model)
    model_dtype, _ = kv_bytes_per_token(model, tensor=role.tensor, pipeline=1,
                                        kv_dtype_bytes=model.dtype_bytes)
    kv = ['kvcache_quant_mode = "fp8"'] if role.kv_bytes_per_token < model_dtype else []
    return "\n".join([
        "[engine]", f'model = "{role.model}"', f'hardware = "{role.hardware}"',
        f'backend = "{role.backend}"', *quant, *kv,
        "[engine.workers.aggregated.parallelism]", f"tensor = {role.tensor}",
        f"attention_data = {role.attention_data}", f"moe_tensor = {role.moe_tensor}",
        f"moe_expert = {role.moe_expert}"]) + "\n"


def test_every_calibrated_partition_is_checked() -> None:
    assert len(SETUPS) >= 19


@pytest.mark.parametrize("s", SETUPS, ids=lambda s: f"{s.row.system}-{s.row.backend}-"
                         f"{s.row.model.split('/')[-1]}")
def test_a_users_config_replays_the_prices_the_calibration_fits(s: calib.Setup) -> None:
    quant = _quant(s)
    if quant is None:
        pytest.skip(f"no config key for {s.row.gemm_quant} weights")
    payload = compile_text(_config(s, quant), name="row.toml", registry=REGISTRY)
    user, bench = make_timer(payload.roles["aggregated"]), AnalyticalTimer(
        s.geometry, load_constants())
    assert isinstance(user, AnalyticalTimer)
    prices = [(t.prefill_ms(4, 2048, 0), t.prefill_ms(1, 8192, 1024),
               t.decode_ms(16, 16 * 2048, 2048, 0), t.decode_ms(256, 256 * 4096, 4096, 0),
               t.request_ms(1024)) for t in (user, bench)]
    assert prices[0] == prices[1]
