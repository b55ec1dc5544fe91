"""Shipped model and GPU catalog: typed, read-only views of HF configs and GPU specs.

Models are addressed by a local directory holding a ``config.json``, or by a Hugging Face id
(``Qwen/Qwen3-32B``): a shipped config or an alias of one (:func:`load_model` gives the
order); GPUs by their file stem (``h200_sxm``). Unknown names raise :class:`CatalogError`
listing the closest known names.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import attrs

from servesim import codes
from servesim.catalog import hub
from servesim.files import MiB, Unreadable, read_bounded

__all__ = [
    "ATTENTION_KINDS",
    "RECURRENT_KINDS",
    "CatalogError",
    "GpuSpec",
    "LinearAttention",
    "MixerKind",
    "MlpKind",
    "ModelConfigError",
    "ModelInfo",
    "catalog_id",
    "dtype_name_bytes",
    "gpu_names",
    "load_gpu",
    "load_model",
    "model_aliases",
    "model_names",
]

MixerKind = Literal["full_attention", "sliding_attention", "kda", "gdn", "mamba2", "none"]
MlpKind = Literal["dense", "moe", "none"]
LinearKind = Literal["kda", "gdn", "mamba2"]

ATTENTION_KINDS: frozenset[str] = frozenset({"full_attention", "sliding_attention"})
RECURRENT_KINDS: frozenset[str] = frozenset({"kda", "gdn", "mamba2"})

_DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "fp32": 4,
    "float": 4,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8": 1,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "int8": 1,
    "uint8": 1,
}


class CatalogError(ValueError):
    """An unknown model/GPU name or an unreadable model directory."""


class ModelConfigError(CatalogError):
    """A model folder's ``config.json`` that servesim cannot read as a model."""


def dtype_name_bytes(name: str) -> int | None:
    """Bytes per element of a dtype name (``torch.bfloat16``, ``bf16``, ``fp8`` ...), or None."""
    key = name.strip().lower().removeprefix("torch.")
    return _DTYPE_BYTES.get(key)


@attrs.frozen
class LinearAttention:
    """Geometry shared by the recurrent (linear-attention / SSM) layers of a hybrid model.

    ``kda`` (Kimi linear): ``num_key_heads == num_value_heads`` = KDA heads, both dims = head dim.
    ``gdn`` (Qwen3-Next / Qwen3.5 Gated DeltaNet): ``linear_*`` fields of the config.
    ``mamba2`` (Nemotron-H): value heads/dim = ``mamba_num_heads``/``mamba_head_dim``,
    ``num_key_heads`` = ``n_groups``, ``key_head_dim`` = ``ssm_state_size``.
    ``ssm_dtype`` is the recurrent-state dtype pinned by the config, if any.
    """

    kind: LinearKind
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    ssm_dtype: str | None = None


MAX_MODEL_CONFIG_BYTES = 4 * MiB  # a Hugging Face config.json is a few kB
CONFIG_INT_MAX = 2**31 - 1  # any size or count a config.json gives
MAX_LAYERS = 2**16


