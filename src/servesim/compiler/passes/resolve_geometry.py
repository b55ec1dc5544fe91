"""Pass 2: resolve geometry.

Requires: a :class:`ParsedConfig` that passed the parse pass.
Establishes: a :class:`ResolvedConfig` whose per-role :class:`RoleArgs` hold the values
each role runs with (spec §3): backend defaults, KV bytes per token from the model,
pool size per attention-DP rank (fixed or estimated from GPU memory), state-cache
sizing (manual or inferred, with block-size enlargement), ``max_model_len``, canonical
speculation, KV-transfer bytes and the workload. Every value gets a provenance entry.

Example: Kimi K3 at TP8 with FP8 KV and a requested ``block_size = 128`` and
``state_cache = {}`` resolves ``block_size`` to ``1536 = 128 x ceil(814080/73728)``.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from pathlib import Path as PathLike
from typing import Any, Literal, TypeVar

import attrs

from servesim import backends, catalog, geometry, limits
from servesim.compiler.context import CompileContext
from servesim.compiler.model.parsed import (
    Capacity,
    Engine,
    KvCache,
    Load,
    Parallelism,
    ParsedConfig,
    Scheduler,
    Session,
    Sla,
    Source,
    Stop,
    Timing,
    Traffic,
    Worker,
)
from servesim.compiler.model.resolved import Origin, Provenance, ResolvedConfig
from servesim.compiler.plugin_sections import resolve_engine_options
from servesim.errors import CompileError, Diagnostic, Path, format_path
from servesim.payload import (
    CalibrationArgs,
    KvTransferArgs,
    Placement,
    RoleArgs,
    SlaArgs,
    SlaTarget,
    SpeculationArgs,
    StateCacheArgs,
    TimingArgs,
)
from servesim.sla import METRICS, PER_REQUEST

T = TypeVar("T")

INFERRED_STATE_DEFAULT_BLOCK = 64


class _Recorder:
    """Collects provenance and diagnostics while a config resolves."""

    def __init__(self) -> None:
        self.provenance: dict[str, Provenance] = {}
        self.diagnostics: list[Diagnostic] = []

    def pick(self, path: Path, authored: T | None, default: T, formula: str | None = None) -> T:
        """The authored value if set, else ``default`` (recorded as defaulted)."""
        if authored is not None:
            self.note(path, "authored")
            return authored
        self.note(path, "defaulted", formula)
        return default

    def note(self, path: Path, origin: Origin, formula: str | None = None) -> None:
        self.provenance[format_path(path)] = Provenance(origin, formula)

    def fail(self, path: Path, code: str, message: str, hint: str | None = None) -> None:
        self.diagnostics.append(Diagnostic(code=code, message=message, path=path, hint=hint,
                                           stage="resolve"))


def resolve_geometry(cfg: ParsedConfig, ctx: CompileContext) -> ResolvedConfig:
    """Resolve every role's geometry and the workload; raise CompileError on failures."""
    rec = _Recorder()
    e = cfg.engine
    mode: Literal["aggregated", "disaggregated"] = (
        "disaggregated" if e.mode == "disaggregated" else "aggregated")
    rec.pick(("engine", "mode"), e.mode, "aggregated")
    engine, engine_options, authored = resolve_engine_options(cfg, ctx)
    rec.pick(("engine", "engine"), e.engine, engine, f"the {mode} default")
    for key, was_authored in authored.items():
        rec.note(("engine", "options", key), "authored" if was_authored else "defaulted")
    backend: str = rec.pick(("engine", "backend"), e.backend, backends.DEFAULT_BACKEND)
    model = _lookup(rec, ("engine", "model"), e.model,
                    functools.partial(_load_model, base_dir=ctx.base_dir))
    if model is not None:
        try:
            geometry.kv_dtype_bytes(model, e.kvcache_quant_mode)
        except geometry.GeometryError:
            rec.fail(("engine", "kvcache_quant_mode"), "unsupported-kv-dtype",
                     f"{e.kvcache_quant_mode!r} is not a KV cache dtype; use \"auto\", "
                     "\"bfloat16\", \"float16\", \"float32\", \"fp8\" or \"int8\"")
            model = None
    speculation = _speculation(rec, e)
    weights = _weight_quant(e, model)
    roles: dict[str, RoleArgs] = {}
    metadata: dict[str, Any] = {}
    for name in ("aggregated", "prefill", "decode"):
        worker: Worker | None = getattr(e.workers, name)
        if worker is None:
            continue
        path: Path = ("engine", "workers", name)
        hw_name = worker.hardware or e.hardware
        rec.pick((*path, "hardware"), worker.hardware, e.hardware, "engine.hardware")
        gpu = _lookup(rec, (*path, "hardware") if worker.hardware else ("engine", "hardware"),
                      hw_name, catalog.load_gpu)
        if model is None or gpu is None:
            continue
        role, meta = _resolve_role(rec, name, worker, e, backend, model, gpu, speculation,
                                   weights, path, ctx.base_dir)
        if role is not None:
            roles[name] = role
            metadata[name] = meta
    kv_transfer = _kv_transfer(rec, e, roles) if mode == "disaggregated" else None
    workload = _workload(rec, cfg.traffic, ctx.base_dir)
    sla = _sla(cfg.evaluation.sla) if cfg.evaluation is not None else None
    if rec.diagnostics:
        raise CompileError(rec.diagnostics)
    return ResolvedConfig(parsed=cfg, engine=engine, engine_options=engine_options,
                          mode=mode, roles=roles, workload=workload, kv_transfer=kv_transfer,
                          sla=sla, provenance=rec.provenance, metadata=metadata)


