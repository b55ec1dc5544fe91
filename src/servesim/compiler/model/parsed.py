"""ParsedConfig: the authored shape of a servesim TOML file.

Every field that has a default is ``None`` here when the user did not write it; the
resolve pass applies defaults and records whether each value was authored, defaulted
or derived. What a key means, its default, its range limits and examples are field
metadata (:func:`key`), declared once beside the field: the parse pass checks the limits
(``passes/parse.py``), the resolve pass applies the default (:func:`default_of`), and the
JSON Schema states all four (``schemas``), for editors to show.

TOML key paths equal attribute paths: ``[engine.workers.decode.kv_cache] block_size``
is ``ParsedConfig.engine.workers.decode.kv_cache.block_size``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs

from servesim.backends import DEFAULT_BACKEND, BackendName
from servesim.limits import (
    BANDWIDTH_GB_S,
    BIG,
    BLOCK_SIZE,
    BLOCKS,
    BYTES_PER_TOKEN,
    CONCURRENCY,
    CONTEXT,
    COUNT,
    GPU_HOUR_USD,
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
from servesim.workloads import spec
from servesim.workloads.lengths import LengthDistribution
from servesim.workloads.spec import MAX_CV


def key(doc: str, lo: float | None = None, hi: float | None = None, *,
        lo_open: bool = False, default: Any = None, derived: str | None = None,
        examples: Sequence[Any] = ()) -> Any:
    """An optional config key (``None`` while not written).

    ``doc`` says what it means; ``default`` is the value the resolve pass applies when the
    key is not written; ``derived`` says what the default depends on where it is not one
    fixed value (the backend, the model, the role: the schema then states no default);
    ``lo``/``hi`` bound a number.
    """
    meta = {"help": doc, "default": default, "derived": derived, "examples": list(examples)}
    if lo is None and hi is None:
        return attrs.field(default=None, metadata=meta)
    return limits(lo, hi, lo_open=lo_open, metadata=meta)


def positive(hi: float, doc: str, **kw: Any) -> Any:
    return key(doc, 1, hi, **kw)


def nonneg(hi: float, doc: str, **kw: Any) -> Any:
    return key(doc, 0, hi, **kw)


def required(doc: str, *, examples: Sequence[Any] = (), **bounds: Any) -> Any:
    """A key the config must write."""
    return attrs.field(metadata={"help": doc, "examples": list(examples), **bounds})


def table(doc: str) -> Any:
    """An optional table (its keys say their own defaults)."""
    return attrs.field(default=None, metadata={"help": doc})


def default_of(cls: type, name: str) -> Any:
    """The default the resolve pass applies to the unwritten key ``cls.name``."""
    return attrs.fields_dict(cls)[name].metadata.get("default")


Auto = Literal["auto"]
Max = Literal["max"]
# An SLA bound: a number (per request) or a table of targets ({ p99 = 1000 })
SlaValue = float | dict[str, float]
QuantMode = Literal["auto", "bfloat16", "float16", "fp8", "fp8_block", "nvfp4", "int8", "float32"]
QUANT_EXAMPLES = ("fp8", "bfloat16")


@attrs.frozen
class Parallelism:
    """How a worker's GPUs split the model: GPUs per worker = tensor x pipeline x
    attention_data."""

    replicas: int | None = positive(REPLICAS, "identical workers in this role", default=1,
                                    examples=[2])
    tensor: int | None = positive(PARALLEL, "tensor parallelism of attention (and dense "
                                  "layers): shards the KV cache per token", default=1,
                                  examples=[4, 8])
    pipeline: int | None = positive(PARALLEL, "pipeline-parallel stages", default=1,
                                    examples=[2])
    attention_data: int | None = positive(PARALLEL, "attention data parallelism: scheduler "
                                          "ranks per worker, each with its own batch and KV "
                                          "pool", default=1, examples=[8])
    moe_tensor: int | None = positive(PARALLEL, "tensor parallelism of the routed experts",
                                      default=1, examples=[8],
                                      derived="1; on an MoE model with moe_tensor x "
                                      "moe_expert unset, tensor x attention_data (the "
                                      "experts split over all attention GPUs)")
    moe_expert: int | None = positive(PARALLEL, "expert parallelism of the routed experts",
                                      default=1, examples=[8])


@attrs.frozen
class Scheduler:
    """Each scheduler rank's batch limits and pass policy."""

    max_batched_tokens: int | None = positive(
        SCHEDULER, "token budget of one pass per attention-DP rank", examples=[8192, 16384],
        derived="the backend's (8192; SGLang 8192 / attention_data)")
    max_sequences: int | None = positive(
        SCHEDULER, "most requests running at once per rank", default=256, examples=[128],
        derived="256, or 1 in a prefill worker")
    prefill_schedule_interval: int | None = positive(
        SCHEDULER, "vLLM: admit new prompts every N-th pass", default=1, examples=[4])
    prefill_decode_interval: int | None = nonneg(
        SCHEDULER, "SGLang: decode passes between prompt passes (0: no interval)", default=0,
        examples=[2])
    attention_dp_balance: bool | None = key(
        "TensorRT-LLM attention-DP balance: hold prompt work until every rank has some",
        default=False, examples=[True])
    attention_dp_timeout_iters: int | None = nonneg(
        SCHEDULER, "passes a held prompt waits for the other ranks at most (with "
        "attention_dp_balance)", default=50, examples=[20])
    attention_dp_batching_wait_iters: int | None = nonneg(
        SCHEDULER, "passes balanced prompt work waits for others to join (with "
        "attention_dp_balance)", default=10, examples=[5])
    attention_dp_placement: Literal["round_robin", "least_loaded"] | None = key(
        "how requests join a worker's attention-DP ranks", default="round_robin",
        examples=["least_loaded"])


