"""Pure geometry functions used by the compiler's resolve pass.

Everything here works on :class:`~servesim.catalog.ModelInfo` / :class:`~servesim.catalog.GpuSpec`
and plain numbers. Most functions return their result together with a short human-readable
formula string recorded as provenance. Impossible inputs raise :class:`GeometryError` with a
user-facing message.

Conventions: byte counts are per GPU (one TP shard, one pipeline stage); ``tensor``/``pipeline``
are the attention TP and PP sizes; ``moe_tensor * moe_expert`` GPUs share the routed experts.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Literal

import attrs

from servesim import backends, codes
from servesim.catalog import ATTENTION_KINDS, GpuSpec, ModelInfo, dtype_name_bytes

__all__ = [
    "DEFAULT_REQUESTED_BLOCK_SIZE",
    "U64_MAX",
    "GeometryError",
    "InferredStateCache",
    "ParameterCount",
    "activation_bytes",
    "default_kv_blocks",
    "fixed_blocks_from_bytes",
    "infer_state_cache",
    "kv_budget_bytes",
    "kv_bytes_per_token",
    "kv_dtype_bytes",
    "manual_state_cache",
    "parallel_problems",
    "parameter_count",
    "tensor_split_problem",
    "weight_bytes_per_gpu",
]

U64_MAX = 2**64 - 1
GIB = 2**30
DEFAULT_REQUESTED_BLOCK_SIZE = 64  # requested page size for inferred state caches (spec §1.5)
ACTIVATION_HIDDEN_BUFFERS = 4  # hidden-size activation buffers live per batched token


class GeometryError(ValueError):
    """The requested geometry is impossible (no KV budget, indivisible heads, ...)."""


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise GeometryError(f"{name} must be a positive integer, got {value!r}")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------
# KV bytes per token


def kv_dtype_bytes(model: ModelInfo, kvcache_quant_mode: str | None) -> int:
    """Bytes per KV element: ``fp8``->1, ``bf16``/``fp16``->2, ``fp32``->4, None/``auto``->model."""
    if kvcache_quant_mode is None or kvcache_quant_mode.strip().lower() == "auto":
        return model.dtype_bytes
    size = dtype_name_bytes(kvcache_quant_mode)
    if size is None:
        raise GeometryError(
            f"unknown KV cache dtype {kvcache_quant_mode!r}; use auto, fp8, bf16, fp16 or fp32"
        )
    return size


def tensor_split_problem(model: ModelInfo, tensor: int) -> str | None:
    """Why ``tensor`` ranks cannot shard ``model``'s attention, or None.

    vLLM, SGLang and TensorRT-LLM give each rank whole query heads and whole KV heads
    (replicated when fewer than the ranks); MLA replicates its latent, so only the query
    heads split. Linear-attention (KDA, GDN) heads split like query heads."""
    heads, kv = model.num_attention_heads, model.num_kv_heads
    la = model.linear_attention
    if la is not None and la.kind in ("kda", "gdn") and (
            la.num_key_heads % tensor or la.num_value_heads % tensor):
        return (f"tensor={tensor} does not shard {model.name!r}: its {la.kind} layers' "
                f"{la.num_key_heads} key and {la.num_value_heads} value heads must split "
                "evenly over the tensor-parallel ranks")
    if model.is_mla:
        if heads % tensor:
            return (f"tensor={tensor} does not shard {model.name!r}: its {heads} attention "
                    "heads must split evenly over the tensor-parallel ranks")
        return None
    if heads % tensor or (kv % tensor and tensor % kv):
        return (f"tensor={tensor} does not shard {model.name!r}: its {heads} attention heads "
                f"and {kv} KV heads must split evenly (or the KV heads replicate evenly) over "
                "the tensor-parallel ranks")
    return None


def parallel_problems(model: ModelInfo, *, tensor: int, pipeline: int, attention_data: int,
                      moe_tensor: int, moe_expert: int) -> Iterator[tuple[str, str, str]]:
    """``(parallelism key, code, message)`` for each way the shape does not fit ``model``."""
    problem = tensor_split_problem(model, tensor)
    if problem:
        yield "tensor", codes.INDIVISIBLE_HEADS, problem
    if pipeline > model.num_layers:
        yield "pipeline", codes.PIPELINE_OVER_LAYERS, (
            f"pipeline={pipeline} exceeds the {model.num_layers} layers of {model.name!r}: "
            "every pipeline stage holds at least one layer")
    if not model.is_moe:
        for key, value in (("moe_tensor", moe_tensor), ("moe_expert", moe_expert)):
            if value != 1:
                yield key, codes.MOE_PARALLEL_DENSE, (
                    f"{key}={value}, but {model.name!r} has no routed experts to split")
        return
    attention_gpus = tensor * attention_data
    if moe_tensor * moe_expert != attention_gpus:
        yield "moe_expert", codes.MOE_PARALLEL_SHAPE, (
            f"moe_tensor x moe_expert = {moe_tensor} x {moe_expert} must equal tensor x "
            f"attention_data = {attention_gpus}: the experts are split over the GPUs of a "
            "pipeline stage")
    if moe_expert > model.num_experts:
        yield "moe_expert", codes.MOE_PARALLEL_SHAPE, (
            f"moe_expert={moe_expert} exceeds the {model.num_experts} routed experts of "
            f"{model.name!r}: every expert-parallel rank holds at least one")


def kv_bytes_per_token(
    model: ModelInfo, *, tensor: int, pipeline: int, kv_dtype_bytes: int
) -> tuple[int, str]:
    """KV bytes per token on one TP shard of one pipeline stage (spec §3.2).

    MLA: ``layers * (kv_lora_rank + qk_rope_head_dim) * dtype`` (latent replicated, not split
    by TP). GQA/MHA: ``2 * ceil(kv_heads / tp) * head_dim * layers * dtype``. ``layers`` counts
    attention layers only (recurrent and MLP-only layers of hybrid models are skipped; sliding
    window layers count as full) and is ``ceil(attention_layers / pp)`` per stage.
    """
    _positive("tensor", tensor)
    _positive("pipeline", pipeline)
    _positive("kv_dtype_bytes", kv_dtype_bytes)
    total_layers = len(model.attention_layers)
    if total_layers == 0:
        raise GeometryError(f"model {model.name!r} has no attention layers holding a KV cache")
    layers = _ceil_div(total_layers, pipeline)
    kind = "MLA layers" if model.is_mla else "layers"
    layer_note = f"{layers} {kind}"
    if pipeline > 1:
        layer_note = f"ceil({total_layers}/{pipeline}) = {layer_note}"
    if model.is_mla:
        kv_lora = model.kv_lora_rank or 0
        rope = model.qk_rope_head_dim or 0
        value = layers * (kv_lora + rope) * kv_dtype_bytes
        formula = (
            f"kv_bytes_per_token {value} = {layer_note} x ({kv_lora} + {rope}) x {kv_dtype_bytes} B"
        )
        return value, formula
    problem = tensor_split_problem(model, tensor)
    if problem:
        raise GeometryError(problem)
    heads = _ceil_div(model.num_kv_heads, tensor)
    value = 2 * heads * model.head_dim * layers * kv_dtype_bytes
    formula = (
        f"kv_bytes_per_token {value} = 2 x ceil({model.num_kv_heads}/{tensor}) kv heads x "
        f"{model.head_dim} x {layer_note} x {kv_dtype_bytes} B"
    )
    return value, formula


# ---------------------------------------------------------------------------------------------
# Parameters and weights


@attrs.frozen
class ParameterCount:
    """Parameter counts by group; ``routed_experts`` is the only group split over EP/MoE-TP.

    Approximation: every linear projection of the HF architecture plus embeddings, LM head,
    router and norms; biases, rotary tables and MTP/draft layers are left out.
    """

    embedding: int
    lm_head: int
    attention: int
    linear_attention: int
    dense_mlp: int
    shared_experts: int
    routed_experts: int
    other: int

    @property
    def non_expert(self) -> int:
        return self.total - self.routed_experts

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.lm_head
            + self.attention
            + self.linear_attention
            + self.dense_mlp
            + self.shared_experts
            + self.routed_experts
            + self.other
        )


def _attention_params(model: ModelInfo) -> int:
    h = model.hidden_size
    heads = model.num_attention_heads
    if model.is_mla:
        nope = model.qk_nope_head_dim or 0
        rope = model.qk_rope_head_dim or 0
        v_dim = model.v_head_dim or nope
        kv_lora = model.kv_lora_rank or 0
        q_lora = model.q_lora_rank
        qk = heads * (nope + rope)
        q = h * q_lora + q_lora * qk + q_lora if q_lora else h * qk
        kv = h * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + kv_lora
        return q + kv + heads * v_dim * h
    d = model.head_dim
    q_out = heads * d * (2 if model.attn_output_gate else 1)
    return h * q_out + 2 * h * model.num_kv_heads * d + heads * d * h


def _linear_attention_params(model: ModelInfo) -> int:
    la = model.linear_attention
    if la is None:
        return 0
    h = model.hidden_size
    kh, vh, kd, vd, k = (
        la.num_key_heads,
        la.num_value_heads,
        la.key_head_dim,
        la.value_head_dim,
        la.conv_kernel,
    )
    if la.kind == "gdn":  # q, k, v, z (output gate), b, a projections; conv; out projection
        conv_dim = 2 * kh * kd + vh * vd
        return h * (conv_dim + vh * vd + 2 * vh) + conv_dim * k + vh * vd * h
    if la.kind == "kda":  # q, k, v, forget gate, output gate, beta; 3 short convs; out proj
        inner = vh * vd
        return h * (5 * inner + vh) + 3 * inner * k + inner * h
    # mamba2: in_proj (z, x, B, C, dt), conv over x/B/C, out_proj
    inner = vh * vd
    conv_dim = inner + 2 * kh * kd
    return h * (inner + conv_dim + vh) + conv_dim * k + inner * h


def parameter_count(model: ModelInfo) -> ParameterCount:
    """Approximate parameter count from the config shapes (see :class:`ParameterCount`)."""
    h = model.hidden_size
    mats = 3 if model.mlp_gated else 2  # gate/up/down, or up/down for relu2 MLPs
    attention = linear = dense = shared = routed = 0
    other = h  # final norm
    attn_layer = _attention_params(model)
    linear_layer = _linear_attention_params(model)
    for mixer, mlp in zip(model.layer_types, model.mlp_types, strict=True):
        other += 2 * h  # input and post-attention norms
        if mixer in ATTENTION_KINDS:
            attention += attn_layer
        elif mixer != "none":
            linear += linear_layer
        if mlp == "dense":
            dense += mats * h * (model.intermediate_size or 0)
        elif mlp == "moe":
            eh = model.expert_hidden_size or h
            moe_inter = model.moe_intermediate_size or 0
            routed += model.num_experts * mats * eh * moe_inter
            shared += mats * h * model.shared_expert_intermediate_size
            other += h * model.num_experts  # router
            if eh != h:
                other += 2 * h * eh  # latent down/up projections around the routed experts
    embedding = model.vocab_size * h
    lm_head = 0 if model.tie_word_embeddings else model.vocab_size * h
    return ParameterCount(
        embedding=embedding,
        lm_head=lm_head,
        attention=attention,
        linear_attention=linear,
        dense_mlp=dense,
        shared_experts=shared,
        routed_experts=routed,
        other=other,
    )


# Weight precisions of GEMM / MoE weights: bytes per weight, scales included, and the tensor
# cores that compute with them. A GPU without those falls back to bf16 ones (weight-only
# kernels that dequantise), which is what serving stacks do on such GPUs. The memory
# estimate and the analytical timing both read this table.
WEIGHT_QUANT: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bf16"),
    "fp16": (2.0, "bf16"),
    "fp8": (1.0, "fp8"),
    "fp8_block": (1.0 + 4 / (128 * 128), "fp8"),  # one fp32 scale per 128x128 block
    "int8": (1.0, "int8"),
    "nvfp4": (0.5 + 1 / 16, "fp4"),  # 4-bit values + one fp8 scale per 16 weights
    "mxfp4": (0.5 + 1 / 32, "fp4"),
    "fp4": (0.5 + 1 / 16, "fp4"),
    "int4": (0.5 + 1 / 64, "bf16"),
    "int4_wo": (0.5 + 1 / 64, "bf16"),  # weight-only int4 (w4a16)
    "w4a16": (0.5 + 1 / 64, "bf16"),
    "w8a16": (1.0 + 1 / 64, "bf16"),  # weight-only int8 (GPTQ / AWQ 8-bit)
}


def unpriced_weight_quant(name: str) -> str | None:
    """Why the default timing cannot price weights named ``name`` (None: it can). The one
    rule for the resolved ``timing.gemm_quant`` / ``moe_quant``: run on a payload at compile
    time and at engine handoff (:mod:`servesim.rules`) and by the timing model itself."""
    if name in WEIGHT_QUANT:
        return None
    return (f"the default timing cannot price {name} weights (it prices "
            f"{', '.join(sorted(WEIGHT_QUANT))})")


def expert_weight_bytes(model: ModelInfo, weight_dtype_bytes: float) -> float:
    """Bytes per routed-expert weight when the other weights take ``weight_dtype_bytes``:
    the same, unless the checkpoint stores its experts narrower than its other weights
    (gpt-oss's MXFP4), which they keep while that is narrower still."""
    if model.expert_weight_dtype_bytes < model.weight_dtype_bytes:
        return min(weight_dtype_bytes, model.expert_weight_dtype_bytes)
    return weight_dtype_bytes


def weight_bytes_per_gpu(
    model: ModelInfo,
    *,
    tensor: int,
    pipeline: int,
    moe_tensor: int = 1,
    moe_expert: int = 1,
    weight_dtype_bytes: float | None = None,
    expert_dtype_bytes: float | None = None,
) -> int:
    """Weight bytes resident on one GPU.

    Non-expert parameters are split over ``tensor * pipeline``; routed experts over
    ``moe_tensor * moe_expert * pipeline``. ``weight_dtype_bytes`` defaults to the model's
    (FP8 checkpoints -> 1). Routed experts use ``expert_dtype_bytes`` when given, else the
    model's 4-bit expert width when the checkpoint quantizes experts below the weight dtype,
    else ``weight_dtype_bytes``. Embeddings and LM head stay in the model dtype when the
    weights are narrower.
    """
    for name, value in (
        ("tensor", tensor),
        ("pipeline", pipeline),
        ("moe_tensor", moe_tensor),
        ("moe_expert", moe_expert),
    ):
        _positive(name, value)
    wbytes = model.weight_dtype_bytes if weight_dtype_bytes is None else weight_dtype_bytes
    if wbytes <= 0:
        raise GeometryError(f"weight_dtype_bytes must be positive, got {wbytes!r}")
    ebytes = (expert_dtype_bytes if expert_dtype_bytes is not None
              else expert_weight_bytes(model, wbytes))
    params = parameter_count(model)
    # quantization narrows the linear layers: embeddings and LM head stay in the model dtype
    # (FP8, NVFP4, GPTQ and AWQ checkpoints alike)
    kept = params.embedding + params.lm_head
    kept_bytes = max(wbytes, model.dtype_bytes)
    dense_bytes = ((params.non_expert - kept) * wbytes + kept * kept_bytes) / (tensor * pipeline)
    expert_bytes = params.routed_experts * ebytes / (moe_tensor * moe_expert * pipeline)
    return math.ceil(dense_bytes + expert_bytes)


# ---------------------------------------------------------------------------------------------
# G1 capacity


def activation_bytes(model: ModelInfo, *, tensor: int, max_batched_tokens: int) -> int:
    """Estimated peak activation memory for one forward pass of ``max_batched_tokens`` tokens.

    ``tokens * dtype * (4 * hidden + 2 * ceil(ffn / tp))``: a few hidden-size buffers
    (residual, norm output, attention output, projection output) plus the gate/up output of the
    widest MLP on this shard (dense width, or ``experts_per_token * expert width`` for MoE).
    """
    _positive("tensor", tensor)
    _positive("max_batched_tokens", max_batched_tokens)
    ffn = model.intermediate_size or 0
    if model.is_moe:
        moe_width = model.experts_per_token * (model.moe_intermediate_size or 0)
        moe_width += model.shared_expert_intermediate_size
        ffn = max(ffn if "dense" in model.mlp_types else 0, moe_width)
    per_token = ACTIVATION_HIDDEN_BUFFERS * model.hidden_size + 2 * _ceil_div(ffn, tensor)
    return max_batched_tokens * model.dtype_bytes * per_token


def _fraction(value: float) -> Fraction:
    return Fraction(str(value))  # the decimal the user wrote: 0.9 -> 9/10 exactly


def kv_budget_bytes(
    backend: str | backends.Backend,
    *,
    capacity: int,
    memory_fraction: float,
    weights: int,
    activations: int,
    runtime_overhead: int,
    comm_overhead: int,
    cuda_graph: int,
) -> tuple[int, str]:
    """KV bytes per GPU from the memory terms (spec §3.3), floored; may be <= 0, by the
    formula of ``backend`` (a policy, or a built-in's name:
    :meth:`servesim.backends.Backend.kv_budget`)."""
    if not 0 < memory_fraction <= 1:
        raise GeometryError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    policy = backends.policy(backend) if isinstance(backend, str) else backend
    if policy is None:
        raise GeometryError(f"unknown backend {backend!r}; expected "
                            f"{', '.join(backends.BUILTIN)}")
    return policy.kv_budget(capacity=capacity, fraction=_fraction(memory_fraction),
                            memory_fraction=memory_fraction, weights=weights,
                            activations=activations, runtime_overhead=runtime_overhead,
                            comm_overhead=comm_overhead, cuda_graph=cuda_graph)


def default_kv_blocks(
    model: ModelInfo,
    gpu: GpuSpec,
    *,
    backend: str | backends.Backend,
    tensor: int,
    pipeline: int,
    moe_tensor: int = 1,
    moe_expert: int = 1,
    max_batched_tokens: int,
    memory_fraction: float,
    cuda_graph_reserved_bytes: int = 0,
    kv_bytes_per_token: int,
    block_size: int,
    weight_dtype_bytes: float | None = None,
    expert_dtype_bytes: float | None = None,
) -> tuple[int, dict[str, int], str]:
    """G1 blocks per attention-DP rank for ``capacity.type = "default"`` (spec §3.3).

    Returns ``(num_blocks, breakdown, formula)``; the breakdown holds every term in bytes
    (``capacity``, ``weights``, ``activations``, ``runtime_overhead`` = GPU ``other_mem``,
    ``comm_overhead`` = ``nccl_mem`` for the TP size, ``cuda_graph``, ``non_kv``, ``kv_bytes``)
    plus ``tokens``. Raises GeometryError("no KV budget ...") when nothing is left.
    """
    _positive("kv_bytes_per_token", kv_bytes_per_token)
    _positive("block_size", block_size)
    if cuda_graph_reserved_bytes < 0:
        raise GeometryError("cuda_graph_reserved_bytes must be >= 0")
    weights = weight_bytes_per_gpu(
        model,
        tensor=tensor,
        pipeline=pipeline,
        moe_tensor=moe_tensor,
        moe_expert=moe_expert,
        weight_dtype_bytes=weight_dtype_bytes,
        expert_dtype_bytes=expert_dtype_bytes,
    )
    activations = activation_bytes(model, tensor=tensor, max_batched_tokens=max_batched_tokens)
    runtime = gpu.other_mem
    comm = gpu.nccl_mem_for(tensor)
    capacity = gpu.mem_capacity_bytes
    kv, kv_formula = kv_budget_bytes(
        backend,
        capacity=capacity,
        memory_fraction=memory_fraction,
        weights=weights,
        activations=activations,
        runtime_overhead=runtime,
        comm_overhead=comm,
        cuda_graph=cuda_graph_reserved_bytes,
    )
    non_kv = weights + activations + runtime + comm + cuda_graph_reserved_bytes
    tokens = max(kv, 0) // kv_bytes_per_token
    blocks = tokens // block_size
    if blocks < 1:
        raise GeometryError(
            f"no KV budget on {gpu.name} for {model.name} "
            f"({backend if isinstance(backend, str) else backend.NAME}): weights "
            f"{_gib(weights)} per GPU plus {_gib(non_kv - weights)} other non-KV memory leave "
            f"{_gib(max(kv, 0))} of {_gib(capacity)} capacity at memory_fraction "
            f"{memory_fraction}, less than one {block_size}-token block; use more GPUs "
            "(tensor/pipeline/expert parallelism), a larger GPU or a higher memory_fraction"
        )
    breakdown = {
        "capacity": capacity,
        "weights": weights,
        "activations": activations,
        "runtime_overhead": runtime,
        "comm_overhead": comm,
        "cuda_graph": cuda_graph_reserved_bytes,
        "non_kv": non_kv,
        "kv_bytes": kv,
        "tokens": tokens,
    }
    formula = (
        f"{kv_formula}; num_blocks {blocks} = floor(floor({kv}/{kv_bytes_per_token})/{block_size})"
    )
    return blocks, breakdown, formula


def fixed_blocks_from_bytes(
    capacity_bytes: int, block_size: int, bytes_per_token: int
) -> tuple[int, str]:
    """``floor(capacity_bytes / (block_size * bytes_per_token))`` (spec V18/V19)."""
    _positive("capacity bytes", capacity_bytes)
    _positive("block_size", block_size)
    _positive("bytes_per_token", bytes_per_token)
    block_bytes = block_size * bytes_per_token
    if block_bytes > U64_MAX:
        raise GeometryError(f"block_size * bytes_per_token overflows u64 ({block_bytes})")
    blocks = capacity_bytes // block_bytes
    if not 0 < blocks <= U64_MAX:
        raise GeometryError(
            f"fixed KV capacity must fit at least one block within u64: {capacity_bytes} bytes "
            f"< one block of {block_size} x {bytes_per_token} = {block_bytes} bytes"
        )
    return (
        blocks,
        f"num_blocks {blocks} = floor({capacity_bytes} / ({block_size} x {bytes_per_token}))",
    )


# ---------------------------------------------------------------------------------------------
# State cache


def manual_state_cache(
    block_size: int, bytes_per_token: int, bytes_per_request: int
) -> tuple[int, int]:
    """``(state_blocks, allocated_bytes_per_request)`` for a per-request state (spec §3.4).

    ``state_blocks = ceil(bytes_per_request / (block_size * bytes_per_token))``.
    """
    _positive("block_size", block_size)
    _positive("bytes_per_token", bytes_per_token)
    _positive("bytes_per_request", bytes_per_request)
    block_bytes = block_size * bytes_per_token
    state_blocks = (bytes_per_request - 1) // block_bytes + 1
    return state_blocks, state_blocks * block_bytes


@attrs.frozen
class InferredStateCache:
    """Geometry inferred from a hybrid model (spec §3.5/§3.6); bytes are per GPU.

    ``bytes_per_request`` is one page-padded state copy over all recurrent layers;
    ``raw_bytes_per_request`` the unpadded state; ``formula`` holds provenance lines.
    """

    layout: Literal["kda", "gdn"]
    requested_block_size: int
    block_size: int
    bytes_per_token: int
    bytes_per_request: int
    raw_bytes_per_request: int
    raw_page_bytes: int
    page_bytes: int
    attention_layers: int
    state_layers: int
    enlarged: bool
    formula: tuple[str, ...]


def _infer_error(detail: str) -> GeometryError:
    return GeometryError(f"state_cache inference: {detail}; set bytes_per_request explicitly")


_STATE_DTYPES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4}