def _sla(s: Sla | None) -> SlaArgs | None:
    """``[evaluation.sla]``: a number is a per-request bound, a table's entries are
    targets; a number under ``itl_ms`` keeps its first meaning (each request's mean gap)
    in the payload's ``itl_ms`` (see :mod:`servesim.sla`)."""
    if s is None:
        return None
    targets: list[SlaTarget] = []
    for metric in METRICS:
        value = getattr(s, metric)
        if isinstance(value, dict):
            targets += [SlaTarget(metric, stat, bound) for stat, bound in value.items()]
        elif value is not None and metric != "itl_ms":
            targets.append(SlaTarget(metric, PER_REQUEST, value))
    legacy = s.itl_ms if not isinstance(s.itl_ms, dict) else None
    return SlaArgs(itl_ms=legacy, targets=tuple(targets))


def _load_model(name: str, base_dir: PathLike | None) -> catalog.ModelInfo:
    """A catalog model, or a folder holding ``config.json``: like every path a config
    names, relative to the config's folder."""
    if base_dir is None or name in catalog.model_names():
        return catalog.load_model(name)
    folder = os.path.expanduser(name)
    if os.path.isabs(folder):
        return catalog.load_model(folder)
    anchored = os.path.join(base_dir, folder)
    if os.path.exists(anchored):
        return catalog.load_model(anchored)
    if not os.path.exists(folder):  # an unknown name: the catalog suggests close ones
        return catalog.load_model(name)
    raise catalog.CatalogError(
        f"no model folder {name!r} next to the config ({anchored}); a model folder is named "
        "relative to the config's folder, like a trace")


def _lookup(rec: _Recorder, path: Path, name: str, load: Callable[[str], T]) -> T | None:
    try:
        value = load(name)
    except catalog.CatalogError as exc:
        code = "bad-model-config" if isinstance(exc, catalog.ModelConfigError) \
            else f"unknown-{path[-1]}"
        rec.fail(path, code, str(exc))
        return None
    rec.note(path, "authored")
    return value


