from __future__ import annotations

import copy
import math
from typing import Any

import pytest

from servesim.catalog import ModelInfo, load_gpu, load_model
from servesim.geometry import (
    GeometryError,
    activation_bytes,
    default_kv_blocks,
    fixed_blocks_from_bytes,
    infer_state_cache,
    kv_budget_bytes,
    kv_bytes_per_token,
    kv_dtype_bytes,
    manual_state_cache,
    parameter_count,
    weight_bytes_per_gpu,
)

GIB = 2**30
K3 = "moonshotai/Kimi-K3"

# --------------------------------------------------------------------------- KV bytes / token


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("meta-llama/Meta-Llama-3.1-8B", 128 * 1024),
        ("meta-llama/Meta-Llama-3.1-70B", 320 * 1024),
        ("Qwen/Qwen3-32B", 256 * 1024),
        ("Qwen/Qwen3-30B-A3B", 96 * 1024),
        ("Qwen/Qwen3-235B-A22B", 188 * 1024),
        ("deepseek-ai/DeepSeek-V3", 61 * 1152),
        ("moonshotai/Kimi-K2-Instruct", 61 * 1152),
        ("mistralai/Mixtral-8x7B-v0.1", 128 * 1024),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 6 * 1024),
        ("Qwen/Qwen3.5-35B-A3B", 10 * 2048),
        (K3, 27648),
    ],
)
def test_kv_bytes_per_token_tp1_bf16(name: str, expected: int) -> None:
    value, formula = kv_bytes_per_token(load_model(name), tensor=1, pipeline=1, kv_dtype_bytes=2)
    assert value == expected
    assert formula.startswith(f"kv_bytes_per_token {expected} = ")


def test_kv_bytes_gqa_splits_heads_over_tp_and_layers_over_pp() -> None:
    q = load_model("Qwen/Qwen3-32B")
    value, formula = kv_bytes_per_token(q, tensor=2, pipeline=1, kv_dtype_bytes=2)
    assert value == 131072  # 2 * ceil(8/2) * 128 * 64 * 2 (spec §3.3 illustration)
    assert formula == ("kv_bytes_per_token 131072 = 2 x ceil(8/2) kv heads x 128 x 64 layers x 2 B")
    # heads replicate once tp > kv heads
    assert kv_bytes_per_token(q, tensor=16, pipeline=1, kv_dtype_bytes=2)[0] == 32768
    llama = load_model("meta-llama/Meta-Llama-3.1-70B")
    value, formula = kv_bytes_per_token(llama, tensor=1, pipeline=3, kv_dtype_bytes=1)
    assert value == 2 * 8 * 128 * 27 * 1  # ceil(80/3) = 27 layers on a stage
    assert "ceil(80/3) = 27 layers" in formula


def test_kv_bytes_mla_is_not_divided_by_tp() -> None:
    ds = load_model("deepseek-ai/DeepSeek-V3")
    value, formula = kv_bytes_per_token(ds, tensor=8, pipeline=1, kv_dtype_bytes=1)
    assert value == 61 * 576
    assert formula == "kv_bytes_per_token 35136 = 61 MLA layers x (512 + 64) x 1 B"


def test_kv_bytes_rejects_bad_parallelism() -> None:
    with pytest.raises(GeometryError, match="tensor must be a positive integer"):
        kv_bytes_per_token(load_model("Qwen/Qwen3-32B"), tensor=0, pipeline=1, kv_dtype_bytes=2)
    # 64 query heads and 8 KV heads: 3 ranks split neither, 128 ranks hold no whole head
    for tensor in (3, 128):
        with pytest.raises(GeometryError, match=f"tensor={tensor} does not shard"):
            kv_bytes_per_token(load_model("Qwen/Qwen3-32B"), tensor=tensor, pipeline=1,
                               kv_dtype_bytes=2)


