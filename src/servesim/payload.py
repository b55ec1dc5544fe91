"""The resolved, engine-facing form of a deployment: per-role engine arguments.

The compiler's resolve pass produces these values, the validate pass checks them with
:mod:`servesim.rules`, the lower pass writes them as JSON, and an engine reads them back
(and re-checks them with the same rules) when it accepts a payload. Nothing here is a
*requested* value: ``block_size`` is the block size the role runs with, after
state-cache enlargement; ``num_gpu_blocks`` is the pool size per attention-DP rank.

Schema versioning: ``SCHEMA_VERSION`` is bumped only on an incompatible change.
Engines refuse a payload whose ``schema_version`` they do not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from servesim import codes
from servesim import limits as L
from servesim.limits import bounded
from servesim.workloads.spec import WorkloadSpec, located, workload_to_data

SCHEMA_VERSION = 1

Role = Literal["aggregated", "prefill", "decode"]
# Which attention-DP rank of a worker a new request joins
Placement = Literal["round_robin", "least_loaded"]
ROLES: tuple[Role, ...] = ("aggregated", "prefill", "decode")


@attrs.frozen
class CalibrationArgs:
    """Corrections ``servesim calibrate`` fitted to a role's timing (read from the
    calibration file the config names): prompt work and decode steps scaled, a fixed
    time added per decode pass, and per request to the front end (also per 1,000 prompt
    tokens). Neutral values change nothing."""

    prefill_scale: float = bounded(L.CALIBRATION_SCALE[0], L.CALIBRATION_SCALE[1], default=1.0)
    decode_scale: float = bounded(L.CALIBRATION_SCALE[0], L.CALIBRATION_SCALE[1], default=1.0)
    decode_step_ms: float = bounded(-L.CALIBRATION_MS, L.CALIBRATION_MS, default=0.0)
    front_end_ms: float = bounded(-L.CALIBRATION_MS, L.CALIBRATION_MS, default=0.0)
    front_end_ms_per_1k_tokens: float = bounded(-L.CALIBRATION_MS, L.CALIBRATION_MS,
                                                default=0.0)
    file: str | None = None  # the calibration file's name and hash (provenance)
    sha256: str | None = None


@attrs.frozen
class TimingArgs:
    """Step-time provider of a role: ``fixed``, ``polynomial``, ``default``, ``table``,
    ``measured``."""

    type: str = "default"
    prefill_ms: float | None = bounded(0, L.STEP_MS)
    decode_ms: float | None = bounded(0, L.STEP_MS)
    path: str | None = None  # table timing: CSV file
    # default and measured timing: weight precision of the dense GEMMs and of the routed
    # experts, as the analytical model names them (None: the checkpoint's own)
    gemm_quant: str | None = None
    moe_quant: str | None = None
    # measured timing: the KV cache's precision ("fp8", None: the model dtype) and the
    # backend version whose kernel tables price the passes (None: the newest covered)
    kv_quant: str | None = None
    backend_version: str | None = None
    calibration: CalibrationArgs | None = None  # from a calibration file, any timing type
    # the provider's own options (its Options class, defaults applied); None: it has none
    options: dict[str, Any] | None = None


@attrs.frozen
class RoutingArgs:
    """How requests are spread over a role's workers: a registered router and its options
    (defaults applied). A role without one is routed round-robin. Added in v1 (additive)."""

    type: str = "round_robin"
    options: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class SpeculationArgs:
    """Canonical speculative decoding; legacy ``nextn`` lowers to ``kind = "mtp"``."""

    kind: Literal["mtp", "ngram"]
    num_speculative_tokens: int = attrs.field(metadata={"lo": 1, "hi": 5})
    acceptance_rates: tuple[float, ...] = attrs.field(metadata={"lo": 0.0, "hi": 1.0})
    seed: int = bounded(0, L.U64_MAX, default=42)


@attrs.frozen
class StateCacheArgs:
    """Per-request recurrent state held in the same block pool as token KV."""

    bytes_per_request: int = attrs.field(metadata={"lo": 1, "hi": L.U64_MAX})
    state_blocks: int = attrs.field(metadata={"lo": 1, "hi": L.BLOCKS})
    allocated_bytes_per_request: int = attrs.field(metadata={"lo": 1, "hi": 2**128})
    source: Literal["overridden", "inferred"] = "overridden"
    raw_bytes_per_request: int | None = None


@attrs.frozen
class HostOffloadArgs:
    """The host-memory (G2) KV tier of each attention-DP rank: ``capacity_blocks`` blocks
    of the role's geometry behind a link of ``bandwidth_gb_per_second`` (decimal GB/s)
    that write-backs and loads of the rank share. Added in v1 (additive)."""

    capacity_blocks: int = attrs.field(metadata={"lo": 1, "hi": L.BLOCKS})
    bandwidth_gb_per_second: float = attrs.field(
        metadata={"lo": L.BANDWIDTH_GB_S[0], "hi": L.BANDWIDTH_GB_S[1]})
    write_back: Literal["on_evict"] = "on_evict"


# Where a RoleArgs field lives in the config, under ``engine.workers.<role>``: its section
# (``config_section``) and, where it differs from the field's name, its key (``config_key``).
# The payload keeps every role field flat; the config nests them by section.
PARALLELISM = {"config_section": "parallelism"}
SCHEDULER = {"config_section": "scheduler"}
KV_CACHE = {"config_section": "kv_cache"}


def _in(section: Mapping[str, str], default: Any = None) -> Any:
    """An unbounded field of a config section."""
    return attrs.field(default=default, metadata=section)


@attrs.frozen
class RoleArgs:
    """Fully resolved engine arguments of one worker role."""

    worker_type: Role
    backend: str
    model: str
    hardware: str
    replicas: int = bounded(1, L.REPLICAS, default=1, metadata=PARALLELISM)
    tensor: int = bounded(1, L.PARALLEL, default=1, metadata=PARALLELISM)
    pipeline: int = bounded(1, L.PARALLEL, default=1, metadata=PARALLELISM)
    attention_data: int = bounded(1, L.PARALLEL, default=1, metadata=PARALLELISM)
    moe_tensor: int = bounded(1, L.PARALLEL, default=1, metadata=PARALLELISM)
    moe_expert: int = bounded(1, L.PARALLEL, default=1, metadata=PARALLELISM)
    max_batched_tokens: int = bounded(1, L.SCHEDULER, default=8192, metadata=SCHEDULER)
    max_sequences: int = bounded(1, L.SCHEDULER, default=256, metadata=SCHEDULER)
    prefill_schedule_interval: int = bounded(1, L.SCHEDULER, default=1, metadata=SCHEDULER)
    prefill_decode_interval: int = bounded(0, L.SCHEDULER, default=0, metadata=SCHEDULER)
    # TensorRT-LLM attention_dp_config: enable_balance, timeout_iters, batching_wait_iters
    attention_dp_balance: bool = _in(SCHEDULER, False)
    attention_dp_timeout_iters: int = bounded(0, L.SCHEDULER, default=50, metadata=SCHEDULER)
    attention_dp_batching_wait_iters: int = bounded(0, L.SCHEDULER, default=10,
                                                    metadata=SCHEDULER)
    attention_dp_placement: Placement = _in(SCHEDULER, "round_robin")
    enable_chunked_prefill: bool = True
    preemption_mode: Literal["lifo", "fifo"] = "lifo"
    # KV cache (per attention-DP rank, per TP shard)
    block_size: int = bounded(1, L.BLOCK_SIZE, default=64, metadata=KV_CACHE)
    prefix_caching: bool = _in(KV_CACHE, True)
    kv_bytes_per_token: int = bounded(1, L.BYTES_PER_TOKEN, default=1,
                                      metadata={**KV_CACHE, "config_key": "bytes_per_token"})
    num_gpu_blocks: int = bounded(1, L.BLOCKS, default=16384, metadata=KV_CACHE)
    max_model_len: int | None = bounded(1, L.CONTEXT)
    prefix_match_unit: int | None = bounded(1, L.BLOCK_SIZE, metadata=KV_CACHE)
    state_cache: StateCacheArgs | None = _in(KV_CACHE)
    host_offload: HostOffloadArgs | None = _in(KV_CACHE)
    # timing and decoding (speculation is the engine's, shared by every role)
    timing: TimingArgs = attrs.field(factory=TimingArgs)
    speculation: SpeculationArgs | None = attrs.field(
        default=None, metadata={"config_path": ("engine", "speculation")})
    startup_seconds: float = bounded(0, L.SECONDS, default=0.0)
    routing: RoutingArgs | None = None  # engine.workers.<role>.routing; None: round-robin

    @property
    def gpus_per_worker(self) -> int:
        return self.tensor * self.pipeline * self.attention_data

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_worker


@attrs.frozen
class KvTransferArgs:
    """P/D KV transfer: (tokens * bytes_per_token + state_bytes) over a link of the
    bandwidth, which the transfers on one link share (``sharing``: which transfers do)."""

    bytes_per_token: int = attrs.field(metadata={"lo": 1, "hi": L.BYTES_PER_TOKEN})
    bandwidth_gb_per_second: float | None = bounded(*L.BANDWIDTH_GB_S)
    timing_mode: Literal["destination_missing", "full_prompt"] = "destination_missing"
    state_bytes: int = bounded(0, L.U64_MAX, default=0)
    # Added in v1 (additive).
    sharing: Literal["prefill_worker", "decode_worker", "none"] = "prefill_worker"


SlaMetric = Literal["ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"]


@attrs.frozen
class SlaTarget:
    """One SLA bound: ``metric`` (``ttft_ms``, ``tpot_ms``, ``itl_ms``, ``e2e_ms``) checked
    ``per_request`` (every completed request, the goodput test) or as a statistic of the
    run's distribution (``mean``, ``median``, ``p50`` ... ``p99.9``, ``max``)."""

    metric: SlaMetric
    stat: str
    bound: float = bounded(0, L.LATENCY_MS, lo_open=True)