def _speculation(rec: _Recorder, e: Engine) -> SpeculationArgs | None:
    path: Path = ("engine", "speculation")
    if e.speculation is not None:
        s = e.speculation
        rec.note(path, "authored")
        return SpeculationArgs(kind=s.kind, num_speculative_tokens=s.num_speculative_tokens,
                               acceptance_rates=tuple(s.acceptance_rates),
                               seed=rec.pick((*path, "seed"), s.seed, 42))
    nextn = e.nextn or 0
    if nextn == 0 or e.nextn_accepted is None:
        return None
    rates = mtp_acceptance_rates(nextn, e.nextn_accepted)
    rec.note(path, "derived", f"legacy nextn = {nextn}, nextn_accepted = {e.nextn_accepted} "
             f"-> kind = \"mtp\", acceptance_rates = {list(rates)}")
    return SpeculationArgs(kind="mtp", num_speculative_tokens=nextn, acceptance_rates=rates,
                           seed=42)


def mtp_acceptance_rates(nextn: int, accepted: float) -> tuple[float, ...]:
    """Conditional rates for an expected ``accepted`` drafts (spec §4.2).

    >>> mtp_acceptance_rates(3, 2.2)
    (1.0, 1.0, 0.2)
    """
    whole = math.floor(accepted)
    rates = [1.0] * whole
    if len(rates) < nextn:
        rates.append(round(accepted - whole, 12))
    rates += [0.0] * (nextn - len(rates))
    return tuple(rates[:nextn])