def _int(cfg: Mapping[str, Any], *keys: str, default: int | None = None, lo: int = 0,
         hi: int = CONFIG_INT_MAX) -> int | None:
    """The first of ``keys`` that ``cfg`` sets (``null`` counts as unset): an integer in
    ``[lo, hi]`` (a float with an integer value counts), else a CatalogError naming it."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
            raise CatalogError(f"config.json: {key!r} must be an integer from {lo} to {hi}, "
                               f"got {value!r:.40}")
        return value
    return default


def _indices(cfg: Mapping[str, Any], key: str, num_layers: int) -> list[int]:
    """A list of layer indices (0 to ``num_layers``) that ``cfg`` may set under ``key``."""
    value = cfg.get(key) or []
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= num_layers
            for i in value):
        raise CatalogError(f"config.json: {key!r} must be a list of layer indices from 0 to "
                           f"{num_layers}")
    return value


def _bool(cfg: Mapping[str, Any], key: str, default: bool = False) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise CatalogError(f"config.json: {key!r} must be true or false, got {value!r:.40}")
    return value


def _req_int(name: str, cfg: Mapping[str, Any], *keys: str, hi: int = CONFIG_INT_MAX) -> int:
    value = _int(cfg, *keys, lo=1, hi=hi)
    if value is None:
        raise CatalogError(f"model {name!r}: config.json has no integer {' / '.join(keys)}")
    return value


_QUANT_METHODS = ("fp8", "mxfp4", "compressed-tensors", "gptq", "awq", "modelopt")
_ONE_LAYER = re.compile(r"layers\.\d+\.")


def _unsized(what: str) -> CatalogError:
    return CatalogError(f"config.json: quantization_config {what}; servesim sizes "
                        f"{', '.join(_QUANT_METHODS)} weights of 4 or 8 bits (set torch_dtype "
                        "and remove quantization_config to price the model unquantized)")


def _quant_info(qc: Any) -> tuple[str | None, float | None, bool]:
    """(format, bytes per quantized weight with its scales, whether whole attention blocks
    stay unquantized) of a ``quantization_config`` value; (None, None, False) without one.

    The format is a name of :data:`servesim.geometry.WEIGHT_QUANT`. A method, a width or a
    mix of schemes servesim cannot size raises :class:`CatalogError`: pricing such weights
    as the model dtype would be a silent guess.
    """
    if qc is None:
        return None, None, False
    if not isinstance(qc, Mapping):
        raise _unsized(f"is {type(qc).__name__} {qc!r:.40}, not a table")
    skipped = [m for key in ("ignore", "modules_to_not_convert", "exclude_modules")
               for m in _module_list(qc, key)]
    # "model.layers.*.self_attn", "re:.*self_attn.*": every layer's block, not one of its
    # norms ("...self_attn.kv_a_layernorm") nor one layer's ("model.layers.61.self_attn")
    keeps_attention = any(
        m.removeprefix("re:").rstrip(".*").endswith("attn") and not _ONE_LAYER.search(m)
        for m in skipped)
    label, nbytes = _quant_format(qc)
    return label, nbytes, keeps_attention


def _module_list(qc: Mapping[str, Any], key: str) -> list[str]:
    value = qc.get(key)
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(m, str) for m in value):
        raise _unsized(f"{key} must be a list of module names, got {value!r:.40}")
    return value


def _group_scale(value: Any, key: str, scale_bytes: int) -> float:
    """Bytes per weight of one scale per ``value`` weights (-1 / unset: one per channel)."""
    if value is None or value == -1:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _unsized(f"{key} must be a positive integer or -1, got {value!r:.20}")
    return scale_bytes / value


def _quant_format(qc: Mapping[str, Any]) -> tuple[str, float]:
    method = str(qc.get("quant_method", "")).lower()
    fmt = str(qc.get("fmt", qc.get("format", ""))).lower()
    if method == "fp8" or (not method and fmt in ("e4m3", "float8_e4m3fn", "e5m2")):
        return "fp8", 1.0
    if method == "mxfp4" or (method in ("", "compressed-tensors") and "mxfp4" in fmt):
        return "mxfp4", 0.5 + 1 / 32  # 4-bit values + one uint8 scale per 32 weights
    if method in ("gptq", "awq"):  # integer weights, one fp16 scale per group
        bits = qc.get("bits") if qc.get("bits") is not None else qc.get("w_bit")
        group = "group_size" if "group_size" in qc else "q_group_size"
        scale = _group_scale(qc.get(group, 128), group, 2)
        if bits == 4:
            return "int4", 0.5 + scale
        if bits == 8:
            return "w8a16", 1.0 + scale
        raise _unsized(f"{method} with bits = {bits!r:.20}")
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        if algo.startswith("FP8"):
            return "fp8", 1.0
        if algo == "NVFP4":
            return "nvfp4", 0.5 + 1 / 16  # one fp8 scale per 16 weights
        raise _unsized(f"modelopt with quant_algo = {algo!r:.30}")
    if method != "compressed-tensors":
        raise _unsized(f"quant_method {method!r:.40}")
    groups = qc.get("config_groups")
    schemes = {scheme for group in (groups.values() if isinstance(groups, Mapping) else ())
               if (scheme := _scheme(group)) is not None}
    if not schemes:
        raise _unsized("compressed-tensors without a weights scheme in config_groups")
    if len(schemes) > 1:
        names = ", ".join(sorted(name for name, _ in schemes))
        raise _unsized(f"compressed-tensors mixes weight schemes ({names}) across "
                       "config_groups")
    return schemes.pop()


def _scheme(group: Any) -> tuple[str, float] | None:
    """One compressed-tensors config group's (format, bytes per weight), if it has weights."""
    weights = group.get("weights") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping):
        return None
    bits, kind = weights.get("num_bits"), str(weights.get("type", "int"))
    weight_only = group.get("input_activations") is None
    if kind == "float":  # FP8, or FP4 with one fp8 scale per group (NVFP4: 16 weights)
        if bits == 8:
            return "fp8", 1.0
        if bits == 4:
            return "nvfp4", 0.5 + _group_scale(weights.get("group_size"), "group_size", 1)
    elif bits in (4, 8):  # integers with one fp16 scale per group
        scale = _group_scale(weights.get("group_size"), "group_size", 2)
        if bits == 4:
            return "int4", 0.5 + scale
        return ("w8a16" if weight_only else "int8"), 1.0 + scale
    raise _unsized(f"compressed-tensors {kind} weights of {bits!r:.20} bits")