@attrs.frozen
class Capacity:
    """The KV pool size per attention-DP rank: estimated from GPU memory, or fixed."""

    type: Literal["default", "fixed"] | None = key(
        "\"default\": estimated from the GPU memory left after weights and overheads; "
        "\"fixed\": blocks or bytes given", default="default", examples=["fixed"])
    memory_fraction: float | None = key(
        "share of GPU memory the engine may use (vLLM gpu_memory_utilization, SGLang "
        "mem_fraction_static, TensorRT-LLM free_gpu_memory_fraction); type \"default\" only",
        0.0, 1.0, lo_open=True, examples=[0.85],
        derived="the backend's (0.9; SGLang 0.88)")
    cuda_graph_reserved_bytes: int | None = nonneg(
        BIG, "GPU memory held by CUDA graphs, taken from the KV pool; type \"default\" only",
        default=0, examples=[2147483648])
    blocks: int | None = positive(BLOCKS, "KV blocks per rank; type \"fixed\" only",
                                  examples=[4096])
    bytes: int | None = positive(U64_MAX, "KV bytes per rank; type \"fixed\" only, with an "
                                 "explicit block_size and bytes_per_token",
                                 examples=[68719476736])


@attrs.frozen
class StateCache:
    """``{}`` infers the state size from the model; ``bytes_per_request`` sets it."""

    bytes_per_request: int | None = positive(
        U64_MAX, "bytes of one request's recurrent state per rank", examples=[1048576],
        derived="inferred from the model's linear-attention layers")
    mamba_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] | None = key(
        "dtype of the convolution state when the size is inferred (\"auto\": the model's)",
        default="auto", examples=["float32"])


@attrs.frozen
class HostOffload:
    """The host-memory (G2) KV tier of each attention-DP rank and its link to the GPU."""

    capacity_blocks: int | None = positive(
        BLOCKS, "host KV blocks per attention-DP rank (exclusive with capacity_gb)",
        examples=[65536])
    capacity_gb: float | None = key(
        "host memory for KV per attention-DP rank, decimal GB; whole blocks of the role's "
        "block_size x bytes_per_token (exclusive with capacity_blocks)", 0.0, 1e9,
        lo_open=True, examples=[256.0])
    bandwidth_gb_per_second: float | None = key(
        "the GPU's host link (PCIe or C2C), decimal GB/s; write-backs and loads on one rank "
        "share it", *BANDWIDTH_GB_S, examples=[64.0],
        derived="the GPU's PCIe bandwidth in the catalog (required where it has none)")
    write_back: Literal["on_evict"] | None = key(
        "when GPU blocks are copied to host: \"on_evict\", a cached block evicted from the "
        "GPU pool", default="on_evict", examples=["on_evict"])