def _resolve_role(rec: _Recorder, name: str, w: Worker, e: Engine, backend: str,
                  model: catalog.ModelInfo, gpu: catalog.GpuSpec,
                  speculation: SpeculationArgs | None, weights: _WeightQuant, path: Path,
                  base_dir: PathLike | None = None,
                  ) -> tuple[RoleArgs | None, dict[str, Any]]:
    par = w.parallelism or Parallelism()
    pp: Path = (*path, "parallelism")
    shape = {k: rec.pick((*pp, k), getattr(par, k), 1)
             for k in ("replicas", "tensor", "pipeline", "attention_data", "moe_tensor",
                       "moe_expert")}
    # moe_tensor x moe_expert repartition the attention GPUs (tensor x attention_data); left
    # at 1 x 1, the experts are split tensor-parallel over all of them, as vLLM does. The
    # memory estimate, the timing and the payload all read this one resolved shape.
    attention_gpus = shape["tensor"] * shape["attention_data"]
    if model.is_moe and attention_gpus > 1 and shape["moe_tensor"] * shape["moe_expert"] == 1:
        shape["moe_tensor"] = attention_gpus
        rec.note((*pp, "moe_tensor"), "derived",
                 f"tensor x attention_data = {attention_gpus}: with moe_tensor x moe_expert "
                 "left at 1, the experts are split tensor-parallel over the attention GPUs")
    sch = w.scheduler or Scheduler()
    sp: Path = (*path, "scheduler")
    max_batched_tokens = rec.pick(
        (*sp, "max_batched_tokens"), sch.max_batched_tokens,
        backends.policy_of(backend).default_token_budget(shape["attention_data"]),
        backends.policy_of(backend).token_budget_note)
    max_sequences = rec.pick((*sp, "max_sequences"), sch.max_sequences,
                             1 if name == "prefill" else 256,
                             "1 for the prefill role" if name == "prefill" else None)
    psi = rec.pick((*sp, "prefill_schedule_interval"), sch.prefill_schedule_interval, 1)
    pdi = rec.pick((*sp, "prefill_decode_interval"), sch.prefill_decode_interval, 0)
    balance = rec.pick((*sp, "attention_dp_balance"), sch.attention_dp_balance, False)
    timeout_iters = rec.pick((*sp, "attention_dp_timeout_iters"),
                             sch.attention_dp_timeout_iters, 50, "TensorRT-LLM default")
    wait_iters = rec.pick((*sp, "attention_dp_batching_wait_iters"),
                          sch.attention_dp_batching_wait_iters, 10, "TensorRT-LLM default")
    placement: Placement = rec.pick((*sp, "attention_dp_placement"),
                                    sch.attention_dp_placement, "round_robin")
    chunked = True
    if name != "decode":
        chunked = rec.pick((*path, "enable_chunked_prefill"), e.enable_chunked_prefill, True)
    kv = w.kv_cache or KvCache()
    kp: Path = (*path, "kv_cache")
    cap = kv.capacity or Capacity()
    prefix_caching = rec.pick((*kp, "prefix_caching"), kv.prefix_caching, True)
    meta: dict[str, Any] = {"state_cache": {"source": "disabled"}}
    kv_dtype = geometry.kv_dtype_bytes(model, e.kvcache_quant_mode)

    # KV bytes per token and block size (state-cache inference may enlarge the block)
    sc = kv.state_cache
    state: StateCacheArgs | None = None
    if sc is not None and sc.bytes_per_request is None:
        try:
            inf = geometry.infer_state_cache(
                model, tensor=shape["tensor"], pipeline=shape["pipeline"],
                requested_block_size=kv.block_size, kv_dtype_bytes=kv_dtype,
                bytes_per_token=kv.bytes_per_token if isinstance(kv.bytes_per_token, int)
                else None,
                mamba_cache_dtype=sc.mamba_cache_dtype or "auto",
                num_speculative_tokens=speculation.num_speculative_tokens if speculation else 0)
        except geometry.GeometryError as exc:
            rec.fail((*kp, "state_cache"), "state-cache-inference", str(exc))
            return None, meta
        block_size, bytes_per_token = inf.block_size, inf.bytes_per_token
        rec.note((*kp, "block_size"), "derived", _formula(inf.formula, "block_size"))
        rec.note((*kp, "bytes_per_token"), "authored" if isinstance(kv.bytes_per_token, int)
                 else "derived", _formula(inf.formula, "bytes_per_token"))
        state_bytes: int | None = inf.bytes_per_request
        raw, source = inf.raw_bytes_per_request, "inferred"
        rec.note((*kp, "state_cache", "bytes_per_request"), "derived",
                 _formula(inf.formula, "bytes_per_request"))
    else:
        block_size = rec.pick((*kp, "block_size"), kv.block_size,
                              backends.policy_of(backend).default_block_size,
                              f"{backend} default")
        if isinstance(kv.bytes_per_token, int):
            bytes_per_token = kv.bytes_per_token
            rec.note((*kp, "bytes_per_token"), "authored")
        else:
            try:
                bytes_per_token, formula = geometry.kv_bytes_per_token(
                    model, tensor=shape["tensor"], pipeline=shape["pipeline"],
                    kv_dtype_bytes=kv_dtype)
            except geometry.GeometryError as exc:
                rec.fail((*pp, "tensor"), "indivisible-heads", str(exc))
                return None, meta
            rec.note((*kp, "bytes_per_token"), "derived", formula)
        state_bytes = sc.bytes_per_request if sc is not None else None
        raw, source = None, "overridden"

    # pool size per attention-DP rank
    cpath: Path = (*kp, "capacity")
    if cap.blocks is not None:
        num_blocks = cap.blocks
        rec.note((*kp, "num_gpu_blocks"), "authored", "capacity.blocks")
    elif cap.bytes is not None:
        try:
            num_blocks, formula = geometry.fixed_blocks_from_bytes(cap.bytes, block_size,
                                                                   bytes_per_token)
        except geometry.GeometryError as exc:
            rec.fail((*cpath, "bytes"), "capacity-too-small", str(exc))
            return None, meta
        rec.note((*kp, "num_gpu_blocks"), "derived", formula)
    else:
        fraction = rec.pick((*cpath, "memory_fraction"), cap.memory_fraction,
                            backends.policy_of(backend).default_memory_fraction,
                            f"{backend} default")
        try:
            num_blocks, breakdown, formula = geometry.default_kv_blocks(
                model, gpu, backend=backend, tensor=shape["tensor"],
                pipeline=shape["pipeline"], moe_tensor=shape["moe_tensor"],
                moe_expert=shape["moe_expert"], max_batched_tokens=max_batched_tokens,
                memory_fraction=fraction,
                cuda_graph_reserved_bytes=cap.cuda_graph_reserved_bytes or 0,
                kv_bytes_per_token=bytes_per_token, block_size=block_size,
                weight_dtype_bytes=_weight_dtype_bytes(e.gemm_quant_mode),
                expert_dtype_bytes=_weight_dtype_bytes(e.moe_quant_mode))
        except geometry.GeometryError as exc:
            rec.fail(cpath, "no-kv-budget", str(exc))  # the message names the remedies
            return None, meta
        rec.note((*kp, "num_gpu_blocks"), "derived", formula)
        meta["capacity"] = breakdown

    if state_bytes is not None:
        bytes_per_request = state_bytes
        state_blocks, allocated = geometry.manual_state_cache(block_size, bytes_per_token,
                                                              bytes_per_request)
        state = StateCacheArgs(bytes_per_request=bytes_per_request, state_blocks=state_blocks,
                               allocated_bytes_per_request=allocated, source=source,  # type: ignore[arg-type]
                               raw_bytes_per_request=raw)
        rec.note((*kp, "state_cache", "state_blocks"), "derived",
                 f"ceil({bytes_per_request} / ({block_size} x {bytes_per_token})) = "
                 f"{state_blocks}")
        for key in ("allocated_bytes_per_request", "source", "raw_bytes_per_request"):
            rec.note((*kp, "state_cache", key), "derived" if source == "inferred" or
                     key == "allocated_bytes_per_request" else "authored",
                     f"state_blocks x block bytes = {allocated}"
                     if key == "allocated_bytes_per_request" else None)
        if source == "overridden":
            rec.note((*kp, "state_cache", "bytes_per_request"), "authored")
        meta["state_cache"] = {"source": source, "bytes_per_request": bytes_per_request,
                               "state_blocks": state_blocks,
                               "allocated_bytes_per_request": allocated,
                               "raw_bytes_per_request": raw}

    # context
    ctx_len = e.context_length if e.context_length is not None else "max"
    if isinstance(ctx_len, int):
        max_model_len: int | None = ctx_len
        rec.note((*path, "max_model_len"), "authored", "engine.context_length")
    elif backends.policy_of(backend).context_max_from_model:
        max_model_len = model.max_position_embeddings
        rec.note((*path, "max_model_len"), "derived",
                 f"context_length = \"max\": the model's max_position_embeddings "
                 f"{max_model_len}")
    else:
        max_model_len = None
        rec.note((*path, "max_model_len"), "defaulted", f"unlimited on {backend}")

    rec.note((*path, "worker_type"), "derived", f"the role name {name!r}")
    rec.note((*path, "backend"), "derived", f"engine.backend {backend!r}")
    rec.note((*path, "model"), "derived", f"engine.model {model.name!r}")
    rec.pick((*path, "preemption_mode"), None, "lifo", "vLLM default")
    rec.pick((*kp, "prefix_match_unit"), kv.prefix_match_unit, None, "the block size")
    if speculation is None:
        rec.note(("engine", "speculation"), "defaulted", "no speculative decoding")
    t = w.timing or Timing()
    table = t.path
    if table is not None and base_dir is not None and not PathLike(table).is_absolute():
        table = str(base_dir / table)  # like a trace path: relative to the config's folder
        rec.note((*path, "timing", "path"), "derived", f"{t.path} relative to the config's folder")
    timing_type = rec.pick((*path, "timing", "type"), t.type, "default")
    gemm_quant = moe_quant = kv_quant = version = None
    if timing_type in ("default", "measured"):
        gemm_quant, moe_quant = weights.gemm, weights.moe
        for key, why in (("gemm_quant", weights.gemm_why), ("moe_quant", weights.moe_why)):
            rec.note((*path, "timing", key), "derived" if why.startswith("engine.")
                     else "defaulted", why)
    if timing_type == "measured":
        kv_quant, version = _measured_keys(rec, e, path)
    timing = TimingArgs(type=timing_type, prefill_ms=t.prefill_ms, decode_ms=t.decode_ms,
                        path=table, gemm_quant=gemm_quant, moe_quant=moe_quant,
                        kv_quant=kv_quant, backend_version=version,
                        calibration=_calibration(rec, t.calibration, name, timing_type,
                                                 (*path, "timing"), base_dir))
    startup = rec.pick((*path, "startup_seconds"), w.startup_seconds, 0.0)
    role = RoleArgs(
        worker_type=name,  # type: ignore[arg-type]
        backend=backend, model=model.name, hardware=gpu.name, **shape,
        max_batched_tokens=max_batched_tokens, max_sequences=max_sequences,
        prefill_schedule_interval=psi, prefill_decode_interval=pdi,
        attention_dp_balance=balance, attention_dp_timeout_iters=timeout_iters,
        attention_dp_batching_wait_iters=wait_iters, attention_dp_placement=placement,
        enable_chunked_prefill=chunked, block_size=block_size, prefix_caching=prefix_caching,
        kv_bytes_per_token=bytes_per_token, num_gpu_blocks=num_blocks,
        max_model_len=max_model_len, prefix_match_unit=kv.prefix_match_unit, state_cache=state,
        timing=timing, speculation=speculation, startup_seconds=float(startup))
    return role, meta


