"""Unset MoE parallelism: one resolved expert layout for the memory estimate, the timing
and the payload."""

from __future__ import annotations

from servesim.compiler import compile_text
from servesim.payload import RoleArgs
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.timing import make_timer

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))


def aggregated(model: str, parallelism: str) -> RoleArgs:
    text = (f'[engine]\nmodel = "{model}"\nhardware = "b200_sxm"\n'
            f"[engine.workers.aggregated.parallelism]\n{parallelism}\n")
    return compile_text(text, name="case.toml", registry=REGISTRY).roles["aggregated"]


def test_unset_moe_parallelism_splits_the_experts_over_the_attention_gpus() -> None:
    unset = aggregated("deepseek-ai/DeepSeek-R1", "tensor = 8")
    explicit = aggregated("deepseek-ai/DeepSeek-R1", "tensor = 8\nmoe_tensor = 8")
    assert (unset.moe_tensor, unset.moe_expert) == (8, 1)
    assert unset == explicit
    # the timing prices one GPU's eighth of each expert, not a whole expert per GPU
    step = (16, 16 * 1200, 1200, 0)
    assert make_timer(unset).decode_ms(*step) == make_timer(explicit).decode_ms(*step)
    dp = aggregated("deepseek-ai/DeepSeek-R1", "attention_data = 8")
    assert (dp.moe_tensor, dp.moe_expert) == (8, 1)


def test_authored_expert_layouts_and_dense_models_are_kept() -> None:
    ep = aggregated("deepseek-ai/DeepSeek-R1", "tensor = 8\nmoe_expert = 8")
    assert (ep.moe_tensor, ep.moe_expert) == (1, 8)
    dense = aggregated("Qwen/Qwen3-32B", "tensor = 8")
    assert (dense.moe_tensor, dense.moe_expert) == (1, 1)