def test_kv_dtype_bytes() -> None:
    ds = load_model("deepseek-ai/DeepSeek-V3")
    assert kv_dtype_bytes(ds, "fp8") == 1
    assert kv_dtype_bytes(ds, "bf16") == 2
    assert kv_dtype_bytes(ds, "fp16") == 2
    assert kv_dtype_bytes(ds, "fp32") == 4
    # auto follows the activation dtype (bf16), not the FP8 weight quantization
    assert kv_dtype_bytes(ds, None) == 2
    assert kv_dtype_bytes(ds, "auto") == 2
    with pytest.raises(GeometryError, match="unknown KV cache dtype 'int3'"):
        kv_dtype_bytes(ds, "int3")


# --------------------------------------------------------------------------- parameters/weights


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("Qwen/Qwen3-32B", 32.8e9),
        ("meta-llama/Meta-Llama-3.1-70B", 70.6e9),
        ("deepseek-ai/DeepSeek-V3", 671e9),
        ("meta-llama/Meta-Llama-3.1-8B", 8.03e9),
        ("Qwen/Qwen3-30B-A3B", 30.5e9),
        ("Qwen/Qwen3-235B-A22B", 235.1e9),
        ("mistralai/Mixtral-8x7B-v0.1", 46.7e9),
        ("moonshotai/Kimi-K2-Instruct", 1.03e12),
        ("openai/gpt-oss-120b", 116.8e9),
    ],
)
def test_parameter_count_matches_published_totals(name: str, params: float) -> None:
    assert parameter_count(load_model(name)).total == pytest.approx(params, rel=0.03)


def test_qwen3_next_parameter_count() -> None:
    assert parameter_count(qwen3_next()).total == pytest.approx(79.7e9, rel=0.03)


def test_weight_bytes_split_by_parallel_shape() -> None:
    q = load_model("Qwen/Qwen3-32B")
    total = parameter_count(q).total
    assert weight_bytes_per_gpu(q, tensor=1, pipeline=1) == total * 2
    assert weight_bytes_per_gpu(q, tensor=2, pipeline=2) == math.ceil(total * 2 / 4)
    # FP8 linear layers; the embeddings and the LM head stay bf16
    p = parameter_count(q)
    assert weight_bytes_per_gpu(q, tensor=1, pipeline=1, weight_dtype_bytes=1) == (
        total + p.embedding + p.lm_head)


def test_weight_bytes_moe_experts_split_over_moe_shape() -> None:
    ds = load_model("deepseek-ai/DeepSeek-V3")
    p = parameter_count(ds)
    # FP8 checkpoint: 1 byte per linear weight by default (2 for the embeddings and the LM
    # head); attention-DP with 8-way EP
    kept = p.embedding + p.lm_head
    got = weight_bytes_per_gpu(ds, tensor=1, pipeline=1, moe_tensor=1, moe_expert=8)
    assert got == math.ceil(p.non_expert + kept + p.routed_experts / 8)
    got_tp8 = weight_bytes_per_gpu(ds, tensor=8, pipeline=1, moe_tensor=1, moe_expert=8)
    assert got_tp8 == math.ceil((p.total + kept) / 8)


def test_weight_bytes_4bit_experts() -> None:
    gpt = load_model("openai/gpt-oss-120b")
    p = parameter_count(gpt)
    got = weight_bytes_per_gpu(gpt, tensor=1, pipeline=1)
    assert got == math.ceil(p.non_expert * 2 + p.routed_experts * 0.53125)
    assert got < 70e9  # fits one 80 GiB GPU, as the MXFP4 checkpoint does
    assert weight_bytes_per_gpu(gpt, tensor=1, pipeline=1, expert_dtype_bytes=2) == p.total * 2


def test_weight_bytes_rejects_bad_shape() -> None:
    with pytest.raises(GeometryError, match="moe_expert"):
        weight_bytes_per_gpu(load_model("Qwen/Qwen3-32B"), tensor=1, pipeline=1, moe_expert=0)


# --------------------------------------------------------------------------- G1 capacity


