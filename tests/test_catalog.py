from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servesim.catalog import (
    CatalogError,
    GpuSpec,
    LinearAttention,
    ModelInfo,
    gpu_names,
    load_gpu,
    load_model,
    model_names,
)
from servesim.errors import CompileError
from servesim.testing import rendered, small_config

EXPECTED_MODELS = {
    "MiniMaxAI/MiniMax-M2.5",
    "Qwen/Qwen3-235B-A22B",
    "Qwen/Qwen3-235B-A22B-FP8",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3.5-35B-A3B",
    "Qwen/Qwen3.5-397B-A17B",
    "deepseek-ai/DeepSeek-R1",
    "deepseek-ai/DeepSeek-V3",
    "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Meta-Llama-3.1-8B",
    "mistralai/Mixtral-8x7B-v0.1",
    "moonshotai/Kimi-K2-Instruct",
    "moonshotai/Kimi-K2.5",
    "moonshotai/Kimi-K3",
    "nvidia/Llama-3.1-70B-Instruct-FP8",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "openai/gpt-oss-120b",
    "openai/gpt-oss-20b",
    "zai-org/GLM-5-FP8",
}
EXPECTED_GPUS = [
    "a100_sxm",
    "b200_sxm",
    "b300_sxm",
    "gb200",
    "gb300",
    "h100_sxm",
    "h200_sxm",
    "l40s",
]


def test_catalog_lists_every_shipped_file() -> None:
    assert set(model_names()) >= EXPECTED_MODELS  # every name shipped before stays
    shipped = Path(__file__).parents[1] / "src" / "servesim" / "catalog" / "models"
    assert len(model_names()) == len(list(shipped.glob("*.json")))
    assert model_names() == sorted(model_names())
    assert gpu_names() == EXPECTED_GPUS


@pytest.mark.parametrize("name", sorted(EXPECTED_MODELS))
def test_every_model_loads_with_consistent_layout(name: str) -> None:
    m = load_model(name)
    assert m.name == name
    assert len(m.layer_types) == len(m.mlp_types) == m.num_layers
    assert m.attention_layers, "every shipped model has some KV-cache layers"
    assert m.dtype_bytes in (1, 2, 4)
    assert m.is_moe == (m.num_moe_layers > 0)


@pytest.mark.parametrize("name", EXPECTED_GPUS)
def test_every_gpu_loads(name: str) -> None:
    g = load_gpu(name)
    assert g.name == name
    assert g.mem_capacity_bytes > 40 * 2**30
    assert g.mem_bw_efficiency == 0.8
    assert g.other_mem == 3758096384
    assert g.nccl_mem[1] == 0


def test_dense_gqa_model_fields() -> None:
    m = load_model("Qwen/Qwen3-32B")
    assert (m.model_type, m.num_layers, m.hidden_size) == ("qwen3", 64, 5120)
    assert (m.num_attention_heads, m.num_kv_heads, m.head_dim) == (64, 8, 128)
    assert (m.vocab_size, m.max_position_embeddings, m.intermediate_size) == (151936, 40960, 25600)
    assert (m.dtype_name, m.dtype_bytes, m.weight_dtype_bytes) == ("bfloat16", 2, 2.0)
    assert m.kv_lora_rank is None and m.qk_rope_head_dim is None and not m.is_mla
    assert not m.is_moe and not m.is_hybrid and m.linear_attention is None
    assert m.config["model_type"] == "qwen3"


def test_mla_moe_fp8_model_fields() -> None:
    m = load_model("deepseek-ai/DeepSeek-V3")
    assert m.is_mla and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    assert (m.qk_nope_head_dim, m.v_head_dim, m.q_lora_rank) == (128, 128, 1536)
    # activation/KV dtype stays bf16; the FP8 quantization_config only narrows the weights
    assert (m.dtype_bytes, m.weight_quant, m.weight_dtype_bytes) == (2, "fp8", 1.0)
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (256, 8, 2048)
    assert (m.num_shared_experts, m.shared_expert_intermediate_size) == (1, 2048)
    assert m.first_dense_layers == 3
    assert m.mlp_types[:4] == ("dense", "dense", "dense", "moe")
    assert m.num_moe_layers == 58