def _measured_keys(rec: _Recorder, e: Engine, path: Path) -> tuple[str | None, str | None]:
    """The KV precision and backend version the measured timing prices a role with."""
    kv = e.kvcache_quant_mode
    kv_quant = kv if kv in ("fp8", "int8") else None
    rec.note((*path, "timing", "kv_quant"), "derived" if kv not in (None, "auto") else
             "defaulted", f"engine.kvcache_quant_mode {kv!r}" if kv not in (None, "auto")
             else "the model dtype")
    version = e.backend_version
    rec.note((*path, "timing", "backend_version"), "derived" if version else "defaulted",
             f"engine.backend_version {version!r}" if version
             else "the newest version the kernel tables cover")
    return kv_quant, version


def _calibration(rec: _Recorder, file: str | None, role: str, timing_type: str,
                 path: Path, base_dir: PathLike | None) -> CalibrationArgs | None:
    """The values the role's calibration file holds for it (relative to the config's
    folder, like every file a config names), each noted as derived from the file."""
    if file is None:
        return None
    from servesim.timing.calibration import (
        VALUE_FIELDS,
        CalibrationFileError,
        describe,
        read_calibration,
    )

    where = PathLike(file)
    if base_dir is not None and not where.is_absolute():
        where = base_dir / where
    try:
        values = read_calibration(where, role, timing_type)
    except CalibrationFileError as exc:
        d = exc.diagnostic
        rec.fail((*path, "calibration"), d.code, d.message, d.hint)
        return None
    rec.note((*path, "calibration"), "authored")
    for key in VALUE_FIELDS:
        rec.note((*path, "calibration", key), "derived", describe(values))
    return values