def _layer_kinds(
    name: str, cfg: Mapping[str, Any], num_layers: int, linear: LinearAttention | None
) -> tuple[tuple[MixerKind, ...], tuple[MlpKind, ...] | None]:
    """Per-layer mixer kinds (and MLP kinds when the config dictates them)."""
    pattern = cfg.get("hybrid_override_pattern")
    if pattern is not None:
        mixer_map: dict[str, MixerKind] = {
            "M": "mamba2",
            "*": "full_attention",
            "E": "none",
            "-": "none",
        }
        mlp_map: dict[str, MlpKind] = {"M": "none", "*": "none", "E": "moe", "-": "dense"}
        if not isinstance(pattern, str) or len(pattern) != num_layers or any(
                ch not in mixer_map for ch in pattern):
            raise CatalogError(f"config.json: hybrid_override_pattern must be a string of one "
                               f"of M, *, E, - per layer ({num_layers}), got {pattern!r:.60}")
        return tuple(mixer_map[ch] for ch in pattern), tuple(mlp_map[ch] for ch in pattern)

    lac = cfg.get("linear_attn_config")
    if isinstance(lac, Mapping) and linear is not None:
        full = _indices(lac, "full_attn_layers", num_layers)
        kda = _indices(lac, "kda_layers", num_layers)
        indices = full + kda
        one_based = bool(indices) and 0 not in indices  # vLLM: layer_idx + 1 in kda_layers
        offset = 1 if one_based else 0
        kda_set = {i - offset for i in kda}
        # layers listed in neither set are treated as full attention
        kinds: list[MixerKind] = [
            "kda" if i in kda_set else "full_attention" for i in range(num_layers)
        ]
        return tuple(kinds), None

    layer_types = cfg.get("layer_types")
    if layer_types is not None:
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise CatalogError(f"config.json: 'layer_types' must be a list of the "
                               f"{num_layers} layers' types")
        out: list[MixerKind] = []
        for lt in layer_types:
            if lt == "full_attention":
                out.append("full_attention")
            elif lt == "sliding_attention":
                out.append("sliding_attention")
            elif lt == "linear_attention" and linear is not None:
                out.append(linear.kind)
            else:
                raise CatalogError(f"model {name!r}: unsupported layer type {lt!r}")
        return tuple(out), None

    if linear is not None and linear.kind == "gdn":
        interval = _int(cfg, "full_attention_interval", default=4, lo=1) or 4
        return (
            tuple(
                "full_attention" if (i + 1) % interval == 0 else "gdn" for i in range(num_layers)
            ),
            None,
        )
    return tuple("full_attention" for _ in range(num_layers)), None


def _dtype_name(value: Any, key: str) -> str | None:
    """``value`` (the config's ``key``) if it names a dtype servesim knows, None if unset."""
    if value is not None and not (isinstance(value, str) and dtype_name_bytes(value)):
        raise CatalogError(f"config.json: {key} {value!r:.40} is not a dtype servesim knows "
                           f"({', '.join(sorted(_DTYPE_BYTES))})")
    return value


def _linear_attention(name: str, cfg: Mapping[str, Any]) -> LinearAttention | None:
    """The recurrent layers' state geometry (every size required, >= 1), or None."""
    lac = cfg.get("linear_attn_config")
    if lac is not None and not isinstance(lac, Mapping):
        raise CatalogError(f"config.json: linear_attn_config must be a table, got {lac!r:.40}")
    if isinstance(lac, Mapping) and lac.get("kda_layers"):
        heads = _req_int(name, lac, "num_heads")
        dim = _req_int(name, lac, "head_dim")
        return LinearAttention(
            kind="kda",
            num_key_heads=heads,
            num_value_heads=heads,
            key_head_dim=dim,
            value_head_dim=dim,
            conv_kernel=_int(lac, "short_conv_kernel_size", default=4, lo=1) or 4,
            ssm_dtype="float32",  # KDA recurrent state is always fp32
        )
    if "linear_num_value_heads" in cfg:
        ssm = _dtype_name(cfg.get("mamba_ssm_dtype"), "mamba_ssm_dtype")
        return LinearAttention(
            kind="gdn",
            num_key_heads=_req_int(name, cfg, "linear_num_key_heads"),
            num_value_heads=_req_int(name, cfg, "linear_num_value_heads"),
            key_head_dim=_req_int(name, cfg, "linear_key_head_dim"),
            value_head_dim=_req_int(name, cfg, "linear_value_head_dim"),
            conv_kernel=_int(cfg, "linear_conv_kernel_dim", default=4, lo=1) or 4,
            ssm_dtype=ssm,
        )
    if "mamba_num_heads" in cfg:
        ssm = _dtype_name(cfg.get("mamba_ssm_cache_dtype"), "mamba_ssm_cache_dtype")
        return LinearAttention(
            kind="mamba2",
            num_key_heads=_int(cfg, "n_groups", default=1, lo=1) or 1,
            num_value_heads=_req_int(name, cfg, "mamba_num_heads"),
            key_head_dim=_req_int(name, cfg, "ssm_state_size"),
            value_head_dim=_req_int(name, cfg, "mamba_head_dim"),
            conv_kernel=_int(cfg, "conv_kernel", default=4, lo=1) or 4,
            ssm_dtype=ssm,
        )
    return None