def test_expert_width_falls_back_to_intermediate_size() -> None:
    mixtral = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert (mixtral.num_experts, mixtral.experts_per_token) == (8, 2)
    assert mixtral.moe_intermediate_size == 14336
    gpt = load_model("openai/gpt-oss-120b")
    assert (gpt.num_experts, gpt.experts_per_token, gpt.moe_intermediate_size) == (128, 4, 2880)


def test_kimi_k3_reads_text_config_and_kda_layout() -> None:
    m = load_model("moonshotai/Kimi-K3")
    assert "text_config" in m.config and m.lm_config is m.config["text_config"]
    assert m.config["model_type"] == "kimi_k3"
    assert m.model_type == "kimi_linear"
    assert (m.num_layers, m.hidden_size, m.num_attention_heads) == (93, 7168, 96)
    assert m.max_position_embeddings == 1048576
    assert (m.num_experts, m.experts_per_token, m.moe_intermediate_size) == (896, 16, 3072)
    assert m.num_shared_experts == 2
    assert len(m.full_attention_layers) == 24 and len(m.state_layers) == 69
    # config lists 1-based indices: full attention at 4, 8, ..., 92, 93
    assert m.full_attention_layers[:2] == (3, 7) and m.full_attention_layers[-2:] == (91, 92)
    assert m.layer_types[0] == "kda"
    assert m.linear_attention == LinearAttention(
        kind="kda",
        num_key_heads=96,
        num_value_heads=96,
        key_head_dim=128,
        value_head_dim=128,
        conv_kernel=4,
        ssm_dtype="float32",
    )
    assert m.is_hybrid and m.is_mla and (m.kv_lora_rank, m.qk_rope_head_dim) == (512, 64)
    # MXFP4 routed experts: 4 bits + one uint8 scale per 32 weights; the rest stays bf16
    assert (m.weight_quant, m.weight_dtype_bytes) == ("mxfp4", 2.0)
    assert m.expert_weight_dtype_bytes == pytest.approx(0.53125)


def test_qwen35_gdn_layout() -> None:
    m = load_model("Qwen/Qwen3.5-35B-A3B")
    assert m.model_type == "qwen3_5_moe_text"
    assert (m.num_layers, m.vocab_size, m.max_position_embeddings) == (40, 248320, 262144)
    assert len(m.full_attention_layers) == 10 and len(m.state_layers) == 30
    assert m.layer_types[:4] == ("gdn", "gdn", "gdn", "full_attention")
    la = m.linear_attention
    assert la is not None
    assert (la.kind, la.num_key_heads, la.num_value_heads) == ("gdn", 16, 32)
    assert (la.key_head_dim, la.value_head_dim, la.conv_kernel, la.ssm_dtype) == (
        128,
        128,
        4,
        "float32",
    )
    assert m.attn_output_gate
    assert (m.shared_expert_intermediate_size, m.num_shared_experts) == (512, 1)