def _state_dtype(name: str, field: str) -> int:
    key = name.strip().lower().removeprefix("torch.")
    aliases = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "half": "float16"}
    key = aliases.get(key, key)
    if key not in _STATE_DTYPES:
        raise _infer_error(f"unsupported {field} {name!r} (use auto, float16 or float32)")
    return _STATE_DTYPES[key]


def _conv_dtype_bytes(model: ModelInfo, mamba_cache_dtype: str) -> tuple[int, str]:
    if mamba_cache_dtype.strip().lower() != "auto":
        return _state_dtype(mamba_cache_dtype, "mamba_cache_dtype"), mamba_cache_dtype
    name = (model.dtype_name or "").lower()
    if name not in ("float16", "bfloat16", "fp16", "bf16", "half"):
        raise _infer_error(
            f"cannot resolve the conv-state dtype from model dtype {model.dtype_name!r} "
            "(needs float16/bfloat16); set mamba_cache_dtype explicitly"
        )
    return 2, name


def infer_state_cache(
    model: ModelInfo,
    *,
    tensor: int,
    pipeline: int,
    requested_block_size: int | None,
    kv_dtype_bytes: int,
    bytes_per_token: int | None,
    mamba_cache_dtype: str = "auto",
    mamba_ssm_cache_dtype: str = "auto",
    num_speculative_tokens: int = 0,
) -> InferredStateCache:
    """Infer block size, bytes/token and per-request state bytes for a hybrid vLLM model.

    Kimi linear (KDA + MLA, spec §3.5): the requested block (default 64, multiple of 16) is
    enlarged to ``b * ceil(raw_page / (b * per_layer_token))`` so one attention page holds one
    layer's state. GDN (Qwen3-Next / Qwen3.5): with both ``requested_block_size`` and
    ``bytes_per_token`` given the block is never enlarged (the page must already hold the
    state, spec §3.6); otherwise the same enlargement rule applies (vLLM's hybrid alignment
    with the requested block as alignment, e.g. Qwen3-Next TP1 BF16 16 -> 544).
    ``bytes_per_request = state_layers * page``.
    """
    _positive("tensor", tensor)
    _positive("pipeline", pipeline)
    if pipeline != 1:
        raise _infer_error(f"requires vllm and PP=1, got pipeline={pipeline}")
    if requested_block_size is not None:
        _positive("block_size", requested_block_size)
    if bytes_per_token is not None:
        _positive("bytes_per_token", bytes_per_token)
    if num_speculative_tokens < 0:
        raise GeometryError("num_speculative_tokens must be >= 0")
    la = model.linear_attention
    if not model.is_hybrid or la is None:
        raise _infer_error(
            f"model {model.name!r} ({model.model_type}) is not a hybrid recurrent model"
        )
    if la.kind == "kda":
        return _infer_kda(
            model,
            tensor=tensor,
            requested=DEFAULT_REQUESTED_BLOCK_SIZE
            if requested_block_size is None
            else requested_block_size,
            kv_dtype_bytes=kv_dtype_bytes,
            bytes_per_token=bytes_per_token,
            mamba_cache_dtype=mamba_cache_dtype,
        )
    if la.kind == "gdn":
        return _infer_gdn(
            model,
            tensor=tensor,
            requested_block_size=requested_block_size,
            kv_dtype_bytes=kv_dtype_bytes,
            bytes_per_token=bytes_per_token,
            mamba_cache_dtype=mamba_cache_dtype,
            mamba_ssm_cache_dtype=mamba_ssm_cache_dtype,
            num_speculative_tokens=num_speculative_tokens,
        )
    raise _infer_error(
        f"unsupported model family {model.model_type!r} ({la.kind} layers); "
        "inference supports Kimi linear (KDA) and Qwen3-Next/Qwen3.5 (GDN)"
    )