@attrs.frozen
class ModelInfo:
    """Normalised language-model shape read from a HF ``config.json``.

    ``config`` is the raw dict (treat as read-only); for multimodal configs carrying a
    ``text_config`` (Kimi K3, Kimi K2.5, Qwen3.5) the fields below come from ``text_config``.
    ``dtype_bytes`` is the activation/KV dtype (``torch_dtype``/``dtype``, default 2);
    ``weight_quant`` is the ``quantization_config``'s format (a name of
    :data:`servesim.geometry.WEIGHT_QUANT`; None: unquantized) and ``expert_weight_dtype_bytes``
    the routed experts' bytes per weight in it. ``weight_dtype_bytes`` is the other weights':
    the same, unless the checkpoint keeps its attention unquantized (Kimi K2.5's INT4 and
    gpt-oss's MXFP4 quantize the routed experts only). Layer indices are 0-based.
    """

    name: str
    config: dict[str, Any] = attrs.field(repr=False)
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    intermediate_size: int | None
    dtype_name: str | None
    dtype_bytes: int
    weight_quant: str | None
    weight_dtype_bytes: float
    expert_weight_dtype_bytes: float
    tie_word_embeddings: bool
    # MLA (None unless the model uses multi-head latent attention)
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    qk_nope_head_dim: int | None
    v_head_dim: int | None
    q_lora_rank: int | None
    # MoE (num_experts 0 for dense models)
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: int | None
    num_shared_experts: int
    shared_expert_intermediate_size: int
    first_dense_layers: int
    expert_hidden_size: int | None
    # per-layer layout
    layer_types: tuple[MixerKind, ...]
    mlp_types: tuple[MlpKind, ...]
    linear_attention: LinearAttention | None
    mlp_gated: bool
    attn_output_gate: bool

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> ModelInfo:
        """Build from a parsed ``config.json`` dict; raises CatalogError on missing shapes."""
        raw = dict(config)
        tc = raw.get("text_config")
        lm: dict[str, Any] = dict(tc) if isinstance(tc, Mapping) else raw

        num_layers = _req_int(name, lm, "num_hidden_layers", "n_layer", "num_layers",
                              hi=MAX_LAYERS)
        hidden = _req_int(name, lm, "hidden_size", "d_model", "n_embd")
        heads = _req_int(name, lm, "num_attention_heads", "n_head")
        kv_heads = _int(lm, "num_key_value_heads", default=heads, lo=1) or heads
        if heads % kv_heads:
            raise CatalogError(f"config.json: num_key_value_heads ({kv_heads}) must divide "
                               f"num_attention_heads ({heads})")
        head_dim = _int(lm, "head_dim", lo=1) or hidden // heads
        if head_dim < 1:
            raise CatalogError(f"config.json: hidden_size ({hidden}) over num_attention_heads "
                               f"({heads}) leaves no head_dim; set head_dim")
        vocab = _req_int(name, lm, "vocab_size")

        dtype_raw = lm.get("torch_dtype") or lm.get("dtype") or raw.get("torch_dtype")
        dtype_raw = _dtype_name(dtype_raw or raw.get("dtype"), "torch_dtype")
        dtype_name = dtype_raw.removeprefix("torch.") if dtype_raw else None
        dtype_bytes = (dtype_name_bytes(dtype_raw) if dtype_raw else None) or 2  # known

        kv_lora = _int(lm, "kv_lora_rank", lo=1)
        is_mla = kv_lora is not None
        expert_keys = ("num_experts", "n_routed_experts", "num_local_experts")
        counts = {k: v for k in expert_keys if (v := _int(lm, k)) is not None}
        if len(set(counts.values())) > 1:
            raise CatalogError("config.json: the routed experts are counted twice, and "
                               f"differently ({', '.join(f'{k} = {v}' for k, v in counts.items())})"
                               "; keep one")
        num_experts = next(iter(counts.values()), 0)
        topk = _int(lm, "num_experts_per_tok", "experts_per_token", "num_experts_per_token") or 0
        if num_experts and not 1 <= topk <= num_experts:
            raise CatalogError(f"config.json: a token's experts (num_experts_per_tok, {topk}) "
                               f"must be from 1 to the routed experts ({num_experts})")
        qc = lm.get("quantization_config") or raw.get("quantization_config")
        quant, quant_bytes, keeps_attention = _quant_info(qc)
        weight_bytes = expert_bytes = float(dtype_bytes)
        if quant_bytes is not None:
            expert_bytes = min(expert_bytes, quant_bytes)
            if not (num_experts and keeps_attention):  # else only the routed experts
                weight_bytes = expert_bytes
        inter = _int(lm, "intermediate_size")
        moe_inter = _int(lm, "moe_intermediate_size")
        if num_experts and moe_inter is None:
            moe_inter = inter  # Mixtral / gpt-oss / MiniMax: intermediate_size is the expert width
        n_shared = _int(lm, "n_shared_experts", "num_shared_experts") or 0
        shared_width = _int(
            lm,
            "shared_expert_intermediate_size",
            "moe_shared_expert_intermediate_size",
            "shared_intermediate_size",
        )
        if shared_width is None:
            shared_width = n_shared * (moe_inter or 0)
        elif shared_width and not n_shared:
            n_shared = 1
        first_dense = _int(lm, "first_k_dense_replace", default=0, hi=num_layers) or 0

        linear = _linear_attention(name, lm)
        layer_types, mlp_from_pattern = _layer_kinds(name, lm, num_layers, linear)
        if mlp_from_pattern is not None:
            mlp_types = mlp_from_pattern
        elif num_experts:
            dense_only = set(_indices(lm, "mlp_only_layers", num_layers))
            step = _int(lm, "decoder_sparse_step", "moe_layer_freq", default=1) or 1
            mlp_types = tuple(
                "dense" if i < first_dense or i in dense_only or (i + 1) % step else "moe"
                for i in range(num_layers)
            )
        else:
            mlp_types = tuple("dense" for _ in range(num_layers))

        if not any(k in ATTENTION_KINDS for k in layer_types):
            raise CatalogError(f"model {name!r}: none of its {num_layers} layers is an attention "
                               "layer holding a KV cache; servesim runs only models with one")
        if "dense" in mlp_types and not inter:
            raise CatalogError("config.json: the dense MLP layers need intermediate_size (an "
                               "integer from 1)")
        if "moe" in mlp_types and not (num_experts and moe_inter):
            raise CatalogError("config.json: the MoE layers need routed experts (num_experts / "
                               "n_routed_experts) and their width (moe_intermediate_size)")
        for key in ("sliding_window", "index_topk", "index_n_heads", "index_head_dim"):
            _int(lm, key, lo=1)  # read where they are priced; a value set must be a size
        act = lm.get("mlp_hidden_act") or lm.get("hidden_act") or "silu"
        if not isinstance(act, str):
            raise CatalogError(f"config.json: hidden_act must be a name, got {act!r:.40}")
        return cls(
            name=name,
            config=raw,
            model_type=str(lm.get("model_type") or raw.get("model_type") or "unknown"),
            num_layers=num_layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            vocab_size=vocab,
            max_position_embeddings=_int(lm, "max_position_embeddings"),
            intermediate_size=inter,
            dtype_name=dtype_name,
            dtype_bytes=dtype_bytes,
            weight_quant=quant,
            weight_dtype_bytes=weight_bytes,
            expert_weight_dtype_bytes=expert_bytes,
            tie_word_embeddings=_bool(lm, "tie_word_embeddings",
                                      _bool(raw, "tie_word_embeddings")),
            kv_lora_rank=kv_lora,
            # MLA: the latent's rope part and the heads it expands to are what it prices
            qk_rope_head_dim=_req_int(name, lm, "qk_rope_head_dim") if is_mla else None,
            qk_nope_head_dim=_req_int(name, lm, "qk_nope_head_dim") if is_mla else None,
            v_head_dim=_req_int(name, lm, "v_head_dim") if is_mla else None,
            q_lora_rank=_int(lm, "q_lora_rank") if is_mla else None,
            num_experts=num_experts,
            experts_per_token=topk,
            moe_intermediate_size=moe_inter if num_experts else None,
            num_shared_experts=n_shared if num_experts else 0,
            shared_expert_intermediate_size=shared_width if num_experts else 0,
            first_dense_layers=first_dense if num_experts else 0,
            expert_hidden_size=(_int(lm, "routed_expert_hidden_size") or hidden)
            if num_experts
            else None,
            layer_types=layer_types,
            mlp_types=mlp_types,
            linear_attention=linear,
            mlp_gated=act not in ("relu2",),
            attn_output_gate=_bool(lm, "attn_output_gate"),
        )

    @property
    def lm_config(self) -> dict[str, Any]:
        """The language-model part of ``config`` (``text_config`` when present)."""
        tc = self.config.get("text_config")
        return tc if isinstance(tc, dict) else self.config

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_hybrid(self) -> bool:
        """True when some layers keep recurrent state (KDA, GDN, Mamba2)."""
        return any(k in RECURRENT_KINDS for k in self.layer_types)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Indices of layers holding a token KV cache (full or sliding attention)."""
        return tuple(i for i, k in enumerate(self.layer_types) if k in ATTENTION_KINDS)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_types) if k == "full_attention")

    @property
    def state_layers(self) -> tuple[int, ...]:
        """Indices of recurrent-state layers (KDA, GDN, Mamba2)."""
        return tuple(i for i, k in enumerate(self.layer_types) if k in RECURRENT_KINDS)

    @property
    def num_moe_layers(self) -> int:
        return sum(1 for k in self.mlp_types if k == "moe")


@attrs.frozen
class GpuSpec:
    """One GPU (and its node) from the aiconfigurator systems format; units are B, B/s, FLOP/s."""

    name: str
    mem_capacity_bytes: int
    mem_bw: float
    mem_bw_efficiency: float
    mem_constant_latency_s: float
    bf16_flops: float
    fp8_flops: float | None
    fp4_flops: float | None
    int8_flops: float | None
    # exponentials per second of the special function units (attention's softmax)
    exp_per_s: float | None
    # weight bytes per second the SMs dequantise in weight-only (w4a16) GEMMs
    w4a16_bytes_per_s: float | None
    intra_node_bw: float
    inter_node_bw: float
    pcie_bw: float | None
    p2p_latency_s: float | None
    num_gpus_per_node: int
    nccl_mem: dict[int, int]
    other_mem: int
    power: float
    sm_version: int | None
    raw: dict[str, Any] = attrs.field(repr=False)

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> GpuSpec:
        """Build from the systems-format dict (``gpu``/``node``/``misc`` sections)."""
        gpu = data.get("gpu") or {}
        node = data.get("node") or {}
        misc = data.get("misc") or {}

        def num(section: Mapping[str, Any], key: str) -> float | None:
            value = section.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        def need(section: Mapping[str, Any], key: str) -> float:
            value = num(section, key)
            if value is None:
                raise CatalogError(f"gpu {name!r}: missing numeric {key}")
            return value

        nccl = {int(k): int(v) for k, v in (misc.get("nccl_mem") or {}).items()}
        sm = gpu.get("sm_version")
        return cls(
            name=name,
            mem_capacity_bytes=int(need(gpu, "mem_capacity")),
            mem_bw=need(gpu, "mem_bw"),
            mem_bw_efficiency=num(gpu, "mem_bw_empirical_scaling_factor") or 1.0,
            mem_constant_latency_s=num(gpu, "mem_empirical_constant_latency") or 0.0,
            bf16_flops=need(gpu, "bfloat16_tc_flops"),
            fp8_flops=num(gpu, "fp8_tc_flops"),
            fp4_flops=num(gpu, "fp4_tc_flops"),
            int8_flops=num(gpu, "int8_tc_flops"),
            exp_per_s=num(gpu, "exp_per_s"),
            w4a16_bytes_per_s=num(gpu, "w4a16_bytes_per_s"),
            intra_node_bw=need(node, "intra_node_bw"),
            inter_node_bw=need(node, "inter_node_bw"),
            pcie_bw=num(node, "pcie_bw"),
            p2p_latency_s=num(node, "p2p_latency"),
            num_gpus_per_node=int(need(node, "num_gpus_per_node")),
            nccl_mem=nccl,
            other_mem=int(num(misc, "other_mem") or 0),
            power=need(gpu, "power"),
            sm_version=int(sm) if isinstance(sm, int) else None,
            raw=dict(data),
        )

    def nccl_mem_for(self, tensor: int) -> int:
        """NCCL buffer bytes for a TP group: the entry for the smallest listed size >= tensor."""
        if tensor <= 1 or not self.nccl_mem:
            return self.nccl_mem.get(1, 0) if tensor <= 1 else 0
        sizes = sorted(self.nccl_mem)
        for size in sizes:
            if size >= tensor:
                return self.nccl_mem[size]
        return self.nccl_mem[sizes[-1]]

    @property
    def mem_capacity_gib(self) -> float:
        return self.mem_capacity_bytes / 2**30


def _resource_dir(kind: str) -> Any:
    return resources.files(__name__).joinpath(kind)


def _file_to_model_name(stem: str) -> str:
    org, sep, rest = stem.partition("--")
    return f"{org}/{rest}" if sep else stem


@functools.lru_cache(maxsize=1)
def _model_files() -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in _resource_dir("models").iterdir():
        if entry.name.endswith(".json"):
            out[_file_to_model_name(entry.name[: -len(".json")])] = entry.name
    return dict(sorted(out.items()))


@functools.lru_cache(maxsize=1)
def _aliases() -> dict[str, tuple[str, dict[str, Any] | None]]:
    """Alias -> (the shipped config it loads, the quantization_config it sets or None)."""
    text = _resource_dir("aliases.json").read_text(encoding="utf-8")
    out: dict[str, tuple[str, dict[str, Any] | None]] = {}
    for alias, target in _parse_json(text, "aliases.json")["aliases"].items():
        if isinstance(target, str):
            out[alias] = (target, None)
        else:
            out[alias] = (target["config"], target["quantization_config"])
    return out


@functools.lru_cache(maxsize=1)
def _gpu_files() -> dict[str, str]:
    out: dict[str, str] = {}
    for entry in _resource_dir("hardware").iterdir():
        if entry.name.endswith(".json"):
            out[entry.name[: -len(".json")]] = entry.name
    return dict(sorted(out.items()))


def model_names() -> list[str]:
    """HF ids of the shipped model configs, sorted."""
    return list(_model_files())


def model_aliases() -> dict[str, str]:
    """Other HF ids of shipped architectures (Instruct and renamed releases), sorted: alias
    -> the shipped config it loads. An alias keeps its own precision (an FP8 release sets
    its quantization; a BF16 one never loads an FP8 config)."""
    return {alias: target for alias, (target, _) in sorted(_aliases().items())}


@functools.lru_cache(maxsize=1)
def _folded_ids() -> dict[str, str]:
    return {name.lower(): name for name in [*_model_files(), *_aliases()]}


def catalog_id(name: str) -> str | None:
    """The shipped name or alias ``name`` spells (letter case aside, as on the Hub), or
    None."""
    return _folded_ids().get(name.lower())


def gpu_names() -> list[str]:
    """Names of the shipped GPU specs, sorted."""
    return list(_gpu_files())


_PRECISION = re.compile(r"(?<![a-z0-9])(fp8|nvfp4|mxfp4|fp4|int4|int8|w4a16|w8a8|awq|gptq)"
                        r"(?![a-z0-9])")


def _precision(name: str) -> str | None:
    """The weight format a model name announces (``-FP8``, ``-NVFP4`` ...), if any."""
    found = _PRECISION.search(name.lower())
    return found.group(1) if found else None


def _closest(name: str, known: list[str], *, precision: bool = False) -> list[str]:
    """Up to three of ``known`` that look like ``name``; with ``precision``, a name that
    announces another weight format than ``name`` ranks lower (a BF16 id is not offered an
    FP8 checkpoint first)."""
    query = name.lower()
    query_base = query.rsplit("/", 1)[-1]
    wanted = _precision(name)

    def score(candidate: str) -> float:
        cand = candidate.lower()
        full = difflib.SequenceMatcher(None, query, cand).ratio()
        base = difflib.SequenceMatcher(None, query_base, cand.rsplit("/", 1)[-1]).ratio()
        prefix = cand.startswith(query) or cand.rsplit("/", 1)[-1].startswith(query_base)
        other_format = precision and _precision(candidate) != wanted
        return max(full, base) + (0.25 if prefix else 0.0) - (0.3 if other_format else 0.0)

    ranked = sorted(((score(k), k) for k in known), key=lambda item: -item[0])
    return [k for s, k in ranked[:3] if s >= 0.6]


def _unknown_model(name: str, why: str | None = None) -> CatalogError:
    """An unknown model id: the closest shipped names, and how to make it known."""
    known = [*model_names(), *_aliases()]
    close = _closest(name, known, precision=True)
    message = f"unknown model {name!r}; " + (
        f"closest known: {', '.join(close)}" if close
        else f"servesim models lists the {len(known)} known ids")
    if not hub.is_repo_id(name):
        return CatalogError(f"{message}. Name a folder holding its config.json, or a "
                            "Hugging Face model id (org/name)")
    return CatalogError(
        f"{message}. It is not in the local Hugging Face cache (HF_HUB_CACHE) either"
        f"{f'; {why}' if why else ''}. Name a folder holding its config.json, or fetch its "
        f"config into the cache: huggingface-cli download {name} config.json")


def _parse_json(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{where}: invalid JSON ({exc})") from None
    except (RecursionError, ValueError) as exc:  # nested too deep; an integer too long
        raise CatalogError(f"{where}: invalid JSON ({str(exc).split(':')[0]})") from None
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: expected a JSON object")
    return data


def _with_hf_quant(config: dict[str, Any], hf_quant: Mapping[str, Any],
                   where: str) -> dict[str, Any]:
    """``config`` with the quantization of a ModelOpt ``hf_quant_config.json`` when it sets
    none itself, as vLLM reads such a checkpoint."""
    tc = config.get("text_config")
    if config.get("quantization_config") is not None or (
            isinstance(tc, Mapping) and tc.get("quantization_config") is not None):
        return config
    quant = hf_quant.get("quantization")
    if not isinstance(quant, Mapping):
        raise CatalogError(f"{where}: 'quantization' must be a table, got {quant!r:.40}")
    return {**config, "quantization_config": {"quant_method": "modelopt", **quant}}


@functools.lru_cache(maxsize=64)
def _load_catalog_model(name: str) -> ModelInfo:
    """A shipped config (or an alias's: its target, with the alias's quantization)."""
    target, quantization = _aliases().get(name, (name, None))
    file = _model_files()[target]
    config = _parse_json(_resource_dir("models").joinpath(file).read_text(encoding="utf-8"),
                         f"model {target!r}")
    quant_file = _resource_dir("quant").joinpath(file)
    if quant_file.is_file():
        config = _with_hf_quant(config, _parse_json(
            quant_file.read_text(encoding="utf-8"), f"model {target!r} hf_quant_config.json"),
            f"model {target!r} hf_quant_config.json")
    if quantization is not None:
        config = {**config, "quantization_config": quantization}
    return ModelInfo.from_config(name, config)


def _read_config_file(path: Path, required: bool) -> dict[str, Any] | None:
    try:
        text = read_bounded(path, f"a model's {path.name}", MAX_MODEL_CONFIG_BYTES).decode(
            "utf-8-sig")
    except Unreadable as exc:
        if exc.code == codes.FILE_NOT_FOUND and not required:
            return None
        if exc.code == codes.FILE_NOT_FOUND:
            raise ModelConfigError(f"model directory {str(path.parent)!r} has no "
                                   f"{path.name}") from None
        raise ModelConfigError(f"cannot read {path}: {exc.message}") from None
    except UnicodeDecodeError as exc:
        raise ModelConfigError(f"cannot read {path}: not UTF-8 text (byte {exc.start})"
                               ) from None
    try:
        return _parse_json(text, str(path))
    except CatalogError as exc:
        raise ModelConfigError(str(exc)) from None


def _load_folder(name: str, folder: Path) -> ModelInfo:
    """A model folder's ``config.json`` (and ``hf_quant_config.json``, if there)."""
    config = _read_config_file(folder / "config.json", required=True)
    assert config is not None
    hf_quant = _read_config_file(folder / "hf_quant_config.json", required=False)
    try:
        if hf_quant is not None:
            config = _with_hf_quant(config, hf_quant, str(folder / "hf_quant_config.json"))
        return ModelInfo.from_config(name, config)
    except CatalogError as exc:
        raise ModelConfigError(str(exc)) from None