@attrs.frozen
class KvCache:
    """The KV cache of each rank: page size, prefix reuse, bytes per token and pool size."""

    block_size: int | None = positive(
        BLOCK_SIZE, "tokens per KV block (page)", examples=[16, 64],
        derived="the backend's (vLLM 64, SGLang 1, TensorRT-LLM 32); with an inferred "
        "state_cache a requested size the inference may enlarge")
    prefix_caching: bool | None = key("reuse the KV blocks of complete prompt prefixes",
                                      default=True, examples=[False])
    bytes_per_token: int | Auto | None = positive(
        BYTES_PER_TOKEN, "KV bytes per token on one tensor-parallel shard (\"auto\": from "
        "the model, the parallelism and the KV dtype)", default="auto", examples=[131072])
    capacity: Capacity | None = table("the KV pool size per attention-DP rank")
    state_cache: StateCache | None = table(
        "recurrent state of hybrid models (requires fixed capacity); {} infers its size")
    prefix_match_unit: int | None = positive(
        BLOCK_SIZE, "granularity of prefix matches with a state cache; divides the block "
        "size", examples=[256], derived="the block size")
    host_offload: HostOffload | None = table(
        "the host-memory (G2) KV tier of each rank: GPU blocks evicted with a prefix "
        "identity are written back to it, and a prefix found there is loaded back")
    g3_offload: dict[str, Any] | None = table(
        "G3 KV offload: not supported (refused)")  # diagnosed by the parse pass


@attrs.frozen
class Timing:
    """How long each pass takes: a registered timing provider and its inputs."""

    # a registered timing provider: built-in "default", "fixed", "polynomial", "table",
    # or a plugin's; checked against the registry by the parse pass
    type: str | None = key(
        "the timing provider: \"default\" (analytical), \"measured\" (kernel tables), "
        "\"fixed\", \"polynomial\", \"table\", or a plugin's", default="default",
        examples=["measured", "fixed"])
    prefill_ms: float | None = nonneg(STEP_MS, "type \"fixed\": time of a prompt pass",
                                      examples=[25.0])
    decode_ms: float | None = nonneg(STEP_MS, "type \"fixed\": time of a decode pass",
                                     examples=[8.0])
    path: str | None = key("type \"table\": the timing table file, relative to the config",
                           examples=["timing/h100_tp4.csv"])
    calibration: str | None = key(  # a servesim calibrate file, relative to the config
        "a `servesim calibrate` file whose fitted values scale this timing, relative to the "
        "config", examples=["calibrated.json"])
    options: dict[str, Any] | None = table(
        "the timing provider's own options, checked by its Options class (a plugin's; the "
        "built-ins take none)")


@attrs.frozen
class Worker:
    """One role's workers: hardware, parallelism, scheduler, KV cache and timing."""

    hardware: str | None = key(
        "catalog GPU of this role (disaggregated prefill/decode workers only)",
        examples=["h100_sxm"], derived="engine.hardware")
    startup_seconds: float | None = nonneg(
        SECONDS, "delay before a worker added during the run serves", default=0.0,
        examples=[30.0])
    parallelism: Parallelism | None = table("how each worker's GPUs split the model")
    scheduler: Scheduler | None = table("batch limits and pass policy of each rank")
    kv_cache: KvCache | None = table("the KV cache of each rank")
    timing: Timing | None = table("how long each pass takes")
    # a registered router by ``type`` (default "round_robin") and its options beside it;
    # checked against the registry by the parse pass (plugin_sections)
    routing: dict[str, Any] | None = table(
        "how requests are spread over this role's workers: type = \"round_robin\" "
        "(default), \"least_loaded\", \"session_affinity\", \"kv_aware\" or a plugin's, "
        "and the router's options")


@attrs.frozen
class Workers:
    """The roles: ``aggregated``, or ``prefill`` and ``decode`` (an empty table takes
    every default)."""

    aggregated: Worker | None = table("workers that run prompts and decoding (aggregated "
                                      "mode)")
    prefill: Worker | None = table("workers that run prompts (disaggregated mode)")
    decode: Worker | None = table("workers that decode (disaggregated mode)")