def test_nemotron_hybrid_pattern() -> None:
    m = load_model("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    assert m.layer_types.count("mamba2") == 23
    assert m.layer_types.count("full_attention") == 6
    assert m.mlp_types.count("moe") == 23
    assert m.layer_types[:2] == ("mamba2", "none") and m.mlp_types[:2] == ("none", "moe")
    assert not m.mlp_gated  # relu2 experts: up/down only
    la = m.linear_attention
    assert la is not None and (la.kind, la.num_value_heads, la.value_head_dim) == ("mamba2", 64, 64)


def test_gpt_oss_sliding_layers_and_mxfp4() -> None:
    m = load_model("openai/gpt-oss-120b")
    assert m.layer_types.count("sliding_attention") == 18
    assert m.layer_types.count("full_attention") == 18
    assert len(m.attention_layers) == 36
    assert m.weight_quant == "mxfp4" and m.weight_dtype_bytes == 2.0
    assert m.dtype_name is None and m.dtype_bytes == 2  # no torch_dtype: default 2


def test_fp8_checkpoint_without_torch_dtype() -> None:
    m = load_model("MiniMaxAI/MiniMax-M2.5")
    assert (m.dtype_name, m.dtype_bytes, m.weight_quant, m.weight_dtype_bytes) == (
        None,
        2,
        "fp8",
        1.0,
    )


def test_h200_spec() -> None:
    g = load_gpu("h200_sxm")
    assert g.mem_capacity_bytes == 151397597184
    assert g.mem_bw == 4.8e12 and g.mem_bw_efficiency == 0.8
    assert (g.bf16_flops, g.fp8_flops, g.fp4_flops) == (989e12, 1978e12, None)
    assert (g.intra_node_bw, g.inter_node_bw, g.num_gpus_per_node) == (450e9, 50e9, 8)
    assert g.nccl_mem == {1: 0, 2: 358612992, 4: 411041792, 8: 411041792}
    assert (g.other_mem, g.power) == (3758096384, 700.0)
    assert g.raw["gpu"]["sm_version"] == 90


def test_gpu_optional_fields_and_nccl_lookup() -> None:
    a100 = load_gpu("a100_sxm")
    assert a100.fp8_flops is None and a100.fp4_flops is None
    b200 = load_gpu("b200_sxm")
    assert b200.fp4_flops == 9e15
    assert load_gpu("gb200").num_gpus_per_node == 4
    assert b200.nccl_mem_for(1) == 0
    assert b200.nccl_mem_for(2) == 358612992
    assert b200.nccl_mem_for(3) == 411041792  # next listed size up
    assert b200.nccl_mem_for(16) == 411041792  # beyond the table: largest entry


def test_gpu_spec_from_dict_requires_core_fields() -> None:
    with pytest.raises(CatalogError, match="mem_capacity"):
        GpuSpec.from_dict("x", {"gpu": {}, "node": {}, "misc": {}})


def test_unknown_model_lists_closest_names() -> None:
    with pytest.raises(CatalogError) as info:
        load_model("Qwen/Qwen3-23B")
    msg = str(info.value)
    assert msg.startswith("unknown model 'Qwen/Qwen3-23B'; closest known: Qwen/Qwen3-32B")
    assert "Qwen/Qwen3-8B" in msg  # the closest three, of a larger catalog
    assert isinstance(info.value, ValueError)


def test_unknown_model_matches_on_the_name_part() -> None:
    with pytest.raises(CatalogError) as info:
        load_model("llama-3.1-70b")
    close = str(info.value).split("closest known: ")[1].split(". ")[0].split(", ")
    assert close[:2] == ["meta-llama/Llama-3.1-70B", "meta-llama/Llama-3.1-70B-Instruct"]


def test_unknown_gpu_lists_closest_names() -> None:
    with pytest.raises(CatalogError, match=r"unknown gpu 'h200'; closest known: h200_sxm"):
        load_gpu("h200")
    with pytest.raises(CatalogError, match="known: a100_sxm, b200_sxm"):
        load_gpu("zzzzzz")


def _write_config(directory: Path, config: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))


def test_load_model_from_local_directory(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "torch_dtype": "float32",
    }
    _write_config(tmp_path / "tiny", cfg)
    m = load_model(str(tmp_path / "tiny"))
    assert m.name == str(tmp_path / "tiny")
    assert (m.num_layers, m.head_dim, m.num_kv_heads, m.dtype_bytes) == (2, 16, 2, 4)


def test_local_directory_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CatalogError, match=r"has no config\.json"):
        load_model(str(empty))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(CatalogError, match="invalid JSON"):
        load_model(str(bad))
    _write_config(tmp_path / "list", [1, 2])
    with pytest.raises(CatalogError, match="expected a JSON object"):
        load_model(str(tmp_path / "list"))
    _write_config(tmp_path / "partial", {"model_type": "llama", "hidden_size": 64})
    with pytest.raises(CatalogError, match="num_hidden_layers"):
        load_model(str(tmp_path / "partial"))
    afile = tmp_path / "file.json"
    afile.write_text("{}")
    with pytest.raises(CatalogError, match="not a directory"):
        load_model(str(afile))


CONFIG = {"num_hidden_layers": 2, "hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10,
          "intermediate_size": 16}
MOE = {**CONFIG, "num_local_experts": 4, "num_experts_per_tok": 2}


HYBRID = {**CONFIG, "num_hidden_layers": 3, "mamba_num_heads": 2, "ssm_state_size": 4,
          "mamba_head_dim": 4}