def _token_rate(
    model: ModelInfo, *, tensor: int, kv_dtype_bytes: int, bytes_per_token: int | None
) -> tuple[int, str]:
    if bytes_per_token is not None:
        return bytes_per_token, f"bytes_per_token {bytes_per_token} (explicit)"
    rate, formula = kv_bytes_per_token(
        model, tensor=tensor, pipeline=1, kv_dtype_bytes=kv_dtype_bytes
    )
    return rate, formula.removeprefix("kv_")


def _enlarge(requested: int, raw_page: int, per_layer_token: int) -> tuple[int, str]:
    requested_page = requested * per_layer_token
    factor = _ceil_div(raw_page, requested_page)
    block = requested * factor
    return block, f"block_size {block} = {requested} x ceil({raw_page}/{requested_page})"


def _infer_kda(
    model: ModelInfo,
    *,
    tensor: int,
    requested: int,
    kv_dtype_bytes: int,
    bytes_per_token: int | None,
    mamba_cache_dtype: str,
) -> InferredStateCache:
    la = model.linear_attention
    assert la is not None
    attn = len(model.attention_layers)
    state = len(model.state_layers)
    if not model.is_mla or attn == 0 or state == 0:
        raise _infer_error(
            f"model {model.name!r} is not hybrid in the supported way: requires both MLA and "
            "KDA layers"
        )
    if requested % 16:
        raise _infer_error(f"requested block_size {requested} must be a multiple of 16")
    heads = la.num_value_heads
    if heads % tensor:
        raise _infer_error(f"KDA heads {heads} are not divisible by tensor={tensor}")
    rate, rate_formula = _token_rate(
        model, tensor=tensor, kv_dtype_bytes=kv_dtype_bytes, bytes_per_token=bytes_per_token
    )
    if rate % attn:
        raise _infer_error(
            f"bytes_per_token {rate} does not divide evenly across {attn} attention layers"
        )
    per_layer = rate // attn
    conv_bytes, conv_name = _conv_dtype_bytes(model, mamba_cache_dtype)
    d, k = la.value_head_dim, la.conv_kernel
    local = heads // tensor
    raw_page = local * (3 * d * (k - 1) * conv_bytes + d * d * 4)
    block, block_formula = _enlarge(requested, raw_page, per_layer)
    page = block * per_layer
    raw_formula = (f"raw_page {raw_page} = {heads}/{tensor} heads x (3 x {d} x ({k}-1) x "
                   f"{conv_bytes} B [{conv_name}] + {d} x {d} x 4 B)")
    return _sized("kda", requested, block, rate, raw_page, page, attn, state,
                  (rate_formula, raw_formula, block_formula))