@attrs.frozen
class KvTransfer:
    """The prefill-to-decode KV link (disaggregated mode)."""

    bytes_per_token: int | Auto | None = positive(
        BYTES_PER_TOKEN, "KV bytes sent per prompt token (\"auto\": the prefill role's "
        "resolved kv_cache.bytes_per_token)", default="auto", examples=[327680])
    bandwidth_gb_per_second: float | None = key(
        "link bandwidth in GB/s (unset: no transfer delay)", *BANDWIDTH_GB_S,
        examples=[50.0])
    timing_mode: Literal["destination_missing", "full_prompt"] | None = key(
        "which tokens a transfer sends: those the decode rank lacks, or the whole prompt",
        default="destination_missing", examples=["full_prompt"])
    sharing: Literal["prefill_worker", "decode_worker", "none"] | None = key(
        "which transfers share one link's bandwidth (equally, recomputed as each starts or "
        "ends): those leaving one prefill worker, those reaching one decode worker, or none "
        "(each transfer has the whole bandwidth)", default="prefill_worker",
        examples=["decode_worker"])


@attrs.frozen
class Speculation:
    """Speculative decoding: drafts per step and the chance each is accepted."""

    kind: Literal["mtp", "ngram"] = required("the drafter: multi-token prediction or n-gram "
                                             "prompt lookup", examples=["mtp"])
    num_speculative_tokens: int = required("drafts proposed per step", examples=[3],
                                           lo=1, hi=5)
    acceptance_rates: list[float] = required(
        "one per draft: the chance draft i is accepted given all earlier ones were",
        examples=[[0.8, 0.6, 0.4]], lo=0.0, hi=1.0)
    seed: int | None = nonneg(U64_MAX, "seed of the acceptance draws", default=42,
                              examples=[7])


@attrs.frozen
class Engine:
    """The deployment: model, GPUs, serving backend, and its worker roles."""

    model: str = required("a catalog model id, or a folder holding a config.json (relative "
                          "to the config)", examples=["Qwen/Qwen3-32B"])
    hardware: str = required("catalog GPU of every worker", examples=["h200_sxm"])
    workers: Workers = required("the worker roles")
    mode: Literal["aggregated", "disaggregated", "afd"] | None = key(
        "aggregated workers, or disaggregated prefill and decode workers",
        default="aggregated", examples=["disaggregated"])
    backend: BackendName | None = key(  # vllm, sglang, trtllm, or a plugin's backend
        "the serving engine whose scheduling is simulated", default=DEFAULT_BACKEND,
        examples=["sglang"])
    backend_version: str | None = key(
        "the backend version the measured timing's kernel tables are read for",
        examples=["0.11.0"], derived="the newest version the kernel tables cover")
    context_length: int | Max | None = positive(
        CONTEXT, "longest sequence a request may reach (\"max\": the model's own on vLLM, "
        "unlimited elsewhere)", default="max", examples=[32768])
    kv_transfer: KvTransfer | None = table("the prefill-to-decode KV link (disaggregated mode)")
    speculation: Speculation | None = table("speculative decoding (unset: none)")
    nextn: int | None = key("legacy MTP: drafts per step (use [engine.speculation])", 0, 5,
                            default=0, examples=[1])
    nextn_accepted: float | None = key(
        "legacy MTP: expected accepted drafts per step, in [0, nextn]", 0.0, 5.0,
        examples=[0.8])
    enable_chunked_prefill: bool | None = key("split long prompts over passes",
                                              default=True, examples=[False])
    kvcache_quant_mode: QuantMode | None = key(
        "KV cache dtype (\"auto\": the model's)", default="auto", examples=["fp8"])
    gemm_quant_mode: QuantMode | None = key(
        "weight precision of the dense layers (\"auto\": the checkpoint's)", default="auto",
        examples=list(QUANT_EXAMPLES))
    moe_quant_mode: QuantMode | None = key(
        "weight precision of the routed experts (\"auto\": the dense layers', or the "
        "checkpoint's where it stores experts narrower)", default="auto",
        examples=list(QUANT_EXAMPLES))
    afd: dict[str, Any] | None = table(
        "attention-FFN disaggregation: not supported (refused)")  # diagnosed by the parse pass
    # the replay engine by registered name (default: "vllm", or "disagg" in disaggregated
    # mode) and its own options, structured by the engine's Options class
    engine: str | None = key("the replay engine, a registered name", examples=["vllm"],
                             derived="\"vllm\", or \"disagg\" in disaggregated mode")
    options: dict[str, Any] | None = table("the selected engine's own options")