def _formula(lines: tuple[str, ...], name: str) -> str:
    """The provenance line of an inference that explains ``name``."""
    for line in lines:
        if line.startswith(name) or f" {name} " in line:
            return line
    return "; ".join(lines)


# Weight dtypes of the config -> their names in geometry.WEIGHT_QUANT (bytes and kernels),
# which the memory estimate and the default timing read.
_QUANT_NAMES = {"bfloat16": "bf16", "float16": "fp16", "fp8": "fp8", "fp8_block": "fp8_block",
                 "int8": "int8", "nvfp4": "nvfp4"}


@attrs.frozen
class _WeightQuant:
    """Weight precision the default timing prices (None: the checkpoint's), and why."""

    gemm: str | None = None
    moe: str | None = None
    gemm_why: str = ""
    moe_why: str = ""


def _weight_quant(e: Engine, model: catalog.ModelInfo | None) -> _WeightQuant:
    """The dense GEMMs follow ``engine.gemm_quant_mode``; the routed experts follow
    ``engine.moe_quant_mode``, else the GEMM mode, except that experts the checkpoint stores
    narrower than its other weights (gpt-oss's MXFP4) keep their own format: the memory
    estimate's rule (:func:`geometry.expert_weight_bytes`). Names are lowered to the timing's
    (a precision it cannot price, float32, is lowered as it is and refused by the validate
    pass's rule, :func:`geometry.unpriced_weight_quant`)."""
    def name(mode: str | None) -> str | None:
        return None if mode is None or mode == "auto" else _QUANT_NAMES.get(mode, mode)

    gemm = name(e.gemm_quant_mode)
    gemm_why = (f"engine.gemm_quant_mode {e.gemm_quant_mode!r}" if gemm
                else "the checkpoint's weight precision")
    wbytes = _weight_dtype_bytes(e.gemm_quant_mode)
    if model is not None and not model.is_moe:
        moe, moe_why = None, "no routed experts"
    elif e.moe_quant_mode not in (None, "auto"):
        moe, moe_why = name(e.moe_quant_mode), f"engine.moe_quant_mode {e.moe_quant_mode!r}"
    elif (gemm and wbytes is not None and model is not None
          and geometry.expert_weight_bytes(model, wbytes) == wbytes):
        moe, moe_why = gemm, f"engine.gemm_quant_mode {e.gemm_quant_mode!r} (the experts follow it)"
    else:
        moe, moe_why = None, "the checkpoint's expert precision"
    return _WeightQuant(gemm, moe, gemm_why, moe_why)