@attrs.frozen
class SlaArgs:
    """The SLA of ``[evaluation.sla]``: every bound is in ``targets``.

    ``ttft_ms``, ``itl_ms`` and ``e2e_ms`` are the payload's first per-request bounds,
    read as before: ``itl_ms`` bounds each request's *mean* token gap, i.e. its TPOT
    (deprecated; the compiler writes it only for the deprecated config spelling
    ``itl_ms = N``). ``targets`` was added in v1 (additive).
    """

    ttft_ms: float | None = bounded(0, L.LATENCY_MS, lo_open=True)
    itl_ms: float | None = bounded(0, L.LATENCY_MS, lo_open=True)
    e2e_ms: float | None = bounded(0, L.LATENCY_MS, lo_open=True)
    targets: tuple[SlaTarget, ...] = ()


@attrs.frozen
class GpuPriceArgs:
    """The price of one GPU type of the deployment: USD per GPU-hour, and whether it is the
    shipped catalog's or the config's (``[evaluation] gpu_hour_usd``)."""

    usd_per_hour: float = attrs.field(metadata={"lo": 0.0, "hi": L.GPU_HOUR_USD,
                                                "lo_open": True})
    source: Literal["catalog", "config"] = "catalog"


@attrs.frozen
class Payload:
    """The versioned document an engine replays."""

    engine: str
    mode: Literal["aggregated", "disaggregated"]
    roles: dict[str, RoleArgs]
    workload: WorkloadSpec
    kv_transfer: KvTransferArgs | None = None
    sla: SlaArgs | None = None
    provenance: dict[str, Any] = attrs.field(factory=dict)
    # The engine's own options ([engine.options]), structured by its Options class with
    # defaults applied; {} for an engine without options. Added in v1 (additive).
    engine_options: dict[str, Any] = attrs.field(factory=dict)
    # The price of each GPU type the roles run on (by hardware name), for the report's
    # costs; a GPU without one has no cost. Added in v1 (additive).
    gpu_hour_usd: dict[str, GpuPriceArgs] = attrs.field(factory=dict)
    schema_version: int = SCHEMA_VERSION
    servesim_version: str = ""

    def to_data(self) -> dict[str, Any]:
        """JSON-ready form (see :func:`payload_to_dict`)."""
        return payload_to_dict(self)