def test_kv_budget_spec_illustration() -> None:
    terms = {
        "capacity": 80 * GIB,
        "weights": 20 * GIB,
        "activations": 0,
        "runtime_overhead": 0,
        "comm_overhead": 0,
        "cuda_graph": 0,
    }
    kv, _ = kv_budget_bytes("vllm", memory_fraction=0.9, **terms)
    assert kv == 52 * GIB
    assert kv // 131072 == 425984 and kv // 131072 // 64 == 6656
    kv, formula = kv_budget_bytes("trtllm", memory_fraction=0.9, **terms)
    assert kv == 54 * GIB
    assert kv // 131072 == 442368 and kv // 131072 // 32 == 13824
    assert formula.startswith(f"kv_bytes {54 * GIB} = ({80 * GIB} - non_kv {20 * GIB}) x 0.9")


def test_kv_budget_sglang_skips_activations() -> None:
    kv, _ = kv_budget_bytes(
        "sglang",
        capacity=100 * GIB,
        memory_fraction=0.5,
        weights=10 * GIB,
        activations=7 * GIB,
        runtime_overhead=3 * GIB,
        comm_overhead=1 * GIB,
        cuda_graph=2 * GIB,
    )
    assert kv == (100 - 4) * GIB // 2 - 10 * GIB - 2 * GIB


def test_kv_budget_rejects_bad_fraction_and_backend() -> None:
    terms = dict(
        capacity=GIB, weights=0, activations=0, runtime_overhead=0, comm_overhead=0, cuda_graph=0
    )
    with pytest.raises(GeometryError, match="memory_fraction"):
        kv_budget_bytes("vllm", memory_fraction=1.5, **terms)
    with pytest.raises(GeometryError, match="unknown backend"):
        kv_budget_bytes("tgi", memory_fraction=0.9, **terms)  # type: ignore[arg-type]


def test_activation_estimate() -> None:
    q = load_model("Qwen/Qwen3-32B")
    assert activation_bytes(q, tensor=1, max_batched_tokens=8192) == 8192 * 2 * (
        4 * 5120 + 2 * 25600
    )
    assert activation_bytes(q, tensor=2, max_batched_tokens=8192) == 8192 * 2 * (4 * 5120 + 25600)


def _qwen32_blocks(backend: str, **overrides: Any) -> tuple[int, dict[str, int], str]:
    q = load_model("Qwen/Qwen3-32B")
    args: dict[str, Any] = dict(
        backend=backend,
        tensor=1,
        pipeline=1,
        moe_tensor=1,
        moe_expert=1,
        max_batched_tokens=8192,
        memory_fraction=0.9,
        cuda_graph_reserved_bytes=0,
        kv_bytes_per_token=262144,
        block_size=64,
        weight_dtype_bytes=2,
    )
    args.update(overrides)
    return default_kv_blocks(q, load_gpu("h100_sxm"), **args)


def test_default_kv_blocks_vllm_terms() -> None:
    blocks, terms, formula = _qwen32_blocks("vllm")
    weights = parameter_count(load_model("Qwen/Qwen3-32B")).total * 2
    activations = 8192 * 2 * (4 * 5120 + 2 * 25600)
    non_kv = weights + activations + 3758096384
    kv = 85899345920 * 9 // 10 - non_kv
    assert terms == {
        "capacity": 85899345920,
        "weights": weights,
        "activations": activations,
        "runtime_overhead": 3758096384,
        "comm_overhead": 0,
        "cuda_graph": 0,
        "non_kv": non_kv,
        "kv_bytes": kv,
        "tokens": kv // 262144,
    }
    assert blocks == kv // 262144 // 64
    assert formula.endswith(f"num_blocks {blocks} = floor(floor({kv}/262144)/64)")