def _weight_dtype_bytes(quant_mode: str | None) -> float | None:
    """Bytes per weight of a config precision, scales included (None: the checkpoint's),
    from the table the timing prices them with."""
    if quant_mode is None or quant_mode == "auto":
        return None
    if quant_mode in _QUANT_NAMES:
        return geometry.WEIGHT_QUANT[_QUANT_NAMES[quant_mode]][0]
    return catalog.dtype_name_bytes(quant_mode)


def _kv_transfer(rec: _Recorder, e: Engine, roles: dict[str, RoleArgs]) -> KvTransferArgs | None:
    prefill = roles.get("prefill")
    if prefill is None:
        return None
    path: Path = ("engine", "kv_transfer")
    kt = e.kv_transfer
    authored_bpt = kt.bytes_per_token if kt is not None else None
    if isinstance(authored_bpt, int):
        bpt = authored_bpt
        rec.note((*path, "bytes_per_token"), "authored")
    else:
        bpt = prefill.kv_bytes_per_token
        rec.note((*path, "bytes_per_token"), "derived",
                 "the prefill role's resolved kv_cache.bytes_per_token")
    bandwidth = kt.bandwidth_gb_per_second if kt is not None else None
    rec.pick((*path, "bandwidth_gb_per_second"), bandwidth, None, "no transfer delay")
    mode: Literal["destination_missing", "full_prompt"] = rec.pick(
        (*path, "timing_mode"), kt.timing_mode if kt else None, "destination_missing")
    state_bytes = prefill.state_cache.bytes_per_request if prefill.state_cache else 0
    return KvTransferArgs(bytes_per_token=bpt, bandwidth_gb_per_second=bandwidth,
                          timing_mode=mode, state_bytes=state_bytes)


