"""ParsedConfig: the authored shape of a servesim TOML file.

Every field that has a default is ``None`` here when the user did not write it; the
resolve pass applies defaults and records whether each value was authored, defaulted
or derived. Range limits live in field metadata (``limits``) so that one mechanism
checks them (``passes/parse.py``) and the JSON Schema states them (``schemas``).

TOML key paths equal attribute paths: ``[engine.workers.decode.kv_cache] block_size``
is ``ParsedConfig.engine.workers.decode.kv_cache.block_size``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from servesim.backends import BackendName
from servesim.limits import (
    BANDWIDTH_GB_S,
    BIG,
    BLOCK_SIZE,
    BLOCKS,
    BYTES_PER_TOKEN,
    CONCURRENCY,
    CONTEXT,
    COUNT,
    LATENCY_MS,
    PARALLEL,
    REPLICAS,
    SCHEDULER,
    SECONDS,
    STEP_MS,
    TOKENS,
    U64_MAX,
)
from servesim.limits import bounded as limits


def positive(hi: float = BIG) -> Any:
    return limits(1, hi)


def nonneg(hi: float = BIG) -> Any:
    return limits(0, hi)


Auto = Literal["auto"]
Max = Literal["max"]
# An SLA bound: a number (per request) or a table of targets ({ p99 = 1000 })
SlaValue = float | dict[str, float]
QuantMode = Literal["auto", "bfloat16", "float16", "fp8", "fp8_block", "nvfp4", "int8", "float32"]


@attrs.frozen
class Parallelism:
    replicas: int | None = positive(REPLICAS)
    tensor: int | None = positive(PARALLEL)
    pipeline: int | None = positive(PARALLEL)
    attention_data: int | None = positive(PARALLEL)
    moe_tensor: int | None = positive(PARALLEL)
    moe_expert: int | None = positive(PARALLEL)


@attrs.frozen
class Scheduler:
    max_batched_tokens: int | None = positive(SCHEDULER)
    max_sequences: int | None = positive(SCHEDULER)
    prefill_schedule_interval: int | None = positive(SCHEDULER)
    prefill_decode_interval: int | None = nonneg(SCHEDULER)
    attention_dp_balance: bool | None = None
    attention_dp_timeout_iters: int | None = nonneg(SCHEDULER)
    attention_dp_batching_wait_iters: int | None = nonneg(SCHEDULER)
    attention_dp_placement: Literal["round_robin", "least_loaded"] | None = None


@attrs.frozen
class Capacity:
    type: Literal["default", "fixed"] | None = None
    memory_fraction: float | None = limits(0.0, 1.0, lo_open=True)
    cuda_graph_reserved_bytes: int | None = nonneg(BIG)
    blocks: int | None = positive(BLOCKS)
    bytes: int | None = positive(U64_MAX)


@attrs.frozen
class StateCache:
    """``{}`` infers the state size from the model; ``bytes_per_request`` sets it."""

    bytes_per_request: int | None = positive(U64_MAX)
    mamba_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = None


@attrs.frozen
class KvCache:
    block_size: int | None = positive(BLOCK_SIZE)
    prefix_caching: bool | None = None
    bytes_per_token: int | Auto | None = positive(BYTES_PER_TOKEN)
    capacity: Capacity | None = None
    state_cache: StateCache | None = None
    prefix_match_unit: int | None = positive(BLOCK_SIZE)
    host_offload: dict[str, Any] | None = None  # not supported: diagnosed by the parse pass
    g3_offload: dict[str, Any] | None = None  # not supported: diagnosed by the parse pass


@attrs.frozen
class Timing:
    # a registered timing provider: built-in "default", "fixed", "polynomial", "table",
    # or a plugin's; checked against the registry by the parse pass
    type: str | None = None
    prefill_ms: float | None = nonneg(STEP_MS)
    decode_ms: float | None = nonneg(STEP_MS)
    path: str | None = None
    calibration: str | None = None  # a servesim calibrate file, relative to the config


@attrs.frozen
class Worker:
    hardware: str | None = None
    startup_seconds: float | None = nonneg(SECONDS)
    parallelism: Parallelism | None = None
    scheduler: Scheduler | None = None
    kv_cache: KvCache | None = None
    timing: Timing | None = None


@attrs.frozen
class Workers:
    aggregated: Worker | None = None
    prefill: Worker | None = None
    decode: Worker | None = None


@attrs.frozen
class KvTransfer:
    bytes_per_token: int | Auto | None = positive(BYTES_PER_TOKEN)
    bandwidth_gb_per_second: float | None = limits(*BANDWIDTH_GB_S)
    timing_mode: Literal["destination_missing", "full_prompt"] | None = None


@attrs.frozen
class Speculation:
    kind: Literal["mtp", "ngram"]
    num_speculative_tokens: int = attrs.field(metadata={"lo": 1, "hi": 5})
    acceptance_rates: list[float] = attrs.field(metadata={"lo": 0.0, "hi": 1.0})
    seed: int | None = nonneg(U64_MAX)


@attrs.frozen
class Engine:
    model: str
    hardware: str
    workers: Workers
    mode: Literal["aggregated", "disaggregated", "afd"] | None = None
    backend: BackendName | None = None  # vllm, sglang, trtllm, or a plugin's backend
    backend_version: str | None = None
    context_length: int | Max | None = positive(CONTEXT)
    kv_transfer: KvTransfer | None = None
    speculation: Speculation | None = None
    nextn: int | None = limits(0, 5)
    nextn_accepted: float | None = limits(0.0, 5.0)
    enable_chunked_prefill: bool | None = None
    kvcache_quant_mode: QuantMode | None = None
    gemm_quant_mode: QuantMode | None = None
    moe_quant_mode: QuantMode | None = None
    afd: dict[str, Any] | None = None  # not supported: diagnosed by the parse pass
    # the replay engine by registered name (default: "vllm", or "disagg" in disaggregated
    # mode) and its own options, structured by the engine's Options class
    engine: str | None = None
    options: dict[str, Any] | None = None


@attrs.frozen
class Session:
    turns: int | None = limits(2, 10_000)
    shared_prefix_ratio: float | None = limits(0.0, 1.0)
    prefix_groups: int | None = nonneg(COUNT)
    inter_turn_delay_ms: float | None = nonneg(LATENCY_MS)


@attrs.frozen
class Source:
    type: Literal["synthetic", "synthetic-session", "trace"] | None = None
    input_tokens: int | None = positive(TOKENS)
    output_tokens: int | None = nonneg(TOKENS)
    # output lengths spread uniformly over output_tokens x (1 -/+ ratio), as the benchmark
    # clients' --random-range-ratio does (synthetic source)
    output_range_ratio: float | None = limits(0.0, 1.0)
    cached_prefix_tokens: int | None = nonneg(TOKENS)
    new_input_tokens_per_turn: int | None = positive(TOKENS)
    output_tokens_per_turn: int | None = nonneg(TOKENS)
    session: Session | None = None
    paths: list[str] | None = None
    format: str | None = None  # a registered trace format; checked by the parse pass
    block_size: int | None = positive(BLOCK_SIZE)


@attrs.frozen
class Load:
    type: Literal["concurrency", "poisson", "constant_rate", "trace_timestamps"] | None = None
    concurrency: int | None = positive(CONCURRENCY)
    requests_per_second: float | None = limits(0.0, 1e7, lo_open=True)
    sessions_per_second: float | None = limits(0.0, 1e7, lo_open=True)
    seed: int | None = nonneg(U64_MAX)
    speedup: float | None = limits(0.0, 1e6, lo_open=True)


@attrs.frozen
class Stop:
    requests: int | None = positive(COUNT)
    requests_per_load_unit: float | None = limits(0.0, 1e9, lo_open=True)
    sessions: int | None = positive(COUNT)
    sessions_per_load_unit: float | None = limits(0.0, 1e9, lo_open=True)
    max_virtual_time_seconds: float | None = limits(0.0, 1e9, lo_open=True)


@attrs.frozen
class Traffic:
    source: Source | None = None
    load: Load | None = None
    stop: Stop | None = None


@attrs.frozen
class Sla:
    """Latency targets in ms: ttft_ms (time to first token), tpot_ms (each request's mean
    token gap), itl_ms (the gaps between a request's emissions), e2e_ms. Each is a number
    (a per-request bound: goodput counts the requests within every one) or a table of
    targets on the run's distribution, such as { p99 = 1000 } (keys: per_request, mean,
    median, p50, p75, p90, p95, p99, "p99.9", min, max). Deprecated: a number under
    itl_ms still bounds each request's mean gap; rename it to tpot_ms."""

    ttft_ms: SlaValue | None = limits(0.0, LATENCY_MS, lo_open=True)
    tpot_ms: SlaValue | None = limits(0.0, LATENCY_MS, lo_open=True)
    itl_ms: SlaValue | None = limits(0.0, LATENCY_MS, lo_open=True)
    e2e_ms: SlaValue | None = limits(0.0, LATENCY_MS, lo_open=True)


@attrs.frozen
class Evaluation:
    sla: Sla | None = None
    # USD per GPU-hour by catalog GPU, over the shipped prices (sweep and search costs)
    gpu_hour_usd: dict[str, Any] | None = None


@attrs.frozen
class ParsedConfig:
    """Stage 1 output: the TOML document, typed, with only authored values set."""

    engine: Engine
    traffic: Traffic | None = None
    evaluation: Evaluation | None = None