@attrs.frozen
class Session:
    """Multi-turn sessions of a ``synthetic-session`` source."""

    turns: int | None = key("turns per session", 2, 10_000,
                            default=spec.default_of(spec.SessionSource, "turns"),
                            examples=[8])
    shared_prefix_ratio: float | None = key(
        "share of each first prompt common to its prefix group", 0.0, 1.0,
        default=spec.default_of(spec.SessionSource, "shared_prefix_ratio"), examples=[0.5])
    prefix_groups: int | None = nonneg(
        COUNT, "groups of sessions that share a prompt prefix",
        default=spec.default_of(spec.SessionSource, "prefix_groups"), examples=[4])
    inter_turn_delay_ms: float | None = nonneg(
        LATENCY_MS, "delay between a turn's answer and the next turn",
        default=spec.default_of(spec.SessionSource, "inter_turn_delay_ms"), examples=[1000.0])


@attrs.frozen
class Source:
    """Where requests come from: synthetic, synthetic sessions, or a trace file."""

    type: Literal["synthetic", "synthetic-session", "trace"] | None = key(
        "the request source", default="synthetic", examples=["trace"])
    input_tokens: int | LengthDistribution | None = positive(
        TOKENS, "synthetic: prompt tokens per request"
        " (a number, or a distribution table: { distribution = \"lognormal\", mean = 2000, "
        "std = 800 })",
        default=spec.default_of(spec.SyntheticSource, "input_tokens"), examples=[2048])
    output_tokens: int | LengthDistribution | None = nonneg(
        TOKENS, "synthetic: output tokens per request (the mean with output_range_ratio), "
        "or a distribution table",
        default=spec.default_of(spec.SyntheticSource, "output_tokens"), examples=[256])
    # output lengths spread uniformly over output_tokens x (1 -/+ ratio), as the benchmark
    # clients' --random-range-ratio does (synthetic source)
    output_range_ratio: float | None = key(
        "synthetic: output lengths spread evenly over output_tokens x (1 -/+ ratio)", 0.0,
        1.0, default=0.0, examples=[0.2])
    cached_prefix_tokens: int | None = nonneg(
        TOKENS, "synthetic: prompt tokens every request shares",
        default=spec.default_of(spec.SyntheticSource, "cached_prefix_tokens"),
        examples=[512])
    new_input_tokens_per_turn: int | LengthDistribution | None = positive(
        TOKENS, "synthetic-session: new prompt tokens per turn, or a distribution table",
        default=spec.default_of(spec.SessionSource, "new_input_tokens_per_turn"),
        examples=[512])
    output_tokens_per_turn: int | LengthDistribution | None = nonneg(
        TOKENS, "synthetic-session: output tokens per turn, or a distribution table",
        default=spec.default_of(spec.SessionSource, "output_tokens_per_turn"),
        examples=[256])
    session: Session | None = table("synthetic-session: the sessions' shape")
    paths: list[str] | None = key("trace: the trace file (one), relative to the config",
                                  examples=[["traces/mooncake.jsonl"]])
    format: str | None = key(  # a registered trace format; checked by the parse pass
        "trace: a registered trace format",
        default=spec.default_of(spec.TraceSource, "format"), examples=["mooncake-delta"])
    block_size: int | None = positive(
        BLOCK_SIZE, "trace: tokens per hash id of the trace",
        default=spec.default_of(spec.TraceSource, "block_size"), examples=[16])


@attrs.frozen
class Load:
    """How requests arrive: a closed loop, a rate, or the trace's timestamps."""

    type: Literal["concurrency", "poisson", "constant_rate", "gamma",
                  "trace_timestamps"] | None = key(
        "the arrival process", default="concurrency", examples=["poisson"])
    concurrency: int | None = positive(
        CONCURRENCY, "concurrency: requests (or sessions) in flight",
        default=spec.default_of(spec.ConcurrencyLoad, "concurrency"), examples=[64])
    requests_per_second: float | None = key(
        "poisson, gamma, constant_rate: request arrival rate (required)", 0.0, 1e7, lo_open=True,
        examples=[5.0])
    sessions_per_second: float | None = key(
        "poisson, constant_rate over sessions: session arrival rate (required)", 0.0, 1e7,
        lo_open=True, examples=[0.5])
    seed: int | None = nonneg(U64_MAX, "poisson, gamma: seed of the arrival times",
                              derived="traffic.seed (42 when unset)", examples=[7])
    cv: float | None = key(
        "gamma (required): the coefficient of variation of the gaps between arrivals "
        "(1: poisson; above 1: bursts and lulls)", 0.0, MAX_CV, lo_open=True, examples=[3.0])
    speedup: float | None = key(
        "trace_timestamps: divide the trace's timestamps by this", 0.0, 1e6, lo_open=True,
        default=spec.default_of(spec.TimestampLoad, "speedup"), examples=[2.0])


