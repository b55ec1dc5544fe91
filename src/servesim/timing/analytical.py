"""``timing.type = "default"``: an analytical step-time model of one scheduler pass.

The model prices one forward pass of the role's model on one GPU of its deployment as a
per-layer roofline (every operator costs ``max(flops / (peak * u_c), bytes / (bw * u_m))``)
plus communication and fixed overheads:

- **GEMMs** (attention / linear-attention projections, dense MLP, shared experts, LM head):
  weights are read once per pass whatever the number of tokens; FLOPs are ``2 * weights * T``.
- **Routed experts**: compute for ``T * k`` token-expert pairs (balanced over expert-parallel
  ranks); weight traffic only for the experts actually touched,
  ``E * (1 - (1 - k/E) ** T)`` under uniform routing. With attention data parallelism the
  experts see the tokens of every rank. Each token-expert pair's hidden-size activations
  are also moved through memory several times (permuted into the experts' layout, read by
  the grouped GEMMs, written back and combined): a fitted number of copies per pair on
  the GPU that computes it, so tensor-sharded experts move every pair on every GPU and
  expert-sharded ones only their own.
- **Attention**: decode reads every cached token's KV once per layer (MLA reads the latent);
  prefill carries the causal quadratic term ``((s + p)**2 - p**2) / 2`` query-key pairs per
  chunk of ``s`` new tokens after ``p`` cached ones; sliding-window layers cap the context.
  Sparse attention (DeepSeek sparse attention: GLM-5, DeepSeek-V3.2) caps each query's
  reads at the ``index_topk`` tokens its indexer picks, and the indexer reads and scores
  every cached token's FP8 key (and launches a layer's worth of kernels per pass).
- **Linear attention / Mamba** layers read and write each request's recurrent state
  (plus per-chunk states during prefill).
- **Communication**: two all-reduces per layer under tensor parallelism, dispatch/combine
  all-to-all under expert parallelism, one point-to-point hop per pipeline boundary.
  Beyond its latency, a collective reaches a fraction of the link bandwidth that grows
  with its message: measured custom all-reduces on H100 and B200 reach 20% of the ring
  bound at 128 KB, 40% at 1 MB and 65% at 16 MB; NCCL's large messages come closer.
- **Speculative decoding**: a decode pass is the verification forward of each request's
  drafts, so it computes ``1 + drafts`` tokens per request through the GEMMs, experts and
  collectives, as many attention queries over a context whose KV is read once. Drafting
  itself is not priced (the replay's sampler has no draft model).
- **Overheads**: per pass, per layer, per MoE layer, per MLA layer, per decoding request
  and per prefilling request; these are backend (software-stack) constants. An MoE layer runs
  more kernels than a dense one (router, top-k, token permutation, grouped GEMMs and their
  un-permutation), so it costs more per pass whatever its tokens; so does an MLA layer
  (query and latent down-projections and their norms, the rope / no-rope split, the
  latent's up-projection or absorption) over a grouped-query one. Each routed expert a
  layer touches also costs a fixed time (a grouped-GEMM tile per expert, whatever its few
  tokens).
- **Request latency outside the GPU** (:meth:`AnalyticalTimer.request_ms`): the serving
  front end's HTTP handling, tokenisation and detokenisation, per request, per prompt
  token and per layer (the CPU set-up of a new request's prefill, which scales with the
  layers to dispatch, an MoE or MLA layer's more kernels costing more). The engines admit a
  request to the scheduler that long after its arrival, so it adds to TTFT and E2E but
  does not occupy the GPU and is not part of any pass price.

Efficiencies ``u_c``/``u_m`` are interpolated curves of the operator size (tokens per GEMM,
bytes per layer, prompt length), shaped from published measurements and scaled by a few
fitted constants shipped in ``timing/data/analytical_constants.json`` (among them each
weight dtype's kernel efficiency relative to bf16, for dense and for expert GEMMs). FP8
GEMMs have a curve of their own: in aiconfigurator's measured H100 tables (n = k = 8192)
bf16 kernels fall from 82% of their peak at 1,024 tokens to 68% at 16,384 while fp8 ones
hold 62-73%. So the fp8 curve is the bf16 one up to 1,024 tokens, where the measured
ratio is flat (0.76-0.77) and the fitted fp8 level carries it, and rises with the measured
ratio beyond (x1.06 at 4,096 tokens, x1.4 at 16,384). The
formulas are the same on every GPU: only the GPU's datasheet numbers (peak FLOPs per
dtype, memory bandwidth, links) change.

Everything that does not depend on the batch is computed once when the timer is built;
:meth:`AnalyticalTimer.prefill_ms` and :meth:`AnalyticalTimer.decode_ms` are O(1).

How a pass is split between the two calls: a scheduler prices the prefill half and the
decode half of one pass separately, but on the GPU they are one forward pass that reads
the weights once. For roles that decode (``aggregated``, ``decode``) ``decode_ms`` is the
full forward of the decode tokens (weights, KV reads, per-pass overheads) and
``prefill_ms`` is the *marginal* cost the prompt tokens add to that forward (compute above
the weight-read floor, attention, communication bandwidth, per-prompt overhead). A
``prefill`` role never decodes, and SGLang never mixes prompt work with decode steps in
one pass, so there ``prefill_ms`` is a whole forward pass.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import attrs

from servesim import backends, codes
from servesim.backends import Backend
from servesim.catalog import (
    CatalogError,
    GpuSpec,
    ModelInfo,
    load_gpu,
    load_model,
)
from servesim.errors import Diagnostic, ReplayError
from servesim.geometry import (
    WEIGHT_QUANT,
    GeometryError,
    parameter_count,
    unpriced_weight_quant,
)
from servesim.geometry import kv_bytes_per_token as _kv_bytes_per_token
from servesim.payload import RoleArgs
from servesim.timing.decode_price import DecodePrice, curve_at

__all__ = [
    "AnalyticalConstants",
    "AnalyticalTimer",
    "BackendOverheads",
    "Curve",
    "StepGeometry",
    "build_geometry",
    "load_constants",
    "timer_from_role",
]

CONSTANTS_RESOURCE = "analytical_constants.json"
ACT_BYTES = 2  # activations and all-reduce payloads travel in bf16
LINEAR_CHUNK = 64  # tokens per chunk of chunked linear-attention / SSM prefill kernels

# ---------------------------------------------------------------------------------------------
# Curves and constants


@attrs.frozen
class Curve:
    """Piecewise-linear function of ``log2(x)`` through ``points``, clamped at both ends."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    _lx: tuple[float, ...] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("a curve needs as many x as y values, at least one")
        if any(x <= 0 for x in self.xs) or list(self.xs) != sorted(set(self.xs)):
            raise ValueError("curve x values must be positive and strictly increasing")
        if any(not y > 0 for y in self.ys):
            raise ValueError("curve y values must be positive")
        object.__setattr__(self, "_lx", tuple(math.log2(x) for x in self.xs))

    @classmethod
    def from_points(cls, points: Sequence[Sequence[float]]) -> Curve:
        return cls(tuple(float(p[0]) for p in points), tuple(float(p[1]) for p in points))

    def __call__(self, x: float) -> float:
        return curve_at(self.xs, self.ys, self._lx, x)

    def scaled(self, factor: float) -> Curve:
        return Curve(self.xs, tuple(min(1.0, y * factor) for y in self.ys))