def error_code(exc: CatalogError, kind: Literal["model", "hardware"]) -> str:
    """The diagnostic code of a model or GPU ``load_model``/``load_gpu`` refused."""
    if isinstance(exc, ModelConfigError):
        return codes.BAD_MODEL_CONFIG
    return codes.UNKNOWN_MODEL if kind == "model" else codes.UNKNOWN_HARDWARE


def load_model(name: str) -> ModelInfo:
    """A model's shape. ``name`` is looked up, in this order, as:

    1. a local folder holding ``config.json`` (and ``hf_quant_config.json``, if any);
    2. a shipped config or an alias of one (:func:`model_names`, :func:`model_aliases`;
       letter case aside);
    3. a Hugging Face id (``org/name``) in the local hub cache (:func:`hub.cache_dir`);
    4. a Hugging Face id whose config files are downloaded from the Hub into that cache
       (with ``huggingface_hub`` installed, online, ``HF_HUB_OFFLINE`` unset).

    Shipped configs are read once; folders and the cache are read at every call (the
    environment that names them may change).
    """
    try:
        path = Path(name).expanduser()
        is_dir, exists = path.is_dir(), path.exists()
    except (OSError, RuntimeError, ValueError):  # too long for a path, "~someone" unknown
        is_dir = exists = False
    if is_dir:
        return _load_folder(name, path)
    known = catalog_id(name)
    if known is not None:
        return _load_catalog_model(known)
    if exists:
        raise CatalogError(f"model path {name!r} is not a directory holding config.json")
    if not hub.is_repo_id(name):
        raise _unknown_model(name)
    snapshot = hub.cached_snapshot(name)
    if snapshot is None:
        try:
            snapshot = hub.download(name)
        except hub.HubError as exc:
            raise _unknown_model(name, exc.message) from None
    return _load_folder(name, snapshot)


@functools.lru_cache(maxsize=32)
def load_gpu(name: str) -> GpuSpec:
    """Load a shipped GPU spec by name (e.g. ``h200_sxm``)."""
    files = _gpu_files()
    if name not in files:
        close = _closest(name, list(files))
        raise CatalogError(f"unknown gpu {name!r}; " + (
            f"closest known: {', '.join(close)}" if close else f"known: {', '.join(files)}"))
    text = _resource_dir("hardware").joinpath(files[name]).read_text(encoding="utf-8")
    return GpuSpec.from_dict(name, _parse_json(text, f"gpu {name!r}"))
