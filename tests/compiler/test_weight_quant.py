"""The deployment's weight precision (``engine.gemm_quant_mode`` / ``moe_quant_mode``)
reaches the default timing and the memory estimate."""

from __future__ import annotations

import pytest

from servesim.compiler import compile_source, compile_text
from servesim.compiler.model.resolved import ResolvedConfig
from servesim.compiler.source import SourceText
from servesim.errors import CompileError
from servesim.payload import Payload, RoleArgs
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.timing import make_timer

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
WORKER = "[engine.workers.aggregated.parallelism]\ntensor = 8\n"


def config(model: str, *quant: str, timing: str = "default") -> str:
    lines = ["[engine]", f'model = "{model}"', 'hardware = "b200_sxm"', *quant]
    return "\n".join(lines) + "\n" + WORKER + \
        f'[engine.workers.aggregated.timing]\ntype = "{timing}"\n'


def aggregated(text: str) -> RoleArgs:
    payload: Payload = compile_text(text, name="case.toml", registry=REGISTRY)
    return payload.roles["aggregated"]


def provenance(text: str, key: str) -> str:
    resolved: ResolvedConfig = compile_source(SourceText(text=text, name="case.toml"),
                                              registry=REGISTRY, stop_after="resolve")
    found = resolved.provenance[f"engine.workers.aggregated.timing.{key}"]
    return f"{found.origin}: {found.formula}"


R1 = "deepseek-ai/DeepSeek-R1"  # an FP8 checkpoint


def test_the_default_timing_prices_the_authored_weight_precision() -> None:
    ckpt = aggregated(config(R1))
    fp4 = aggregated(config(R1, 'gemm_quant_mode = "nvfp4"'))
    assert (ckpt.timing.gemm_quant, ckpt.timing.moe_quant) == (None, None)
    assert (fp4.timing.gemm_quant, fp4.timing.moe_quant) == ("nvfp4", "nvfp4")
    # FP4 weights are half the bytes of FP8 ones: a small decode step reads them faster
    step = (8, 8 * 2048, 2048, 0)
    assert make_timer(fp4).decode_ms(*step) < make_timer(ckpt).decode_ms(*step)
    assert provenance(config(R1), "gemm_quant") == \
        "defaulted: the checkpoint's weight precision"
    assert provenance(config(R1, 'gemm_quant_mode = "nvfp4"'), "moe_quant") == \
        "derived: engine.gemm_quant_mode 'nvfp4' (the experts follow it)"


def test_the_experts_can_have_their_own_precision() -> None:
    text = config(R1, 'gemm_quant_mode = "fp8_block"', 'moe_quant_mode = "nvfp4"')
    role = aggregated(text)
    assert (role.timing.gemm_quant, role.timing.moe_quant) == ("fp8_block", "nvfp4")
    assert provenance(text, "moe_quant") == "derived: engine.moe_quant_mode 'nvfp4'"
    # 4-bit experts leave more of the GPU to the KV cache than the checkpoint's FP8 ones
    assert role.num_gpu_blocks > aggregated(config(R1)).num_gpu_blocks


def test_experts_stored_narrower_keep_their_format() -> None:
    # gpt-oss ships MXFP4 experts and bf16 attention: FP8 attention leaves the experts be
    role = aggregated(config("openai/gpt-oss-120b", 'gemm_quant_mode = "fp8"'))
    assert (role.timing.gemm_quant, role.timing.moe_quant) == ("fp8", None)


SMALL = "Qwen/Qwen3-30B-A3B"  # small enough for float32 weights


def test_only_the_default_timing_reads_the_precision() -> None:
    role = aggregated(config(SMALL, 'gemm_quant_mode = "float32"', timing="polynomial"))
    assert (role.timing.gemm_quant, role.timing.moe_quant) == (None, None)


@pytest.mark.parametrize("key", ["gemm_quant_mode", "moe_quant_mode"])
def test_the_default_timing_refuses_float32_weights(key: str) -> None:
    with pytest.raises(CompileError) as info:
        aggregated(config(SMALL, f'{key} = "float32"'))
    assert [d.render() for d in info.value.diagnostics] == [
        f"engine.{key}: the default timing cannot price float32 weights (it prices bf16, "
        "fp16, fp4, fp8, fp8_block, int4, int4_wo, int8, mxfp4, nvfp4, w4a16, w8a16) "
        "[timing-unsupported]\n"
        '  hint: choose a precision it prices, or timing.type = "table" / "fixed"']
