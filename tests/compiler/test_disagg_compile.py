"""The compiler side of P/D: roles resolve independently, the transfer is resolved from the
prefill role, and the cross-role rules hold at compile time and at engine handoff."""

from __future__ import annotations

import attrs
import pytest

from servesim.compiler import compile_text
from servesim.errors import CompileError
from servesim.payload import KvTransferArgs, Payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))

LLAMA = """
[engine]
mode = "disaggregated"
model = "meta-llama/Meta-Llama-3.1-70B"
hardware = "h100_sxm"
[engine.workers.prefill.parallelism]
tensor = 4
[engine.workers.decode]
hardware = "h200_sxm"
[engine.workers.decode.parallelism]
tensor = 8
"""


def compile_ok(text: str) -> Payload:
    return compile_text(text, name="pd.toml", registry=REGISTRY)


def errors(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compile_text(text, name="bad.toml", registry=REGISTRY)
    return [d.render() for d in info.value.diagnostics]


def test_roles_resolve_independently_and_auto_bytes_come_from_the_prefill_role() -> None:
    payload = compile_ok(LLAMA + "[engine.kv_transfer]\nbandwidth_gb_per_second = 25.0\n")
    prefill, decode = payload.roles["prefill"], payload.roles["decode"]
    assert (prefill.hardware, prefill.tensor) == ("h100_sxm", 4)
    assert (decode.hardware, decode.tensor) == ("h200_sxm", 8)
    # 80 layers x 8 KV heads x 128 x (K, V) x 2 bytes, split over the role's TP.
    assert prefill.kv_bytes_per_token == 80 * 8 * 128 * 2 * 2 // 4 == 81920
    assert decode.kv_bytes_per_token == 40960
    assert prefill.num_gpu_blocks != decode.num_gpu_blocks
    assert payload.kv_transfer == KvTransferArgs(
        bytes_per_token=81920, bandwidth_gb_per_second=25.0,
        timing_mode="destination_missing", state_bytes=0)


def test_omitted_kv_transfer_means_no_delay_and_explicit_bytes_win() -> None:
    none = compile_ok(LLAMA)
    assert none.kv_transfer is not None and none.kv_transfer.bandwidth_gb_per_second is None
    explicit = compile_ok(LLAMA + "[engine.kv_transfer]\nbytes_per_token = 1000\n"
                          'timing_mode = "full_prompt"\n')
    assert explicit.kv_transfer == KvTransferArgs(bytes_per_token=1000,
                                                  timing_mode="full_prompt")


def test_aggregated_mode_rejects_kv_transfer() -> None:
    text = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
            "[engine.workers.aggregated]\n[engine.kv_transfer]\nbandwidth_gb_per_second = 1.0\n")
    assert any("aggregated mode rejects kv_transfer" in e for e in errors(text))


def test_the_engine_refuses_a_hand_written_payload_with_a_one_sided_state_cache() -> None:
    from servesim.payload import StateCacheArgs

    payload = compile_ok(LLAMA)
    decode = attrs.evolve(payload.roles["decode"], state_cache=StateCacheArgs(
        bytes_per_request=1, state_blocks=1, allocated_bytes_per_request=1))
    broken = attrs.evolve(payload, roles={**payload.roles, "decode": decode})
    engine = REGISTRY.get("disagg")
    assert engine is not None
    diags = [d.render() for d in engine.validate_payload(broken)]
    assert any("requires it on both prefill and decode workers" in d for d in diags)
    assert engine.validate_payload(payload) == []