def payload_to_dict(payload: Payload) -> dict[str, Any]:
    """JSON-ready form (``None`` fields dropped inside roles for readability)."""
    import cattrs

    conv = cattrs.Converter()
    data: dict[str, Any] = conv.unstructure(payload)
    data["roles"] = {name: drop_none(role) for name, role in data["roles"].items()}
    data["workload"] = workload_to_data(payload.workload)
    return data


def drop_none(value: Any) -> Any:
    """``value`` with ``None`` entries dropped from every dict in it (unset optional keys)."""
    if isinstance(value, dict):
        return {k: drop_none(v) for k, v in value.items() if v is not None}
    return value


def dump_payload(payload: Payload, *, relative_to: str | None = None) -> str:
    """Deterministic JSON text: sorted keys, two-space indent, trailing newline.

    A trace path is written relative to ``relative_to`` (the folder the payload file
    goes to), so a payload stays valid when its folder moves with the trace.
    """
    import json
    import os

    data = payload_to_dict(payload)
    if relative_to is not None:
        def relative(path: str) -> str:
            if not os.path.isabs(path):
                return path
            return os.path.relpath(path, relative_to).replace(os.sep, "/")

        map_paths(data, relative)
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def map_paths(data: dict[str, Any], fn: Any, *, models: bool = True) -> None:
    """Apply ``fn`` to every file path a payload dict names (trace, timing tables) and, with
    ``models``, every model folder (a model that is not a catalog name)."""
    from servesim.catalog import model_names

    workload, roles = data.get("workload"), data.get("roles")  # not checked yet: any JSON
    source = workload.get("source") if isinstance(workload, dict) else None
    if isinstance(source, dict) and isinstance(source.get("path"), str):
        source["path"] = fn(source["path"])
    for length in source.values() if isinstance(source, dict) else ():  # empirical lengths
        if isinstance(length, dict) and isinstance(length.get("path"), str):
            length["path"] = fn(length["path"])
    for role in roles.values() if isinstance(roles, dict) else ():
        timing = role.get("timing") if isinstance(role, dict) else None
        if isinstance(timing, dict) and isinstance(timing.get("path"), str):
            timing["path"] = fn(timing["path"])
        model = role.get("model") if isinstance(role, dict) else None
        if models and isinstance(model, str) and model not in model_names():
            role["model"] = fn(model)