def test_default_kv_blocks_backends_and_graph_bytes() -> None:
    _, vllm, _ = _qwen32_blocks("vllm")
    _, trt, _ = _qwen32_blocks("trtllm")
    _, sgl, _ = _qwen32_blocks("sglang", memory_fraction=0.88)
    assert trt["kv_bytes"] == (85899345920 - trt["non_kv"]) * 9 // 10
    resident = sgl["runtime_overhead"] + sgl["comm_overhead"]
    assert sgl["kv_bytes"] == (85899345920 - resident) * 88 // 100 - sgl["weights"]
    graph = 2 * GIB
    _, vllm_g, _ = _qwen32_blocks("vllm", cuda_graph_reserved_bytes=graph)
    assert vllm_g["kv_bytes"] == vllm["kv_bytes"] - graph
    _, sgl_g, _ = _qwen32_blocks("sglang", memory_fraction=0.88, cuda_graph_reserved_bytes=graph)
    assert sgl_g["kv_bytes"] == sgl["kv_bytes"] - graph


def test_default_kv_blocks_tp2_uses_nccl_memory() -> None:
    blocks1, _, _ = _qwen32_blocks("vllm")
    blocks2, terms, _ = _qwen32_blocks("vllm", tensor=2, kv_bytes_per_token=131072)
    assert terms["comm_overhead"] == 358612992
    assert blocks2 > 2 * blocks1


def test_default_kv_blocks_no_budget() -> None:
    llama = load_model("meta-llama/Meta-Llama-3.1-70B")
    with pytest.raises(GeometryError, match="no KV budget") as info:
        default_kv_blocks(
            llama,
            load_gpu("l40s"),
            backend="vllm",
            tensor=1,
            pipeline=1,
            max_batched_tokens=8192,
            memory_fraction=0.9,
            kv_bytes_per_token=327680,
            block_size=64,
        )
    msg = str(info.value)
    assert "weights 131.4 GiB" in msg and "of 45.0 GiB capacity" in msg


# --------------------------------------------------------------------------- fixed / manual


def test_fixed_blocks_from_bytes() -> None:
    assert fixed_blocks_from_bytes(8193, 64, 16) == (8, "num_blocks 8 = floor(8193 / (64 x 16))")
    assert fixed_blocks_from_bytes(8192, 64, 16)[0] == 8
    assert fixed_blocks_from_bytes(2048, 64, 16)[0] == 2
    with pytest.raises(GeometryError, match="must fit at least one block"):
        fixed_blocks_from_bytes(1023, 64, 16)
    with pytest.raises(GeometryError, match="overflows"):
        fixed_blocks_from_bytes(2**64, 2**40, 2**30)


def test_manual_state_cache() -> None:
    assert manual_state_cache(64, 16, 1500) == (2, 2048)
    assert manual_state_cache(64, 16, 1024) == (1, 1024)
    assert manual_state_cache(64, 16, 1025) == (2, 2048)
    assert manual_state_cache(1, 1, 2**64 - 1) == (2**64 - 1, 2**64 - 1)
    with pytest.raises(GeometryError, match="bytes_per_request"):
        manual_state_cache(64, 16, 0)
    # capacity.bytes = 2048 -> 2 blocks < 2 state blocks + 1 (the compiler's V23)
    blocks, _ = fixed_blocks_from_bytes(2048, 64, 16)
    state_blocks, _ = manual_state_cache(64, 16, 1500)
    assert blocks < state_blocks + 1


# --------------------------------------------------------------------------- Kimi K3 (KDA + MLA)


@pytest.mark.parametrize(
    ("tensor", "kv_bytes", "block", "bpt", "expected"),
    [
        (8, 2, None, None, (768, 27648, 61046784)),
        (8, 1, 64, None, (1472, 13824, 58503168)),
        (8, 1, 128, None, (1536, 13824, 61046784)),
        (8, 2, 128, 13824, (1536, 13824, 61046784)),
        (4, 2, 64, None, (1472, 27648, 117006336)),
    ],
)
def test_k3_worked_table(
    tensor: int, kv_bytes: int, block: int | None, bpt: int | None, expected: tuple[int, ...]
) -> None:
    r = infer_state_cache(
        load_model(K3),
        tensor=tensor,
        pipeline=1,
        requested_block_size=block,
        kv_dtype_bytes=kv_bytes,
        bytes_per_token=bpt,
    )
    assert (r.block_size, r.bytes_per_token, r.bytes_per_request) == expected
    assert (r.attention_layers, r.state_layers, r.layout) == (24, 69, "kda")
    if tensor == 8:
        assert r.raw_page_bytes == 814080
        assert r.raw_bytes_per_request == 56171520