def _sized(layout: Literal["kda", "gdn"], requested: int, block: int, rate: int,
           raw_page: int, page: int, attn: int, state: int, formulas: tuple[str, ...]
           ) -> InferredStateCache:
    """The per-request state of ``state`` recurrent layers, one page each (page-padded)."""
    name = "KDA" if layout == "kda" else "GDN"
    return InferredStateCache(
        layout=layout, requested_block_size=requested, block_size=block,
        bytes_per_token=rate, bytes_per_request=state * page,
        raw_bytes_per_request=state * raw_page, raw_page_bytes=raw_page, page_bytes=page,
        attention_layers=attn, state_layers=state, enlarged=block != requested,
        formula=(*formulas, f"page {page} = {block} x ({rate}/{attn})",
                 f"bytes_per_request {state * page} = {state} {name} layers x {page}"),
    )


def _infer_gdn(
    model: ModelInfo,
    *,
    tensor: int,
    requested_block_size: int | None,
    kv_dtype_bytes: int,
    bytes_per_token: int | None,
    mamba_cache_dtype: str,
    mamba_ssm_cache_dtype: str,
    num_speculative_tokens: int,
) -> InferredStateCache:
    la = model.linear_attention
    assert la is not None
    attn = len(model.full_attention_layers)
    state = len(model.state_layers)
    if attn == 0 or state == 0:
        raise _infer_error(
            f"model {model.name!r} is not hybrid: needs both full-attention and GDN layers"
        )
    kh, vh = la.num_key_heads, la.num_value_heads
    if kh % tensor or vh % tensor:
        raise _infer_error(
            f"GDN key heads {kh} and value heads {vh} must be divisible by tensor={tensor}"
        )
    conv_bytes, conv_name = _conv_dtype_bytes(model, mamba_cache_dtype)
    if mamba_ssm_cache_dtype.strip().lower() != "auto":
        ssm_bytes, ssm_name = (
            _state_dtype(mamba_ssm_cache_dtype, "mamba_ssm_cache_dtype"),
            mamba_ssm_cache_dtype,
        )
    elif la.ssm_dtype is not None:
        ssm_bytes, ssm_name = _state_dtype(la.ssm_dtype, "mamba_ssm_dtype"), la.ssm_dtype
    else:
        ssm_bytes, ssm_name = conv_bytes, conv_name
    kd, vd, k = la.key_head_dim, la.value_head_dim, la.conv_kernel
    conv_dim = 2 * kh * kd + vh * vd
    conv = conv_dim // tensor * (k - 1 + num_speculative_tokens) * conv_bytes
    temporal = vh // tensor * vd * kd * ssm_bytes
    raw_page = conv + temporal
    raw_formula = (
        f"raw_page {raw_page} = conv ({conv_dim}/{tensor} x ({k}-1+{num_speculative_tokens}) x "
        f"{conv_bytes} B [{conv_name}]) + temporal ({vh}/{tensor} x {vd} x {kd} x {ssm_bytes} B"
        f" [{ssm_name}])"
    )
    explicit = requested_block_size is not None and bytes_per_token is not None
    requested = (
        DEFAULT_REQUESTED_BLOCK_SIZE if requested_block_size is None else requested_block_size
    )
    rate, rate_formula = _token_rate(
        model, tensor=tensor, kv_dtype_bytes=kv_dtype_bytes, bytes_per_token=bytes_per_token
    )
    if explicit:
        if (requested * rate) % attn:
            raise _infer_error(
                f"block_size x bytes_per_token = {requested * rate} does not divide evenly "
                f"across {attn} attention layers"
            )
        page = requested * rate // attn
        if page < raw_page:
            raise _infer_error(
                f"padded page {page} = {requested} x {rate}/{attn} is smaller than the raw "
                f"state page {raw_page}; raise block_size or bytes_per_token"
            )
        block = requested
        block_formula = f"block_size {block} (explicit, not enlarged)"
    else:
        if rate % attn:
            raise _infer_error(
                f"bytes_per_token {rate} does not divide evenly across {attn} attention layers"
            )
        block, block_formula = _enlarge(requested, raw_page, rate // attn)
        page = block * (rate // attn)
    return _sized("gdn", requested, block, rate, raw_page, page, attn, state,
                  (rate_formula, raw_formula, block_formula))