def payload_files(payload: Payload) -> list[str]:
    """The files a replay of ``payload`` reads, as named: see :func:`files_named`."""
    return files_named(payload_to_dict(payload))


def files_named(data: dict[str, Any]) -> list[str]:
    """The files a payload dict (or a resolved config's) names: its trace, its timing
    tables and the ``config.json`` of each model folder."""
    import os
    from functools import partial

    files: list[str] = []
    named: list[str] = []  # the same, and model folders

    def collect(into: list[str], path: str) -> str:
        into.append(path)
        return path

    map_paths(data, partial(collect, files), models=False)
    map_paths(data, partial(collect, named))
    files += [os.path.join(p, "config.json") for p in named if p not in files]
    return [*dict.fromkeys(files)]


def anchor_paths(data: dict[str, Any], folder: str) -> None:
    """Make the relative paths of a payload file's dict absolute, relative to ``folder``.
    A model named as a Hugging Face id (``org/name``) stays a name unless ``folder`` holds
    a folder of that name."""
    import os

    from servesim.catalog.hub import is_repo_id

    def anchored(path: str) -> str:
        return path if os.path.isabs(path) else os.path.join(folder, path)

    map_paths(data, anchored, models=False)
    map_paths(data, lambda p: p if is_repo_id(p) and not os.path.isdir(anchored(p))
              else anchored(p))


def load_payload(data: Any, *, name: str = "payload") -> Payload:
    """Structure a decoded JSON payload strictly; raise PayloadError naming each problem.

    Checks the schema version first (an unknown version is refused before anything else
    is read), then types and unknown keys. The shared rules are the engine's job
    (:meth:`servesim.engines.base.Engine.validate_payload`).
    """
    from servesim.converter import make_converter, structure
    from servesim.errors import Diagnostic, PayloadError

    if not isinstance(data, dict):
        raise PayloadError([Diagnostic(code=codes.PAYLOAD_NOT_OBJECT, location=name,
                                       message="a payload must be a JSON object")])
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        if "schema_version" not in data:
            problem = "the payload has no schema_version"
        elif str(version) == str(SCHEMA_VERSION):  # the string "1"
            problem = (f"schema_version is the {type(version).__name__} {version!r}, not the "
                       f"number {SCHEMA_VERSION}")
        else:
            problem = f"unsupported payload schema_version {version!r:.40}"
        raise PayloadError([Diagnostic(
            code=codes.PAYLOAD_VERSION, path=("schema_version",),
            message=f"{problem}; this servesim reads version {SCHEMA_VERSION}",
            hint="recompile the config with this servesim")])
    conv = make_converter()
    payload, diags = structure(conv, data, Payload)
    if payload is None:
        raise PayloadError(located(diags))
    return payload


def role_field_path(role: str, field: str) -> tuple[str, ...]:
    """Config key path of a RoleArgs field, from the field's metadata
    (``kv_bytes_per_token`` is ``engine.workers.<role>.kv_cache.bytes_per_token``)."""
    f = attrs.fields_dict(RoleArgs).get(field)
    meta: Mapping[str, Any] = f.metadata if f is not None else {}
    if "config_path" in meta:
        return tuple(meta["config_path"])
    key = meta.get("config_key", field)
    section = meta.get("config_section")
    base = ("engine", "workers", role)
    return (*base, section, key) if section else (*base, key)