def test_k3_fp8_block_128_formula() -> None:
    r = infer_state_cache(
        load_model(K3),
        tensor=8,
        pipeline=1,
        requested_block_size=128,
        kv_dtype_bytes=1,
        bytes_per_token=None,
    )
    assert r.formula[0] == "bytes_per_token 13824 = 24 MLA layers x (512 + 64) x 1 B"
    assert "block_size 1536 = 128 x ceil(814080/73728)" in r.formula
    assert r.formula[-1] == "bytes_per_request 61046784 = 69 KDA layers x 884736"
    assert r.page_bytes == 884736 and r.requested_block_size == 128 and r.enlarged


def test_k3_capacity_check_numbers() -> None:
    block_bytes = 768 * 27648
    assert block_bytes == 21233664
    assert fixed_blocks_from_bytes(8 * block_bytes, 768, 27648)[0] == 8
    assert manual_state_cache(768, 27648, 61046784) == (3, 63700992)
    blocks, _ = fixed_blocks_from_bytes(4 * block_bytes - 1, 768, 27648)
    assert blocks == 3 and blocks < 3 + 1


def test_k3_draft_tokens_do_not_change_kda_state() -> None:
    kw: dict[str, Any] = dict(
        tensor=8, pipeline=1, requested_block_size=64, kv_dtype_bytes=2, bytes_per_token=None
    )
    base = infer_state_cache(load_model(K3), **kw)
    spec = infer_state_cache(load_model(K3), num_speculative_tokens=2, **kw)
    assert spec == base


def test_k3_conv_dtype_float32() -> None:
    r = infer_state_cache(
        load_model(K3),
        tensor=8,
        pipeline=1,
        requested_block_size=64,
        kv_dtype_bytes=2,
        bytes_per_token=None,
        mamba_cache_dtype="float32",
    )
    assert r.raw_page_bytes == 12 * (3 * 128 * 3 * 4 + 128 * 128 * 4)


def _k3_variant(**text_config: Any) -> ModelInfo:
    cfg = copy.deepcopy(load_model(K3).config)
    for key, value in text_config.items():
        if value is None:
            cfg["text_config"].pop(key)
        else:
            cfg["text_config"][key] = value
    return ModelInfo.from_config("k3-variant", cfg)


V31_CASES: list[tuple[str, dict[str, Any], str]] = [
    (K3, dict(pipeline=2), "requires vllm and PP=1"),
    (K3, dict(tensor=5), "KDA heads 96 are not divisible by tensor=5"),
    (K3, dict(bytes_per_token=1000), "does not divide evenly across 24 attention layers"),
    (K3, dict(requested_block_size=72), "requested block_size 72 must be a multiple of 16"),
    (K3, dict(mamba_cache_dtype="int8"), "unsupported mamba_cache_dtype 'int8'"),
    ("Qwen/Qwen3-32B", {}, "is not a hybrid recurrent model"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {}, "unsupported model family 'nemotron_h'"),
]


@pytest.mark.parametrize(("name", "overrides", "needle"), V31_CASES)
def test_state_cache_inference_failures(name: str, overrides: dict[str, Any], needle: str) -> None:
    kw: dict[str, Any] = dict(
        tensor=8, pipeline=1, requested_block_size=64, kv_dtype_bytes=2, bytes_per_token=None
    )
    kw.update(overrides)
    with pytest.raises(GeometryError) as info:
        infer_state_cache(load_model(name), **kw)
    msg = str(info.value)
    assert msg.startswith("state_cache inference: ")
    assert msg.endswith("; set bytes_per_request explicitly")
    assert needle in msg