@attrs.frozen
class Stop:
    """When the replay ends (a trace also ends with its last row)."""

    requests: int | None = positive(COUNT, "requests to replay (a trace: its first rows)",
                                    default=100, examples=[1000],
                                    derived="100 for a synthetic source; a trace's every row")
    requests_per_load_unit: float | None = key(
        "synthetic: requests per unit of load (concurrency or rate)", 0.0, 1e9, lo_open=True,
        examples=[10.0])
    sessions: int | None = positive(COUNT, "synthetic-session: sessions to replay",
                                    default=100, examples=[200])
    sessions_per_load_unit: float | None = key(
        "synthetic-session: sessions per unit of load (concurrency or rate)", 0.0, 1e9,
        lo_open=True, examples=[10.0])
    max_virtual_time_seconds: float | None = key(
        "trace: replay the arrivals of this much virtual time", 0.0, 1e9, lo_open=True,
        examples=[600.0])


@attrs.frozen
class Traffic:
    """The workload (unset: 100 synthetic requests of 1024 + 128 tokens, 10 at a time)."""

    source: Source | None = table("where requests come from")
    load: Load | None = table("how requests arrive")
    stop: Stop | None = table("when the replay ends")
    seed: int | None = nonneg(
        U64_MAX, "seeds every draw: lengths, session prefix groups, poisson/gamma arrivals "
        "(traffic.load.seed, when set, seeds the arrivals)",
        default=spec.DEFAULT_POISSON_SEED, examples=[2026])


@attrs.frozen
class Sla:
    """Latency targets in ms: ttft_ms (time to first token), tpot_ms (each request's mean
    token gap), itl_ms (the gaps between a request's emissions), e2e_ms. Each is a number
    (a per-request bound: goodput counts the requests within every one) or a table of
    targets on the run's distribution, such as { p99 = 1000 } (keys: per_request, mean,
    median, p50, p75, p90, p95, p99, "p99.9", min, max). Deprecated: a number under
    itl_ms still bounds each request's mean gap; rename it to tpot_ms."""

    ttft_ms: SlaValue | None = key(
        "time to first token: a per-request bound, or targets such as { p99 = 1000 }", 0.0,
        LATENCY_MS, lo_open=True, examples=[1000.0, {"p99": 2000.0}])
    tpot_ms: SlaValue | None = key(
        "each request's mean gap between tokens: a per-request bound, or targets", 0.0,
        LATENCY_MS, lo_open=True, examples=[50.0, {"p90": 40.0}])
    itl_ms: SlaValue | None = key(
        "the gaps between a request's emissions: targets such as { p99 = 100 } (a bare "
        "number is deprecated: it still bounds each request's mean gap, as tpot_ms)", 0.0,
        LATENCY_MS, lo_open=True, examples=[{"p99": 100.0}])
    e2e_ms: SlaValue | None = key(
        "end-to-end latency: a per-request bound, or targets", 0.0, LATENCY_MS, lo_open=True,
        examples=[20000.0, {"p99": 30000.0}])


@attrs.frozen
class Evaluation:
    """How a replay is judged: SLA targets and GPU prices."""

    sla: Sla | None = table("latency targets (unset: goodput is not measured)")
    gpu_hour_usd: float | dict[str, float] | None = key(
        "USD per GPU-hour: one price for every GPU of the deployment, or a table by catalog "
        "GPU; over the shipped prices (the report's, sweep's and search's costs)",
        0.0, GPU_HOUR_USD, lo_open=True, examples=[2.5, {"h100_sxm": 2.5}])


@attrs.frozen
class ParsedConfig:
    """Stage 1 output: the TOML document, typed, with only authored values set."""

    engine: Engine = required("the deployment: model, GPUs, backend and worker roles")
    traffic: Traffic | None = table("the workload a replay drives")
    evaluation: Evaluation | None = table("how a replay is judged: SLA targets, GPU prices")

    def to_data(self) -> dict[str, Any]:
        """JSON-ready form, unauthored (``None``) values dropped."""
        import cattrs

        from servesim.payload import drop_none

        data: dict[str, Any] = drop_none(cattrs.Converter().unstructure(self))
        return data