@pytest.mark.parametrize(("config", "message"), [
    ({**CONFIG, "intermediate_size": None}, "the dense MLP layers need intermediate_size"),
    ({**MOE, "intermediate_size": 0}, "the MoE layers need routed experts"),
    ({**HYBRID, "hybrid_override_pattern": "M*E"}, "the MoE layers need routed experts"),
    ({**HYBRID, "hybrid_override_pattern": ["M", "*", "-"]},
     "hybrid_override_pattern must be a string of one of M, \\*, E, - per layer \\(3\\)"),
    ({**HYBRID, "hybrid_override_pattern": ""}, "hybrid_override_pattern must be a string"),
    ({**HYBRID, "hybrid_override_pattern": "M*-", "conv_kernel": 0},
     "'conv_kernel' must be an integer from 1"),
    ({**HYBRID, "hybrid_override_pattern": "M*-", "mamba_ssm_cache_dtype": 32},
     "mamba_ssm_cache_dtype 32 is not a dtype servesim knows"),
    ({**CONFIG, "linear_attn_config": [1]}, "linear_attn_config must be a table"),
    ({**CONFIG, "index_topk": "2048"}, "'index_topk' must be an integer from 1"),
    ({**CONFIG, "sliding_window": -4}, "'sliding_window' must be an integer from 1"),
    ({**CONFIG, "hidden_act": 128}, "hidden_act must be a name, got 128"),
    ({**MOE, "num_experts": 0}, "the routed experts are counted twice, and differently "
                                "\\(num_experts = 0, num_local_experts = 4\\); keep one"),
])
def test_a_config_json_that_would_price_a_layer_as_nothing_is_refused(
        config: dict[str, object], message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        ModelInfo.from_config("m", config)


@pytest.mark.parametrize(("config", "message"), [
    ({**CONFIG, "num_hidden_layers": 0}, "'num_hidden_layers' must be an integer from 1 to 65536"),
    ({**CONFIG, "num_hidden_layers": 1e30}, "'num_hidden_layers' must be an integer from 1 to "
                                            "65536, got 1000000000000000019884624838656"),
    ({**CONFIG, "num_attention_heads": 0}, "'num_attention_heads' must be an integer from 1"),
    ({**CONFIG, "hidden_size": -1}, "'hidden_size' must be an integer from 1"),
    ({**CONFIG, "intermediate_size": "x"}, "'intermediate_size' must be an integer from 0 to "
                                           "2147483647, got 'x'"),
    ({**CONFIG, "head_dim": 2.5}, "'head_dim' must be an integer from 1"),
    ({**CONFIG, "num_key_value_heads": True}, "'num_key_value_heads' must be an integer"),
    ({**MOE, "num_local_experts": 1}, r"a token's experts \(num_experts_per_tok, 2\) must be "
                                      r"from 1 to the routed experts \(1\)"),
    ({**MOE, "num_experts_per_tok": 0}, "a token's experts"),
    ({**MOE, "mlp_only_layers": 3}, "'mlp_only_layers' must be a list of layer indices"),
    ({**MOE, "first_k_dense_replace": 3}, "'first_k_dense_replace' must be an integer from 0 "
                                          "to 2, got 3"),
    ({**MOE, "mlp_only_layers": [1000]}, "'mlp_only_layers' must be a list of layer indices "
                                         "from 0 to 2"),
    ({**CONFIG, "num_key_value_heads": 0}, "'num_key_value_heads' must be an integer from 1"),
    ({**CONFIG, "num_key_value_heads": 4}, r"num_key_value_heads \(4\) must divide "
                                           r"num_attention_heads \(2\)"),
    ({**CONFIG, "num_attention_heads": 16}, "leaves no head_dim; set head_dim"),
    ({**CONFIG, "torch_dtype": "banana"}, "torch_dtype 'banana' is not a dtype servesim knows"),
    ({**CONFIG, "torch_dtype": 5}, "torch_dtype 5 is not a dtype servesim knows"),
    ({**CONFIG, "tie_word_embeddings": "false"}, "'tie_word_embeddings' must be true or false"),
    ({**CONFIG, "layer_types": ["full_attention"]},
     "'layer_types' must be a list of the 2 layers' types"),
    ({**CONFIG, "kv_lora_rank": 0}, "'kv_lora_rank' must be an integer from 1"),
    # a GQA config with a latent rank added is no MLA model: its head split is missing
    ({**CONFIG, "kv_lora_rank": 4}, "config.json has no integer qk_rope_head_dim"),
    ({**CONFIG, "kv_lora_rank": 4, "qk_rope_head_dim": 2, "qk_nope_head_dim": 2,
      "v_head_dim": 0}, "'v_head_dim' must be an integer from 1"),
    ({**CONFIG, "linear_num_value_heads": 0, "linear_num_key_heads": 2,
      "linear_key_head_dim": 4, "linear_value_head_dim": 4},
     "'linear_num_value_heads' must be an integer from 1"),
    ({**CONFIG, "linear_attn_config": {"kda_layers": ["a"], "full_attn_layers": [1],
                                       "num_heads": 2, "head_dim": 4}},
     "'kda_layers' must be a list of layer indices"),
    ({**CONFIG, "layer_types": ["linear_attention"] * 2, "linear_num_key_heads": 2,
      "linear_num_value_heads": 2, "linear_key_head_dim": 4, "linear_value_head_dim": 4},
     "none of its 2 layers is an attention layer holding a KV cache"),
])
def test_a_config_json_value_no_model_has_is_refused_by_key(config: dict[str, object],
                                                             message: str) -> None:
    with pytest.raises(CatalogError, match=message):
        ModelInfo.from_config("m", config)


def _quant(method: str, **kw: object) -> dict[str, object]:
    return {"quantization_config": {"quant_method": method, **kw}}


def _ct(bits: int, kind: str = "int", **kw: object) -> dict[str, object]:
    weights = {"num_bits": bits, "type": kind, "group_size": 32}
    return _quant("compressed-tensors", config_groups={"g": {"weights": weights}}, **kw)


@pytest.mark.parametrize(("config", "expected"), [
    # (format, bytes per dense weight, bytes per routed-expert weight)
    ({**CONFIG, **_quant("gptq", bits=4, group_size=128)}, ("int4", 0.515625, 0.515625)),
    ({**CONFIG, **_quant("awq", bits=4, group_size=64)}, ("int4", 0.53125, 0.53125)),
    ({**CONFIG, **_quant("gptq", bits=8, group_size=-1)}, ("w8a16", 1.0, 1.0)),
    ({**CONFIG, **_quant("modelopt", quant_algo="NVFP4")}, ("nvfp4", 0.5625, 0.5625)),
    # a dense model's 4-bit weights are its linear layers, not only experts it lacks
    ({**CONFIG, **_ct(4)}, ("int4", 0.5625, 0.5625)),
    ({**MOE, **_ct(4)}, ("int4", 0.5625, 0.5625)),
    # attention left in bf16 (Kimi K2.5's ignore list): only the routed experts narrow
    ({**MOE, **_ct(4, ignore=["lm_head", "re:.*self_attn.*"])}, ("int4", 2.0, 0.5625)),
    ({**MOE, **_quant("mxfp4", modules_to_not_convert=["model.layers.*.self_attn"])},
     ("mxfp4", 2.0, 0.53125)),
    # one norm of the attention block kept (GLM-5), or one layer's block, is not the blocks
    ({**MOE, **_quant("fp8", modules_to_not_convert=["model.layers.0.self_attn.kv_norm"])},
     ("fp8", 1.0, 1.0)),
    ({**MOE, **_quant("fp8", modules_to_not_convert=["model.layers.1.self_attn"])},
     ("fp8", 1.0, 1.0)),
    ({**MOE, **_quant("modelopt", quant_algo="NVFP4", exclude_modules=["*self_attn*"])},
     ("nvfp4", 2.0, 0.5625)),
    ({**MOE, **_quant("gptq", bits=4, w_bit=None, modules_to_not_convert="self_attn")},
     ("int4", 2.0, 0.515625)),
    ({**CONFIG, **_quant("awq", bits=None, w_bit=4, q_group_size=-1)}, ("int4", 0.5, 0.5)),
    # compressed-tensors: integers without quantized activations are weight-only kernels;
    # FP4 takes one fp8 scale per group of 16 (NVFP4)
    ({**CONFIG, **_ct(8)}, ("w8a16", 1.0625, 1.0625)),
    ({**CONFIG, **_quant("compressed-tensors", config_groups={"g": {
        "weights": {"num_bits": 8, "type": "int"}, "input_activations": {"num_bits": 8}}})},
     ("int8", 1.0, 1.0)),
    ({**CONFIG, **_quant("compressed-tensors", config_groups={"g": {
        "weights": {"num_bits": 4, "type": "float", "group_size": 16}}})},
     ("nvfp4", 0.5625, 0.5625)),
])
def test_quantization_config_sizes_the_weights_it_covers(
        config: dict[str, object], expected: tuple[str, float, float]) -> None:
    m = ModelInfo.from_config("m", config)
    assert (m.weight_quant, m.weight_dtype_bytes, m.expert_weight_dtype_bytes) == expected


@pytest.mark.parametrize(("config", "message"), [
    (_quant("bitsandbytes", load_in_4bit=True), "quant_method 'bitsandbytes'"),
    (_quant("gptq", bits=3), "gptq with bits = 3"),
    (_quant("modelopt", quant_algo="W4A8_AWQ"), "modelopt with quant_algo = 'W4A8_AWQ'"),
    (_ct(2), "compressed-tensors int weights of 2 bits"),
    ({"quantization_config": "gptq"}, "is str 'gptq', not a table"),
    # the method decides, whatever a stray format key says
    (_quant("bitsandbytes", load_in_4bit=True, fmt="e4m3"), "quant_method 'bitsandbytes'"),
    (_quant("gptq", bits=3, format="mxfp4"), "gptq with bits = 3"),
    (_quant("gptq", bits=4, group_size="128"), "group_size must be a positive integer or -1"),
    (_quant("awq", bits=4, group_size=0), "group_size must be a positive integer or -1"),
    (_quant("fp8", ignore=7), "ignore must be a list of module names"),
    (_quant("compressed-tensors", config_groups={
        "a": {"weights": {"num_bits": 8, "type": "int"}, "targets": ["re:.*self_attn.*"]},
        "b": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["re:.*experts.*"]}}),
     r"mixes weight schemes \(int4, w8a16\)"),
    (_quant("compressed-tensors", config_groups={}), "compressed-tensors without a weights "
                                                     "scheme"),
])
def test_a_quantization_servesim_cannot_size_is_refused(config: dict[str, object],
                                                        message: str) -> None:
    with pytest.raises(CatalogError, match=message) as info:
        ModelInfo.from_config("m", {**CONFIG, **config})
    assert "remove quantization_config" in str(info.value)