def test_k3_unresolvable_conv_dtype() -> None:
    fp32 = _k3_variant(dtype="float32")
    kw: dict[str, Any] = dict(
        tensor=8, pipeline=1, requested_block_size=64, kv_dtype_bytes=2, bytes_per_token=None
    )
    with pytest.raises(GeometryError, match="set mamba_cache_dtype explicitly"):
        infer_state_cache(fp32, **kw)
    assert infer_state_cache(fp32, mamba_cache_dtype="float16", **kw).block_size == 768


def test_kda_without_mla_is_rejected() -> None:
    no_mla = _k3_variant(kv_lora_rank=None)
    with pytest.raises(GeometryError, match="requires both MLA and KDA layers"):
        infer_state_cache(
            no_mla,
            tensor=8,
            pipeline=1,
            requested_block_size=64,
            kv_dtype_bytes=2,
            bytes_per_token=None,
        )


def test_kimi_linear_alignment_16_gives_1888() -> None:
    full = [4, 8, 12, 16, 20, 24, 27]
    kimi_linear = ModelInfo.from_config(
        "kimi-linear",
        {
            "model_type": "kimi_linear",
            "num_hidden_layers": 27,
            "hidden_size": 2304,
            "num_attention_heads": 32,
            "vocab_size": 163840,
            "kv_lora_rank": 512,
            "qk_rope_head_dim": 64,
            "qk_nope_head_dim": 128,
            "v_head_dim": 128,
            "intermediate_size": 9216,
            "torch_dtype": "bfloat16",
            "linear_attn_config": {
                "full_attn_layers": full,
                "kda_layers": [i for i in range(1, 28) if i not in full],
                "num_heads": 32,
                "head_dim": 128,
                "short_conv_kernel_size": 4,
            },
        },
    )
    r = infer_state_cache(
        kimi_linear,
        tensor=1,
        pipeline=1,
        requested_block_size=16,
        kv_dtype_bytes=2,
        bytes_per_token=None,
    )
    assert (r.raw_page_bytes, r.bytes_per_token, r.block_size) == (2170880, 7 * 1152, 1888)
    assert r.state_layers == 20


# --------------------------------------------------------------------------- GDN


def gdn_fixture(**extra: Any) -> ModelInfo:
    cfg: dict[str, Any] = {
        "model_type": "qwen3_next",
        "num_hidden_layers": 4,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": 100,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "intermediate_size": 64,
        "torch_dtype": "bfloat16",
    }
    cfg.update(extra)
    return ModelInfo.from_config("gdn-fixture", cfg)


def qwen3_next() -> ModelInfo:
    return ModelInfo.from_config(
        "qwen3-next",
        {
            "model_type": "qwen3_next",
            "num_hidden_layers": 48,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "vocab_size": 151936,
            "intermediate_size": 5120,
            "num_experts": 512,
            "num_experts_per_tok": 10,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "full_attention_interval": 4,
            "torch_dtype": "bfloat16",
        },
    )


def _gdn(model: ModelInfo, **overrides: Any) -> Any:
    kw: dict[str, Any] = dict(
        tensor=1, pipeline=1, requested_block_size=64, kv_dtype_bytes=2, bytes_per_token=16
    )
    kw.update(overrides)
    return infer_state_cache(model, **kw)


def test_gdn_fixture_case_20() -> None:
    r = _gdn(gdn_fixture())
    assert (r.layout, r.attention_layers, r.state_layers) == ("gdn", 1, 3)
    assert (r.raw_page_bytes, r.page_bytes) == (896, 1024)
    assert (r.block_size, r.bytes_per_token, r.bytes_per_request) == (64, 16, 3072)
    assert r.raw_bytes_per_request == 3 * 896
    assert not r.enlarged
    assert manual_state_cache(r.block_size, r.bytes_per_token, r.bytes_per_request) == (3, 3072)
    assert _gdn(gdn_fixture(), tensor=2).raw_page_bytes == 448