@attrs.frozen
class BackendOverheads:
    """Software-stack costs that are not GPU work (ms / µs as named)."""

    step_ms: float  # per forward pass: scheduler, sampler, launch of the graph
    layer_us: float  # per layer per forward pass: kernel launches and gaps
    decode_req_us: float  # per decoding request per pass: sampling, detokenisation, bookkeeping
    prefill_req_ms: float  # per prefilling request per pass: input preparation, metadata
    prefill_layer_us: float  # per layer, extra in a pass that carries prompt tokens
    # front end, outside the passes (see AnalyticalTimer.request_ms)
    request_ms: float = 0.0  # per request: HTTP, scheduling hand-off, first-token return
    request_us_per_token: float = 0.0  # per prompt token: tokenisation
    request_layer_us: float = 0.0  # per layer: CPU set-up of a new request's prefill
    # per MoE layer, beyond layer_us per forward pass and beyond request_layer_us per
    # request: the MoE block's extra kernels (router, top-k, permutation, grouped GEMMs)
    moe_layer_us: float = 0.0
    request_moe_layer_us: float = 0.0
    # per MLA layer, likewise: multi-head latent attention runs more kernels than
    # grouped-query attention (see the module docstring)
    mla_layer_us: float = 0.0
    request_mla_layer_us: float = 0.0


