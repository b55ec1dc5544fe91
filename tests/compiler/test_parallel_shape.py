"""The parallel shape must fit the model (geometry.parallel_problems), in a config and in a
payload alike."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servesim.errors import CompileError, PayloadError
from servesim.payload import dump_payload, load_payload
from servesim.plugins.manager import EngineRegistry
from servesim.replay import replay_payload
from servesim.testing import rendered, small_config

P = "engine.workers.aggregated.parallelism"


def _config(model: str, **shape: int) -> str:
    table = "".join(f"{k} = {v}\n" for k, v in shape.items())
    return small_config().replace('model = "Qwen/Qwen3-32B"', f'model = "{model}"').replace(
        "replicas = 1\n", f"replicas = 1\n{table}")


@pytest.mark.parametrize(("model", "shape", "expected"), [
    # MLA replicates its latent, but the query heads still split over TP
    ("deepseek-ai/DeepSeek-V3", {"tensor": 3},
     f"{P}.tensor: tensor=3 does not shard 'deepseek-ai/DeepSeek-V3': its 128 attention "
     "heads must split evenly over the tensor-parallel ranks [indivisible-heads]"),
    ("meta-llama/Meta-Llama-3.1-8B", {"pipeline": 33},
     f"{P}.pipeline: pipeline=33 exceeds the 32 layers of 'meta-llama/Meta-Llama-3.1-8B': "
     "every pipeline stage holds at least one layer [pipeline-over-layers]"),
    ("mistralai/Mixtral-8x7B-v0.1", {"moe_expert": 4},
     f"{P}.moe_expert: moe_tensor x moe_expert = 1 x 4 must equal tensor x attention_data = "
     "1: the experts are split over the GPUs of a pipeline stage [moe-parallel-shape]"),
    ("mistralai/Mixtral-8x7B-v0.1", {"tensor": 1, "attention_data": 16, "moe_expert": 16},
     f"{P}.moe_expert: moe_expert=16 exceeds the 8 routed experts of "
     "'mistralai/Mixtral-8x7B-v0.1': every expert-parallel rank holds at least one "
     "[moe-parallel-shape]"),
    ("Qwen/Qwen3-32B", {"tensor": 2, "moe_expert": 2},
     f"{P}.moe_expert: moe_expert=2, but 'Qwen/Qwen3-32B' has no routed experts to split "
     "[moe-parallel-dense]"),
    ("Qwen/Qwen3.5-35B-A3B", {"tensor": 32},
     f"{P}.tensor: tensor=32 does not shard 'Qwen/Qwen3.5-35B-A3B': its gdn layers' 16 key "
     "and 32 value heads must split evenly over the tensor-parallel ranks "
     "[indivisible-heads]"),
])
def test_a_shape_that_does_not_fit_the_model_is_refused(
        compile_toml: Callable[..., Any], model: str, shape: dict[str, int],
        expected: str) -> None:
    with pytest.raises(CompileError) as info:
        compile_toml(_config(model, **shape), stop_after="validate")
    assert expected in rendered(info.value)


@pytest.mark.parametrize("shape", [
    {"tensor": 8, "moe_expert": 8},  # TP attention, EP experts
    {"tensor": 1, "attention_data": 8, "moe_expert": 8},  # attention DP + EP
    {"tensor": 8, "moe_tensor": 2, "moe_expert": 4},
    {"tensor": 8},  # experts split tensor-parallel over the attention GPUs by default
])
def test_expert_splits_over_the_attention_gpus_compile(
        compile_toml: Callable[..., Any], shape: dict[str, int]) -> None:
    payload = compile_toml(_config("deepseek-ai/DeepSeek-V3", **shape))
    role = payload.roles["aggregated"]
    assert role.moe_tensor * role.moe_expert == role.tensor * role.attention_data


def test_a_payload_is_held_to_the_same_shape_rule(
        compile_toml: Callable[..., Any], engine_registry: EngineRegistry,
        tmp_path: Path) -> None:

    payload = compile_toml(_config("mistralai/Mixtral-8x7B-v0.1", tensor=2))
    data = json.loads(dump_payload(payload))
    data["roles"]["aggregated"]["moe_expert"] = 2  # 2 x 2 experts' GPUs for 2 attention GPUs
    with pytest.raises(PayloadError) as info:
        replay_payload(load_payload(data), registry=engine_registry, base_dir=tmp_path)
    assert rendered(info.value) == [
        f"{P}.moe_expert: moe_tensor x moe_expert = 2 x 2 must equal tensor x attention_data "
        "= 2: the experts are split over the GPUs of a pipeline stage [moe-parallel-shape]"]