@pytest.mark.parametrize(
    ("overrides", "raw"),
    [
        (dict(num_speculative_tokens=2), 1152),
        (dict(mamba_cache_dtype="float32"), 1792),  # ssm follows the conv dtype
        (dict(mamba_ssm_cache_dtype="float32"), 1408),
    ],
)
def test_gdn_fixture_dtype_and_draft_variants(overrides: dict[str, Any], raw: int) -> None:
    # 32 B/token keeps the explicit page (2048 B) above these raw pages
    r = _gdn(gdn_fixture(), bytes_per_token=32, **overrides)
    assert r.raw_page_bytes == raw
    assert (r.block_size, r.page_bytes, r.bytes_per_request) == (64, 2048, 6144)


def test_gdn_explicit_page_is_never_enlarged() -> None:
    with pytest.raises(GeometryError) as info:
        _gdn(gdn_fixture(), num_speculative_tokens=2)
    msg = str(info.value)
    assert "padded page 1024 = 64 x 16/1 is smaller than the raw state page 1152" in msg
    assert msg.endswith("; set bytes_per_request explicitly")


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (dict(pipeline=2), "PP=1"),
        (dict(tensor=3), "divisible"),
    ],
)
def test_gdn_fixture_failures(overrides: dict[str, Any], needle: str) -> None:
    with pytest.raises(GeometryError, match=needle):
        _gdn(gdn_fixture(), **overrides)


def test_gdn_divide_evenly() -> None:
    two_full = gdn_fixture(full_attention_interval=2)
    assert (len(two_full.full_attention_layers), len(two_full.state_layers)) == (2, 2)
    with pytest.raises(GeometryError, match="divide evenly"):
        _gdn(two_full, requested_block_size=1, bytes_per_token=1001)
    with pytest.raises(GeometryError, match="divide evenly"):
        _gdn(two_full, requested_block_size=None, bytes_per_token=1001)


def test_gdn_inferred_rate_enlarges_block() -> None:
    # rate = 2 x 2 kv heads x 8 x 1 layer x 2 B = 64 B/token; raw page 896
    r = _gdn(gdn_fixture(), bytes_per_token=None, requested_block_size=2)
    assert (r.bytes_per_token, r.block_size, r.page_bytes) == (64, 14, 896)
    assert "block_size 14 = 2 x ceil(896/128)" in r.formula
    default = _gdn(gdn_fixture(), bytes_per_token=None, requested_block_size=None)
    assert (default.requested_block_size, default.block_size) == (64, 64)


@pytest.mark.parametrize(
    ("tensor", "kv_bytes", "block", "raw", "resolved"),
    [
        (1, 2, 16, 1097728, 544),
        (1, 2, 128, 1097728, 640),
        (4, 2, 16, 274432, 272),
        (1, 1, 16, 1097728, 1072),
        (1, 2, None, 1097728, 576),  # default requested block 64
    ],
)
def test_qwen3_next_vllm_alignment(
    tensor: int, kv_bytes: int, block: int | None, raw: int, resolved: int
) -> None:
    r = _gdn(
        qwen3_next(),
        tensor=tensor,
        kv_dtype_bytes=kv_bytes,
        requested_block_size=block,
        bytes_per_token=None,
    )
    assert (r.raw_page_bytes, r.block_size, r.state_layers) == (raw, resolved, 36)


def test_qwen35_fp32_ssm_from_config() -> None:
    r = _gdn(load_model("Qwen/Qwen3.5-35B-A3B"), requested_block_size=16, bytes_per_token=None)
    assert (r.raw_page_bytes, r.block_size, r.bytes_per_token) == (2146304, 1056, 20480)
    padding = r.page_bytes / r.raw_page_bytes - 1
    assert round(padding * 100, 2) == 0.76