@attrs.frozen
class AnalyticalConstants:
    """Shipped efficiency curves (shapes) and the fitted scales and overheads."""

    gemm_curve: Curve  # compute efficiency of a bf16 GEMM vs tokens (m)
    # the same for FP8 kernels, before their level: they keep their efficiency at large m
    gemm_fp8_curve: Curve
    moe_curve: Curve  # compute efficiency of a grouped expert GEMM vs tokens per expert
    mem_curve: Curve  # HBM efficiency vs bytes moved by one layer's operator
    prefill_attn_curve_b1: Curve  # causal attention efficiency vs context, one request
    prefill_attn_curve_b16: Curve  # same, sixteen requests or more
    # compute efficiency of each kernel class (bf16, fp8, int8, fp4: see _kernel) relative
    # to bf16's; fp8 and fp4 fitted
    quant_level: Mapping[str, float]
    moe_quant_level: Mapping[str, float]
    decode_attn_compute: float  # compute efficiency of decode attention (rarely binding)
    linear_compute: float  # compute efficiency of linear-attention / SSM kernels
    link_curve: Curve  # achieved fraction of the link bandwidth vs bytes of one collective
    # fitted
    gemm_scale: float
    moe_scale: float
    mem_scale: float
    attn_scale: float
    kv_scale: float
    allreduce_us: float
    backends: Mapping[str, BackendOverheads]
    expert_us: float = 0.0  # per touched routed expert per MoE layer
    moe_act_passes: float = 0.0  # hidden-size activation copies moved per token-expert pair
    # the fraction of a prefill's softmax exponentials not hidden behind its matrix products
    softmax_exposed: float = 0.0
    provenance: Mapping[str, Any] = attrs.field(factory=dict, eq=False)

    def overheads(self, backend: str) -> BackendOverheads:
        found = self.backends.get(backend) or self.backends.get("default")
        if found is None:
            raise KeyError(backend)
        return found

    def with_values(self, **values: float) -> AnalyticalConstants:
        """A copy with some scalar constants replaced (``backend.field`` keys allowed, and
        ``quant_level.<class>`` / ``moe_quant_level.<class>`` for one kernel class's level)."""
        plain: dict[str, Any] = {k: v for k, v in values.items() if "." not in k}
        backends = dict(self.backends)
        levels = {"quant_level": dict(self.quant_level),
                  "moe_quant_level": dict(self.moe_quant_level)}
        for key, value in values.items():
            if "." in key:
                name, field = key.split(".", 1)
                if name in levels:
                    levels[name][field] = value
                    plain[name] = levels[name]
                else:
                    backends[name] = attrs.evolve(backends[name], **{field: value})
        return attrs.evolve(self, backends=backends, **plain)

    def value(self, key: str) -> float:
        """The scalar constant ``key`` names, in :meth:`with_values`' keys."""
        if "." in key:
            name, field = key.split(".", 1)
            if name in ("quant_level", "moe_quant_level"):
                return float(getattr(self, name)[field])
            return float(getattr(self.backends[name], field))
        return float(getattr(self, key))

    def to_json(self) -> dict[str, Any]:
        def curve(c: Curve) -> list[list[float]]:
            return [[x, y] for x, y in zip(c.xs, c.ys, strict=True)]

        return {
            "provenance": dict(self.provenance),
            "curves": {
                "gemm": curve(self.gemm_curve),
                "gemm_fp8": curve(self.gemm_fp8_curve),
                "moe": curve(self.moe_curve),
                "memory": curve(self.mem_curve),
                "prefill_attention_batch1": curve(self.prefill_attn_curve_b1),
                "prefill_attention_batch16": curve(self.prefill_attn_curve_b16),
                "link": curve(self.link_curve),
            },
            "decode_attention_compute": self.decode_attn_compute,
            "linear_attention_compute": self.linear_compute,
            "fitted": {
                "quant_level": dict(self.quant_level),
                "moe_quant_level": dict(self.moe_quant_level),
                "gemm_scale": self.gemm_scale,
                "moe_scale": self.moe_scale,
                "mem_scale": self.mem_scale,
                "attn_scale": self.attn_scale,
                "kv_scale": self.kv_scale,
                "allreduce_us": self.allreduce_us,
                "expert_us": self.expert_us,
                "moe_act_passes": self.moe_act_passes,
                "softmax_exposed": self.softmax_exposed,
                "backends": {k: attrs.asdict(v) for k, v in self.backends.items()},
            },
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AnalyticalConstants:
        curves = data["curves"]
        fitted = data["fitted"]
        return cls(
            gemm_curve=Curve.from_points(curves["gemm"]),
            gemm_fp8_curve=Curve.from_points(curves["gemm_fp8"]),
            moe_curve=Curve.from_points(curves["moe"]),
            mem_curve=Curve.from_points(curves["memory"]),
            prefill_attn_curve_b1=Curve.from_points(curves["prefill_attention_batch1"]),
            prefill_attn_curve_b16=Curve.from_points(curves["prefill_attention_batch16"]),
            link_curve=Curve.from_points(curves["link"]),
            quant_level={str(k): float(v) for k, v in fitted["quant_level"].items()},
            moe_quant_level={str(k): float(v) for k, v in fitted["moe_quant_level"].items()},
            decode_attn_compute=float(data["decode_attention_compute"]),
            linear_compute=float(data["linear_attention_compute"]),
            gemm_scale=float(fitted["gemm_scale"]),
            moe_scale=float(fitted["moe_scale"]),
            mem_scale=float(fitted["mem_scale"]),
            attn_scale=float(fitted["attn_scale"]),
            kv_scale=float(fitted["kv_scale"]),
            allreduce_us=float(fitted["allreduce_us"]),
            expert_us=float(fitted.get("expert_us", 0.0)),
            moe_act_passes=float(fitted.get("moe_act_passes", 0.0)),
            softmax_exposed=float(fitted.get("softmax_exposed", 0.0)),
            backends={
                str(k): BackendOverheads(**{f: float(x) for f, x in v.items()})
                for k, v in fitted["backends"].items()
            },
            provenance=dict(data.get("provenance") or {}),
        )


_CONSTANTS: AnalyticalConstants | None = None


def load_constants() -> AnalyticalConstants:
    """The shipped constants (read once, via importlib.resources)."""
    global _CONSTANTS
    if _CONSTANTS is None:
        text = (
            resources.files("servesim.timing")
            .joinpath("data", CONSTANTS_RESOURCE)
            .read_text(encoding="utf-8")
        )
        _CONSTANTS = AnalyticalConstants.from_json(json.loads(text))
    return _CONSTANTS


# ---------------------------------------------------------------------------------------------
# Batch-independent geometry


@attrs.frozen
class _LayerClass:
    """Layers sharing one (mixer, MLP) shape; all quantities per GPU."""

    count: int
    mixer: str  # full_attention | sliding_attention | kda | gdn | mamba2 | none
    moe: bool
    dense_elems: float  # non-routed GEMM weight elements on this GPU
    dense_bytes: float


@attrs.frozen
class StepGeometry:
    """Everything about the deployment a pass price needs, independent of the batch."""

    model: str
    gpu: str
    backend: str
    worker_type: str
    num_layers: int
    hidden: int
    tensor: int
    pipeline: int
    attention_data: int
    moe_tensor: int
    moe_expert: int
    classes: tuple[_LayerClass, ...]
    # peaks (FLOP/s) and bandwidths (B/s)
    gemm_peak: float
    moe_peak: float
    attn_peak: float
    mem_bw: float
    gemm_quant: str
    moe_quant: str
    # kernel class each GEMM kind runs (see _kernel): its dtype level and curve
    gemm_kernel: str
    moe_kernel: str
    tp_link_bw: float
    ep_link_bw: float
    pp_link_bw: float
    p2p_latency_s: float
    # LM head (per GPU)
    lm_head_elems: float
    lm_head_bytes: float
    # attention (per GPU, per attention layer)
    heads_local: float
    qk_dim: int  # query-key dot width per head (MLA prefill: nope + rope)
    v_dim: int
    decode_score_dim: int  # per cached token and head in decode (MLA absorbed: 2*lora + rope)
    kv_bytes_layer: float  # KV bytes per token per attention layer on this GPU
    sliding_window: int | None
    # routed experts (per GPU)
    experts: int
    topk: int
    expert_elems: float  # one expert's weight elements on this GPU (after moe_tensor)
    expert_bytes: float
    local_experts: float
    # linear attention / SSM (per GPU, per layer)
    state_bytes: float
    linear_flops_per_token: float
    # sparse attention (DeepSeek sparse attention: GLM-5, DeepSeek-V3.2): each query reads
    # the ``sparse_topk`` cached tokens its indexer picks; the indexer scores every cached
    # token (``index_flops`` per query and cached token, ``index_bytes`` of FP8 keys per
    # cached token and layer, at ``index_peak``)
    sparse_topk: int | None = None
    index_flops: float = 0.0
    index_bytes: float = 0.0
    index_peak: float = 0.0
    # tokens a decoding request computes per pass: 1, plus its drafts under speculative
    # decoding (the verification forward)
    decode_queries: int = 1
    mla: bool = False  # the attention layers are multi-head latent attention
    # exponentials per second of the GPU's special function units, which the softmax of
    # attention runs on (0: not known, no softmax time priced)
    exp_per_s: float = 0.0
    # weight bytes per second the SMs dequantise where the dense GEMMs and the experts run
    # weight-only (w4a16) kernels: a ceiling besides the memory bandwidth (0: none)
    gemm_dequant_bw: float = 0.0
    moe_dequant_bw: float = 0.0


def _fail(role_path: tuple[str, ...], message: str, hint: str | None = None) -> ReplayError:
    return ReplayError(
        [Diagnostic(code=codes.TIMING_UNSUPPORTED, message=message, path=role_path, hint=hint)]
    )


def _kernel(gpu: GpuSpec, quant: str) -> tuple[float, str]:
    """Peak FLOP/s and kernel class of ``quant``'s GEMMs on ``gpu``: the tensor cores of
    the weights' dtype, or bf16 ones where the GPU has none (weight-only kernels that
    dequantise to bf16). 4-bit weights run FP4 tensor cores (class ``fp4``) where the
    format is FP4 and the GPU has them (Blackwell); elsewhere (Hopper's MXFP4 and NVFP4,
    every int4 mode) weight-only kernels that dequantise to bf16, a class of their own,
    ``w4a16``: each class has its own fitted efficiency level."""
    nbytes, kind = WEIGHT_QUANT[quant]
    peak = {"fp4": gpu.fp4_flops, "fp8": gpu.fp8_flops, "int8": gpu.int8_flops}.get(kind)
    if not peak:
        peak, kind = gpu.bf16_flops, "bf16"
    if nbytes < 1:
        return peak, "fp4" if kind == "fp4" else "w4a16"
    return peak, kind


def _dequant_bw(gpu: GpuSpec, kernel: str) -> float:
    """The rate (weight bytes/s) at which ``gpu``'s SMs dequantise the weights of
    ``kernel``'s GEMMs: ``gpu.w4a16_bytes_per_s`` for weight-only kernels (0: no ceiling
    but the memory bandwidth). Such a kernel converts every 4-bit weight to bf16 on the
    SMs, which bounds it below the memory bandwidth on Hopper and Blackwell alike (the
    catalog's README: an H200, an H100's SMs with 1.43x its bandwidth, runs measured MXFP4
    experts at about an H100's speed and bf16 ones 1.4x faster)."""
    return (gpu.w4a16_bytes_per_s or 0.0) if kernel == "w4a16" else 0.0


def build_geometry(
    model: ModelInfo,
    gpu: GpuSpec,
    *,
    backend: str = "vllm",
    worker_type: str = "aggregated",
    tensor: int = 1,
    pipeline: int = 1,
    attention_data: int = 1,
    moe_tensor: int = 1,
    moe_expert: int = 1,
    kv_bytes_per_token: int = 0,
    gemm_quant: str | None = None,
    moe_quant: str | None = None,
    speculative_tokens: int = 0,
    path: tuple[str, ...] = (),
) -> StepGeometry:
    """Precompute the batch-independent part of the step model.

    ``gemm_quant`` / ``moe_quant`` override the checkpoint's weight precision (the names of
    ``servesim.geometry.WEIGHT_QUANT``); by default non-expert weights use
    ``model.weight_dtype_bytes`` and routed experts ``model.expert_weight_dtype_bytes``.
    ``kv_bytes_per_token`` is the role's per-GPU KV bytes per token over all attention
    layers (0: the model dtype).
    Raises :class:`ReplayError` naming what the model lacks for this model.
    """
    _check_priceable(model, path, tensor=tensor, pipeline=pipeline,
                     attention_data=attention_data, moe_tensor=moe_tensor,
                     moe_expert=moe_expert)
    wbytes, gq = _weight_precision(model, gemm_quant, model.weight_dtype_bytes, path)
    ebytes, mq = _weight_precision(model, moe_quant, model.expert_weight_dtype_bytes, path)
    gemm_peak, gemm_kernel = _kernel(gpu, gq)
    moe_peak, moe_kernel = _kernel(gpu, mq)
    lm_elems = model.vocab_size * model.hidden_size / tensor
    return StepGeometry(
        model=model.name,
        gpu=gpu.name,
        backend=backend,
        worker_type=worker_type,
        num_layers=model.num_layers,
        hidden=model.hidden_size,
        tensor=tensor,
        pipeline=pipeline,
        attention_data=attention_data,
        moe_tensor=moe_tensor,
        moe_expert=moe_expert,
        classes=_layer_classes(model, tensor, wbytes),
        gemm_peak=gemm_peak,
        moe_peak=moe_peak,
        attn_peak=gpu.bf16_flops,
        exp_per_s=gpu.exp_per_s or 0.0,
        gemm_dequant_bw=_dequant_bw(gpu, gemm_kernel),
        moe_dequant_bw=_dequant_bw(gpu, moe_kernel),
        mem_bw=gpu.mem_bw,
        gemm_quant=gq,
        moe_quant=mq,
        gemm_kernel=gemm_kernel,
        moe_kernel=moe_kernel,
        decode_queries=1 + speculative_tokens,
        **_links(gpu, tensor=tensor, pipeline=pipeline, moe_group=moe_expert * moe_tensor),
        lm_head_elems=lm_elems,
        lm_head_bytes=lm_elems * model.dtype_bytes,
        **_attention(model, tensor=tensor, pipeline=pipeline,
                     kv_bytes_per_token=kv_bytes_per_token, path=path),
        **_sparse_indexer(model, gpu, path),
        **_experts(model, moe_tensor=moe_tensor, moe_expert=moe_expert, expert_bytes=ebytes),
        **_linear_state(model, tensor),
        mla=model.is_mla,
    )


def _check_priceable(model: ModelInfo, path: tuple[str, ...], **shape: int) -> None:
    """Raise what keeps the model from being priced: a parallel size below 1, a layer kind
    it does not know, MoE or attention layers without their geometry."""
    for name, value in shape.items():
        if value < 1:
            raise _fail(path, f"{name} must be >= 1 for the analytical timing model, got {value}")
    for kind in set(model.layer_types):
        if kind in ("kda", "gdn", "mamba2") and model.linear_attention is None:
            raise _fail(path, f"model {model.name!r}: {kind} layers without linear-attention "
                        "geometry; the analytical timing model cannot price them")
        if kind not in ("full_attention", "sliding_attention", "kda", "gdn", "mamba2", "none"):
            raise _fail(path, f"model {model.name!r}: unsupported layer kind {kind!r}")
    if model.is_moe and (not model.moe_intermediate_size or model.experts_per_token < 1):
        raise _fail(path, f"model {model.name!r}: MoE layers without moe_intermediate_size or "
                    "num_experts_per_tok; the analytical timing model cannot price them")
    if model.head_dim <= 0 or model.num_attention_heads <= 0:
        raise _fail(path, f"model {model.name!r}: no attention head geometry")


def _weight_precision(model: ModelInfo, mode: str | None, default_bytes: float,
                      path: tuple[str, ...]) -> tuple[float, str]:
    """Bytes per weight element and the precision's name: ``mode``'s, or (None or empty)
    the checkpoint's, its quantization where it applies."""
    if mode is None or mode == "":
        quant = model.weight_quant
        if quant is not None and quant in WEIGHT_QUANT and default_bytes < model.dtype_bytes:
            return default_bytes, quant
        return default_bytes, "bf16" if default_bytes >= 2 else "fp8"
    problem = unpriced_weight_quant(mode)
    if problem:
        raise _fail(path, problem)
    return WEIGHT_QUANT[mode][0], mode


def _layer_classes(model: ModelInfo, tensor: int, wbytes: float) -> tuple[_LayerClass, ...]:
    """The layers grouped by (mixer, MLP) kind, with their non-routed weights per GPU."""
    params = parameter_count(model)
    h = model.hidden_size
    mats = 3 if model.mlp_gated else 2
    n_attn = sum(1 for k in model.layer_types if k in ("full_attention", "sliding_attention"))
    n_lin = sum(1 for k in model.layer_types if k in ("kda", "gdn", "mamba2"))
    attn_layer = params.attention / n_attn if n_attn else 0.0
    lin_layer = params.linear_attention / n_lin if n_lin else 0.0
    dense_mlp = mats * h * (model.intermediate_size or 0)
    shared = mats * h * model.shared_expert_intermediate_size
    groups: dict[tuple[str, str], int] = {}
    for mixer_kind, mlp_kind in zip(model.layer_types, model.mlp_types, strict=True):
        groups[(mixer_kind, mlp_kind)] = groups.get((mixer_kind, mlp_kind), 0) + 1
    classes = []
    for (mixer, mlp), count in sorted(groups.items()):
        elems = 0.0
        if mixer in ("full_attention", "sliding_attention"):
            elems += attn_layer
        elif mixer != "none":
            elems += lin_layer
        if mlp == "dense":
            elems += dense_mlp
        elif mlp == "moe":
            elems += shared + h * model.num_experts  # shared experts and router
        elems /= tensor
        classes.append(_LayerClass(count=count, mixer=mixer, moe=mlp == "moe",
                                   dense_elems=elems, dense_bytes=elems * wbytes))
    return tuple(classes)


def _attention(model: ModelInfo, *, tensor: int, pipeline: int, kv_bytes_per_token: int,
               path: tuple[str, ...]) -> dict[str, Any]:
    """Per-GPU attention geometry: heads, head widths, KV bytes per token and layer."""
    if model.is_mla:
        lora = model.kv_lora_rank or 0
        rope = model.qk_rope_head_dim or 0
        nope = model.qk_nope_head_dim or 0
        qk_dim, v_dim = nope + rope, model.v_head_dim or nope
        decode_dim = 2 * lora + rope
    else:
        qk_dim = v_dim = model.head_dim
        decode_dim = 2 * model.head_dim
    kv_layers = len(model.attention_layers)
    if kv_layers:
        try:
            model_kv, _ = _kv_bytes_per_token(model, tensor=tensor, pipeline=pipeline,
                                             kv_dtype_bytes=model.dtype_bytes)
        except GeometryError as exc:
            raise _fail(path, str(exc)) from None
        per_token = kv_bytes_per_token if kv_bytes_per_token > 0 else model_kv
        stage_layers = -(-kv_layers // pipeline)
        kv_layer = per_token / stage_layers
    else:
        kv_layer = 0.0
    return {"heads_local": model.num_attention_heads / tensor, "qk_dim": qk_dim,
            "v_dim": v_dim, "decode_score_dim": decode_dim, "kv_bytes_layer": kv_layer,
            "sliding_window": _positive(model.lm_config, "sliding_window")}


def _sparse_indexer(model: ModelInfo, gpu: GpuSpec, path: tuple[str, ...]) -> dict[str, Any]:
    """The lightning indexer of DeepSeek sparse attention: a few FP8 heads, not split by
    tensor parallelism, whose keys (FP8 plus one fp32 scale) are cached per token."""
    sparse = _positive(model.lm_config, "index_topk")
    index_flops = index_bytes = index_peak = 0.0
    if sparse:
        index_heads = _positive(model.lm_config, "index_n_heads")
        index_dim = _positive(model.lm_config, "index_head_dim")
        if not (index_heads and index_dim):
            raise _fail(path, f"model {model.name!r}: sparse attention (index_topk) without "
                        "index_n_heads and index_head_dim; the analytical timing model "
                        "cannot price its indexer")
        index_flops = 2.0 * index_heads * index_dim
        index_bytes = index_dim + 4.0
        index_peak = _kernel(gpu, "fp8")[0]
    return {"sparse_topk": sparse, "index_flops": index_flops, "index_bytes": index_bytes,
            "index_peak": index_peak}


def _experts(model: ModelInfo, *, moe_tensor: int, moe_expert: int,
             expert_bytes: float) -> dict[str, Any]:
    """Routed experts per GPU: one expert's weights after moe_tensor, experts held."""
    mats = 3 if model.mlp_gated else 2
    eh = model.expert_hidden_size or model.hidden_size
    expert_elems = mats * eh * (model.moe_intermediate_size or 0) / moe_tensor
    experts = model.num_experts
    return {"experts": experts, "topk": model.experts_per_token,
            "expert_elems": expert_elems, "expert_bytes": expert_elems * expert_bytes,
            "local_experts": experts / moe_expert if experts else 0.0}


def _linear_state(model: ModelInfo, tensor: int) -> dict[str, Any]:
    """Linear attention / SSM per GPU and layer: the state's bytes and the FLOPs per token."""
    la = model.linear_attention
    state = 0.0
    lin_flops = 0.0
    if la is not None:
        kh, vh = la.num_key_heads / tensor, la.num_value_heads / tensor
        kd, vd = la.key_head_dim, la.value_head_dim
        ssm = 4 if (la.ssm_dtype or "").lower() in ("float32", "fp32") or la.kind == "kda" else 2
        conv_dim = (2 * kh * kd + vh * vd) if la.kind != "mamba2" else (vh * vd + 2 * kh * kd)
        if la.kind == "kda":
            conv_dim = 3 * vh * vd
        state = vh * kd * vd * ssm + conv_dim * (la.conv_kernel - 1) * model.dtype_bytes
        # state update + readout per token, plus intra-chunk attention of chunked kernels
        lin_flops = vh * (4 * kd * vd + 2 * LINEAR_CHUNK * (kd + vd))
    return {"state_bytes": state, "linear_flops_per_token": lin_flops}


def _links(gpu: GpuSpec, *, tensor: int, pipeline: int, moe_group: int) -> dict[str, Any]:
    """Bandwidths of the tensor-, expert- and pipeline-parallel links and the P2P latency:
    intra-node where the group fits on a node."""
    nodes_gpus = gpu.num_gpus_per_node

    def link(group: int) -> float:
        return gpu.intra_node_bw if group <= nodes_gpus else gpu.inter_node_bw

    return {"tp_link_bw": link(tensor), "ep_link_bw": link(moe_group),
            "pp_link_bw": gpu.inter_node_bw if tensor * pipeline > nodes_gpus
            else gpu.intra_node_bw,
            "p2p_latency_s": gpu.p2p_latency_s or 1e-5}


def _causal(ctx: float, topk: int | None) -> float:
    """Query-key pairs of causal attention over the first ``ctx`` tokens, each query
    reading at most ``topk`` keys (all earlier ones if ``topk`` is None)."""
    if topk is None or ctx <= topk:
        return ctx * ctx / 2.0
    return topk * ctx - topk * topk / 2.0


def _positive(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


# ---------------------------------------------------------------------------------------------
# The timer


def _max_z(ranks: int) -> float:
    """Expected maximum of ``ranks`` independent standard normal draws (Blom's
    approximation ``Phi^-1((n - 0.375) / (n + 0.25))``): how many standard deviations the
    busiest of ``ranks`` equally loaded ranks sits above the mean."""
    if ranks <= 1:
        return 0.0
    return statistics.NormalDist().inv_cdf((ranks - 0.375) / (ranks + 0.25))


class AnalyticalTimer:
    """Prices passes of one role with :class:`StepGeometry` and :class:`AnalyticalConstants`."""

    __slots__ = (
        "_a2a_remote",
        "_allreduces",
        "_ar_s",
        "_attn_c",
        "_classes",
        "_curve_b1",
        "_curve_b16",
        "_decode",
        "_expert_s",
        "_gemm_c",
        "_geo",
        "_layers_s",
        "_lin_c",
        "_link",
        "_max_z",
        "_mem",
        "_mixers",
        "_moe_c",
        "_moe_layers",
        "_over",
        "_pair_bytes",
        "_request_layers_ms",
        "_standalone",
        "_weight_floor_s",
        "constants",
        "geometry",
    )

    def __init__(self, geometry: StepGeometry, constants: AnalyticalConstants,
                 backend: Backend | None = None) -> None:
        """``backend``: the policy of ``geometry.backend`` (by default the built-in of that
        name), whose ``perf_backend`` picks the overhead constants."""
        self.geometry = geometry
        self.constants = constants
        c = constants
        g = geometry
        self._geo = g
        # each kernel class's compute efficiency relative to bf16's
        gemm_curve = c.gemm_fp8_curve if g.gemm_kernel == "fp8" else c.gemm_curve
        self._gemm_c = gemm_curve.scaled(c.gemm_scale * c.quant_level.get(g.gemm_kernel, 1.0))
        self._moe_c = c.moe_curve.scaled(
            c.moe_scale * c.moe_quant_level.get(g.moe_kernel, 1.0))
        self._mem = c.mem_curve.scaled(c.mem_scale)
        self._link = c.link_curve
        self._curve_b1 = c.prefill_attn_curve_b1.scaled(c.attn_scale)
        self._curve_b16 = c.prefill_attn_curve_b16.scaled(c.attn_scale)
        self._attn_c = c.decode_attn_compute
        self._lin_c = c.linear_compute
        self._ar_s = c.allreduce_us * 1e-6
        self._expert_s = c.expert_us * 1e-6
        self._pair_bytes = g.hidden * ACT_BYTES * c.moe_act_passes
        self._max_z = _max_z(g.moe_expert)  # (the same for every pass: computed once)
        policy = backend or backends.policy(g.backend)
        try:
            if policy is None:
                raise KeyError(g.backend)
            self._over = c.overheads(policy.perf_backend)
        except KeyError:
            raise ReplayError([Diagnostic(
                code=codes.TIMING_UNSUPPORTED,
                message=f"no analytical overhead constants for backend {g.backend!r} "
                f"(known: {', '.join(sorted(c.backends))})")]) from None
        # a pass with prompt work is a whole forward on prefill workers and on SGLang,
        # which never mixes it with decode steps; else the prompt adds to a decode forward
        self._standalone = g.worker_type == "prefill" or policy.standalone_prefill_pricing
        self._classes = g.classes
        self._weight_floor_s = self._gemm_s(1, 1)
        # every layer's overhead in each forward pass and in a request's set-up, MoE
        # layers' extra kernels included
        self._moe_layers = moe_layers = sum(cls.count for cls in g.classes if cls.moe)
        # Attention data parallelism spreads the tokens over the ranks, so an MoE layer
        # dispatches and combines them with all-to-all; under attention tensor
        # parallelism every GPU already holds every token and the experts' partial
        # outputs (expert- or tensor-sharded alike) are summed by the same all-reduce as
        # a dense MLP's.
        a2a_moe = bool(g.experts) and g.attention_data > 1
        # all-reduces per forward: one after the mixer, one after the MLP (unless
        # all-to-all combines it)
        self._allreduces = 0 if g.tensor <= 1 else sum(
            cls.count * ((1 if cls.mixer != "none" else 0)
                         + (1 if not cls.moe or not a2a_moe or g.moe_expert == 1 else 0))
            for cls in g.classes)
        # other expert-parallel ranks a token travels to: once to each that holds any of
        # its top-k experts (and its combined partial result once back), not once per
        # expert
        ep = g.moe_expert * g.moe_tensor
        self._a2a_remote = ((ep - 1) * (1.0 - (1.0 - 1.0 / ep) ** g.topk)
                            if a2a_moe and ep > 1 else 0.0)
        self._mixers = self._attention_layers()
        # a sparse attention layer's indexer launches as many kernels again as the rest of
        # the layer (projections, normalisation, RoPE, key quantisation and caching, FP8
        # logits, top-k)
        sparse_layers = self._mixers[0] if g.sparse_topk else 0
        mla_layers = self._mixers[0] if g.mla else 0
        o = self._over
        self._layers_s = ((g.num_layers + sparse_layers) * o.layer_us
                          + moe_layers * o.moe_layer_us + mla_layers * o.mla_layer_us) * 1e-6
        self._request_layers_ms = (g.num_layers * o.request_layer_us
                                   + moe_layers * o.request_moe_layer_us
                                   + mla_layers * o.request_mla_layer_us) * 1e-3
        # the decode price, computed natively (the terms of a batch size, once, here)
        self._decode = DecodePrice(g, self._mixers, c.kv_scale, self._attn_c, self._lin_c,
                                   self._mem, self._decode_batch_terms)

    # -- building blocks (seconds) ------------------------------------------------------

    def _mem_s(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        return nbytes / (self._geo.mem_bw * self._mem(nbytes))

    def _gemm_s(self, tokens: float, moe_tokens: float) -> float:
        """All weight GEMMs of one forward over ``tokens`` tokens (``moe_tokens`` at the
        experts, which see every attention-DP rank's tokens)."""
        g = self._geo
        total = 0.0
        u_c = self._gemm_c(tokens)
        act = tokens * g.hidden * ACT_BYTES * 4  # in/out activations of the layer's GEMMs
        for cls in self._classes:
            flops = 2.0 * cls.dense_elems * tokens
            t = max(flops / (g.gemm_peak * u_c), self._mem_s(cls.dense_bytes + act))
            if g.gemm_dequant_bw:
                t = max(t, cls.dense_bytes / g.gemm_dequant_bw)
            if cls.moe:
                t += self._moe_s(moe_tokens)
            total += cls.count * t
        return total

    def _moe_s(self, tokens: float) -> float:
        """Routed experts of one MoE layer over ``tokens`` tokens, on the busiest
        expert-parallel rank.

        Under uniform routing each of a rank's ``local_experts`` is touched with
        probability ``q = 1 - (1 - k/E) ** tokens`` and each token-expert pair lands on a
        rank with probability ``1/ep``. The layer ends when the most loaded rank is done,
        so both counts are the expected maximum over the ``ep`` ranks (mean plus
        :func:`_max_z` standard deviations of the binomial count): at a few tokens per
        pass one rank often holds twice the mean number of touched experts, while large
        batches balance out. Each of the rank's pairs also moves ``moe_act_passes`` copies
        of its hidden-size activations through memory (permutation and combine), whatever
        the slice of the expert the rank holds. Weight-only experts read their weights no
        faster than the SMs dequantise them (:func:`_dequant_bw`).
        """
        g = self._geo
        if g.experts == 0 or tokens <= 0:
            return 0.0
        pairs = tokens * g.topk
        q = 1.0 - (1.0 - g.topk / g.experts) ** tokens
        n_local = g.local_experts
        touched = n_local * q
        rank_pairs = pairs / g.moe_expert
        if g.moe_expert > 1:
            z = self._max_z
            touched = min(n_local, touched + z * math.sqrt(n_local * q * (1.0 - q)))
            p = 1.0 / g.moe_expert
            rank_pairs = min(pairs, rank_pairs + z * math.sqrt(pairs * p * (1.0 - p)))
        per_expert = pairs / g.experts
        flops = 2.0 * rank_pairs * g.expert_elems
        compute = flops / (g.moe_peak * self._moe_c(max(per_expert, 1.0)))
        weights = touched * g.expert_bytes
        t = max(compute, self._mem_s(weights))
        if g.moe_dequant_bw:
            t = max(t, weights / g.moe_dequant_bw)
        return t + touched * self._expert_s + self._mem_s(rank_pairs * self._pair_bytes)

    def _lm_head_s(self, tokens: float) -> float:
        g = self._geo
        flops = 2.0 * g.lm_head_elems * tokens
        return max(flops / (g.attn_peak * self._gemm_c(tokens)), self._mem_s(g.lm_head_bytes))

    def _comm_s(self, tokens: float, latency: bool) -> float:
        """Collectives of one forward over this rank's ``tokens`` tokens."""
        g = self._geo
        lat = self._ar_s if latency else 0.0
        total = 0.0
        msg = tokens * g.hidden * ACT_BYTES
        eff = self._link
        if self._allreduces:
            total += self._allreduces * (
                lat + 2.0 * msg * (g.tensor - 1) / g.tensor / (g.tp_link_bw * eff(msg)))
        if self._a2a_remote:
            a2a_bytes = tokens * self._a2a_remote * g.hidden * ACT_BYTES
            a2a = lat + a2a_bytes / (g.ep_link_bw * eff(a2a_bytes))
            total += self._moe_layers * 2 * a2a
        if g.pipeline > 1:
            hop = (g.p2p_latency_s if latency else 0.0) + msg / (g.pp_link_bw * eff(msg))
            total += (g.pipeline - 1) * hop
        return total

    def _softmax_s(self, pairs: float) -> float:
        """The share of a prefill's softmax that its matrix products do not hide: one
        exponential per query-key pair and head on the special function units (whose
        throughput Blackwell Ultra doubles), a fitted fraction of it exposed."""
        g = self._geo
        if not g.exp_per_s:
            return 0.0
        return self.constants.softmax_exposed * pairs * g.heads_local / g.exp_per_s

    def _attention_layers(self) -> tuple[int, int, int]:
        full = sliding = linear = 0
        for cls in self._classes:
            if cls.mixer == "full_attention":
                full += cls.count
            elif cls.mixer == "sliding_attention":
                sliding += cls.count
            elif cls.mixer != "none":
                linear += cls.count
        return full, sliding, linear

    # -- the protocol -------------------------------------------------------------------

    def request_ms(self, input_tokens: float) -> float:
        """Latency a request spends in the serving front end rather than in GPU passes
        (HTTP handling, tokenising ``input_tokens`` prompt tokens, returning the first
        token). It adds to the time to first token and does not occupy the GPU."""
        o = self._over
        return (o.request_ms + o.request_us_per_token * 1e-3 * max(input_tokens, 0.0)
                + self._request_layers_ms)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        # A price is per rank: under attention data parallelism the experts see this
        # rank's prompt tokens (plus the other ranks' decode tokens, priced by their
        # decode half). In steady serving, prompts reach the ranks at different times, so
        # assuming every rank prefills the same chunk at once would multiply the expert
        # work of a lone prefill by the number of ranks; a pass where several ranks do
        # prefill is priced by prefill_group_ms.
        return self._prefill_ms(batch, mean_isl, mean_prefix, None)

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        """This rank's prefill half when the worker's attention-DP ranks compute
        ``group_tokens`` prompt tokens together: the experts see all of them."""
        return self._prefill_ms(batch, mean_isl, mean_prefix, group_tokens)

    def _prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                    group_tokens: int | None) -> float:
        new = mean_isl - mean_prefix
        if batch <= 0 or new <= 0:
            return 0.0
        g = self._geo
        o = self._over
        b = float(batch)
        tokens = b * new
        moe_tokens = tokens if group_tokens is None else max(tokens, float(group_tokens))
        gemm = self._gemm_s(tokens, moe_tokens)
        comm = self._comm_s(tokens, latency=self._standalone)
        # attention
        full, sliding, linear = self._mixers
        ctx = float(mean_isl)
        p = float(mean_prefix)
        u = self._prefill_attn_eff(ctx, b)
        attn = 0.0
        width = g.heads_local * (g.qk_dim + g.v_dim)
        if full:
            pairs = b * (_causal(ctx, g.sparse_topk) - _causal(p, g.sparse_topk))
            flops = 2.0 * pairs * width
            kv = b * ctx * g.kv_bytes_layer
            t = flops / (g.attn_peak * u) + self._mem_s(kv) + self._softmax_s(pairs)
            if g.sparse_topk:  # the indexer scores every earlier token
                every = b * (_causal(ctx, None) - _causal(p, None))
                t += (g.index_flops * every / (g.index_peak * u)
                      + self._mem_s(b * ctx * g.index_bytes))
            attn += full * t
        if sliding:
            w = float(g.sliding_window or ctx)
            pairs = b * new * min(w, p + new / 2.0)
            flops = 2.0 * pairs * width
            kv = b * min(ctx, w + new) * g.kv_bytes_layer
            attn += sliding * (flops / (g.attn_peak * u) + self._mem_s(kv)
                               + self._softmax_s(pairs))
        if linear:
            chunks = math.ceil(new / LINEAR_CHUNK)
            flops = tokens * g.linear_flops_per_token
            nbytes = b * g.state_bytes * (2 + chunks)
            attn += linear * max(flops / (g.attn_peak * self._lin_c), self._mem_s(nbytes))
        layers = g.num_layers
        if self._standalone:
            total = (gemm + self._lm_head_s(b) + attn + comm + o.step_ms * 1e-3
                     + self._layers_s + layers * o.prefill_layer_us * 1e-6)
        else:
            total = max(0.0, gemm - self._weight_floor_s) + attn + comm
            total += layers * o.prefill_layer_us * 1e-6
        return total * 1e3 + b * o.prefill_req_ms

    def _prefill_attn_eff(self, ctx: float, batch: float) -> float:
        lo = self._curve_b1(ctx)
        if batch <= 1:
            return lo
        hi = self._curve_b16(ctx)
        if batch >= 16:
            return hi
        return lo + (hi - lo) * math.log2(batch) / 4.0

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        # GEMMs, communication and fixed overheads per batch size (_decode_batch_terms),
        # and the attention layers: each sequence's KV read once per step, q queries each
        # (a verification forward computes every draft's position); a sparse layer reads
        # each sequence's top-k tokens and its indexer scores every cached token
        # (servesim.timing.decode_price)
        return self._decode.decode_ms(batch, active_kv_tokens, mean_context)

    def decode_steps_ms(self, batch: int, active_kv_tokens: int, total_kv_tokens: int,
                        steps: int) -> list[float]:
        """:meth:`decode_ms` of ``steps`` steady passes, in one native loop
        (:class:`servesim.timing.base.StepTimer`)."""
        return self._decode.decode_steps_ms(batch, active_kv_tokens, steps)

    def _decode_batch_terms(self, n: float, tokens: float) -> tuple[float, float, float]:
        """GEMMs, communication and fixed overheads of a decode pass of ``n`` requests
        (``tokens`` through the GEMMs): they depend on the batch alone."""
        g, o = self._geo, self._over
        gemm = self._gemm_s(tokens, tokens * g.attention_data) + self._lm_head_s(tokens)
        comm = self._comm_s(tokens, latency=True)
        fixed = o.step_ms * 1e-3 + self._layers_s + n * o.decode_req_us * 1e-6
        return gemm, comm, fixed


# ---------------------------------------------------------------------------------------------
# Construction from a role


def _role_path(role: RoleArgs) -> tuple[str, ...]:
    return ("engine", "workers", role.worker_type)


def timer_from_role(
    role: RoleArgs, *, constants: AnalyticalConstants | None = None,
    backend: Backend | None = None,
) -> AnalyticalTimer:
    """The analytical timer of ``role`` (model and GPU from the catalog, weight precision
    from ``role.timing``; ``backend``: its backend's policy, by default the built-in's)."""
    path = _role_path(role)
    try:
        model = load_model(role.model)
    except CatalogError as exc:
        raise ReplayError([Diagnostic(
            code=codes.TIMING_UNSUPPORTED, path=(*path, "model"),
            message=f"default timing needs the model's architecture: {exc}",
            hint='use a shipped model id, a directory with config.json, or timing.type = '
                 '"table"/"fixed"')]) from None
    try:
        gpu = load_gpu(role.hardware)
    except CatalogError as exc:
        raise ReplayError([Diagnostic(
            code=codes.TIMING_UNSUPPORTED, path=(*path, "hardware"),
            message=f"default timing needs the GPU's datasheet: {exc}",
            hint='use a shipped GPU name or timing.type = "table"/"fixed"')]) from None
    geometry = build_geometry(
        model,
        gpu,
        backend=role.backend,
        worker_type=role.worker_type,
        tensor=role.tensor,
        pipeline=role.pipeline,
        attention_data=role.attention_data,
        moe_tensor=role.moe_tensor,
        moe_expert=role.moe_expert,
        kv_bytes_per_token=role.kv_bytes_per_token,
        gemm_quant=role.timing.gemm_quant,
        moe_quant=role.timing.moe_quant,
        speculative_tokens=role.speculation.num_speculative_tokens if role.speculation else 0,
        path=path,
    )
    return AnalyticalTimer(geometry, constants or load_constants(), backend)