def test_a_null_config_json_value_is_unset() -> None:
    assert ModelInfo.from_config("m", {**CONFIG, "head_dim": None}).head_dim == 4


def test_from_config_dtype_and_quantization() -> None:
    base = {
        "num_hidden_layers": 1,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "vocab_size": 10,
        "intermediate_size": 16,
    }
    assert ModelInfo.from_config("a", {**base, "torch_dtype": "float32"}).dtype_bytes == 4
    assert ModelInfo.from_config("b", {**base, "dtype": "float16"}).dtype_bytes == 2
    assert ModelInfo.from_config("c", base).dtype_bytes == 2
    fp8 = ModelInfo.from_config(
        "d", {**base, "torch_dtype": "bfloat16", "quantization_config": {"quant_method": "fp8"}}
    )
    assert (fp8.dtype_bytes, fp8.weight_dtype_bytes) == (2, 1.0)
    gdn = ModelInfo.from_config(
        "e",
        {
            **base,
            "num_hidden_layers": 8,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 8,
            "linear_value_head_dim": 8,
        },
    )
    # no layer_types: every 4th layer is full attention
    assert gdn.full_attention_layers == (3, 7)
    assert gdn.state_layers == (0, 1, 2, 4, 5, 6)


def test_a_model_folder_s_config_error_is_reported_at_engine_model(
        tmp_path: Path, compile_toml: Callable[..., Any]) -> None:
    _write_config(tmp_path / "m", {**CONFIG, **_quant("gptq", bits=3)})
    text = small_config().replace('"Qwen/Qwen3-32B"', json.dumps(str(tmp_path / "m")))
    with pytest.raises(CompileError) as info:
        compile_toml(text, stop_after="resolve")
    (line,) = rendered(info.value)
    assert line.startswith("engine.model: config.json: quantization_config gptq with bits = 3")
    assert line.endswith("[bad-model-config]")