def _workload(rec: _Recorder, t: Traffic | None, base_dir: PathLike | None) -> dict[str, Any]:
    """The resolved traffic: source, load and stop with every default applied."""
    t = t or Traffic()
    src, load, stop = t.source or Source(), t.load or Load(), t.stop or Stop()
    sp: Path = ("traffic", "source")
    lp: Path = ("traffic", "load")
    stype = rec.pick((*sp, "type"), src.type, "synthetic")
    source: dict[str, Any] = {"type": stype}
    if stype == "synthetic":
        source["input_tokens"] = rec.pick((*sp, "input_tokens"), src.input_tokens, 1024)
        source["output_tokens"] = rec.pick((*sp, "output_tokens"), src.output_tokens, 128)
        if src.output_range_ratio is not None:  # written only when authored: 0 spreads nothing
            source["output_range_ratio"] = rec.pick((*sp, "output_range_ratio"),
                                                    float(src.output_range_ratio), 0.0)
        source["cached_prefix_tokens"] = rec.pick((*sp, "cached_prefix_tokens"),
                                                  src.cached_prefix_tokens, 0)
    elif stype == "synthetic-session":
        s = src.session or Session()
        source["new_input_tokens_per_turn"] = rec.pick(
            (*sp, "new_input_tokens_per_turn"), src.new_input_tokens_per_turn, 1024)
        source["output_tokens_per_turn"] = rec.pick(
            (*sp, "output_tokens_per_turn"), src.output_tokens_per_turn, 128)
        source["turns"] = rec.pick((*sp, "turns"), s.turns, 4)
        source["shared_prefix_ratio"] = float(rec.pick((*sp, "shared_prefix_ratio"),
                                                       s.shared_prefix_ratio, 0.0))
        source["prefix_groups"] = rec.pick((*sp, "prefix_groups"), s.prefix_groups, 0)
        source["inter_turn_delay_ms"] = float(rec.pick((*sp, "inter_turn_delay_ms"),
                                                       s.inter_turn_delay_ms, 0.0))
    else:
        assert src.paths is not None
        trace = PathLike(src.paths[0])
        if base_dir is not None and not trace.is_absolute():
            trace = base_dir / trace
            rec.note((*sp, "path"), "derived", f"{src.paths[0]} relative to the config's folder")
        else:
            rec.note((*sp, "path"), "authored")
        source["path"] = str(trace)
        source["format"] = rec.pick((*sp, "format"), src.format, "mooncake")
        source["block_size"] = rec.pick((*sp, "block_size"), src.block_size, 512)
    ltype = rec.pick((*lp, "type"), load.type, "concurrency")
    resolved_load: dict[str, Any] = {"type": ltype}
    unit: float = 1.0
    if ltype == "concurrency":
        unit = resolved_load["concurrency"] = rec.pick((*lp, "concurrency"), load.concurrency,
                                                       10)
    elif ltype in ("poisson", "constant_rate"):
        key = "sessions_per_second" if stype == "synthetic-session" else "requests_per_second"
        unit = resolved_load[key] = rec.pick((*lp, key), getattr(load, key), 1.0)
        if ltype == "poisson":
            resolved_load["seed"] = rec.pick((*lp, "seed"), load.seed, 42)
    else:
        resolved_load["speedup"] = rec.pick((*lp, "speedup"), load.speedup, 1.0)
    resolved_stop: dict[str, Any] = {}
    stp: Path = ("traffic", "stop")
    if stype == "trace":
        for key in ("requests", "max_virtual_time_seconds"):  # the first rows, or a time
            if getattr(stop, key) is not None:
                resolved_stop[key] = getattr(stop, key)
                rec.note((*stp, key), "authored")
    else:
        count_key = "sessions" if stype == "synthetic-session" else "requests"
        absolute, relative = getattr(stop, count_key), getattr(stop, f"{count_key}_per_load_unit")
        if relative is not None and absolute is None:
            # round, not ceil: 0.07 x 100 is 7.000000000000001 in floating point
            resolved_stop[count_key] = derived = max(1, round(relative * unit))
            if derived > limits.COUNT:
                rec.fail((*stp, f"{count_key}_per_load_unit"), "stop-over-limit",
                         f"{relative:g} x the load unit {unit:g} is {derived} {count_key}, more "
                         f"than {limits.COUNT}", f"lower {count_key}_per_load_unit")
            rec.note((*stp, count_key), "derived",
                     f"max(1, round({relative} x {unit})) ({count_key}_per_load_unit x load unit)")
        else:
            resolved_stop[count_key] = rec.pick((*stp, count_key), absolute, 100)
    return {"source": source, "load": resolved_load, "stop": resolved_stop}
