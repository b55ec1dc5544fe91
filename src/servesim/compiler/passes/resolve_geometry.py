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

from servesim import backends, catalog, codes, geometry, limits
from servesim.backends import Backend
from servesim.compiler.context import CompileContext
from servesim.compiler.model.parsed import (
    Capacity,
    Engine,
    KvCache,
    KvTransfer,
    Load,
    Parallelism,
    ParsedConfig,
    Scheduler,
    Session,
    Sla,
    Source,
    Speculation,
    Stop,
    Timing,
    Traffic,
    Worker,
    default_of,
)
from servesim.compiler.model.resolved import Origin, Provenance, ResolvedConfig
from servesim.compiler.plugin_sections import (
    resolve_engine_options,
    resolve_routing,
    resolve_timing_options,
)
from servesim.errors import CompileError, Diagnostic, Path, format_path
from servesim.payload import (
    CalibrationArgs,
    GpuPriceArgs,
    HostOffloadArgs,
    KvTransferArgs,
    Payload,
    Placement,
    RoleArgs,
    RoutingArgs,
    SlaArgs,
    SlaTarget,
    SpeculationArgs,
    StateCacheArgs,
    TimingArgs,
)
from servesim.sla import METRICS, PER_REQUEST
from servesim.sweep import pricing
from servesim.version import __version__
from servesim.workloads import lengths, spec
from servesim.workloads.lengths import LengthDistribution
from servesim.workloads.spec import WorkloadSpec

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

    def take(self, path: Path, table: Any, name: str, formula: str | None = None) -> Any:
        """``table.name`` if authored, else the default its field declares (``parsed``)."""
        return self.pick((*path, name), getattr(table, name), default_of(type(table), name),
                         formula)

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
    rec.take(("engine",), e, "mode")
    engine, engine_options, authored = resolve_engine_options(cfg, ctx)
    rec.pick(("engine", "engine"), e.engine, engine, f"the {mode} default")
    for key, was_authored in authored.items():
        rec.note(("engine", "options", key), "authored" if was_authored else "defaulted")
    backend: str = rec.take(("engine",), e, "backend")
    model = _model(rec, e, ctx.base_dir)
    roles, metadata = _roles(rec, e, backends.policy_of(backend, ctx.registry.backends),
                             model, ctx.base_dir,
                             resolve_timing_options(cfg, ctx))
    roles = _routing(rec, e, roles, resolve_routing(cfg, ctx))
    kv_transfer = _kv_transfer(rec, e, roles) if mode == "disaggregated" else None
    workload = _workload(rec, cfg.traffic, ctx.base_dir)
    sla = _sla(cfg.evaluation.sla) if cfg.evaluation is not None else None
    prices = _gpu_prices(rec, cfg.evaluation.gpu_hour_usd if cfg.evaluation else None, roles)
    if rec.diagnostics:
        raise CompileError(rec.diagnostics)
    payload = Payload(engine=engine, mode=mode, roles=roles, workload=workload,
                      kv_transfer=kv_transfer, sla=sla, provenance=_summary(metadata),
                      engine_options=engine_options, gpu_hour_usd=prices,
                      servesim_version=__version__)
    return ResolvedConfig(parsed=cfg, payload=payload, provenance=rec.provenance,
                          metadata=metadata)


def _model(rec: _Recorder, e: Engine, base_dir: PathLike | None) -> catalog.ModelInfo | None:
    """The model the config names, if found and its KV cache dtype is one it can hold."""
    model = _lookup(rec, ("engine", "model"), e.model,
                    functools.partial(_load_model, base_dir=base_dir))
    if model is not None:
        try:
            geometry.kv_dtype_bytes(model, e.kvcache_quant_mode)
        except geometry.GeometryError:
            rec.fail(("engine", "kvcache_quant_mode"), codes.UNSUPPORTED_KV_DTYPE,
                     f"{e.kvcache_quant_mode!r} is not a KV cache dtype; use \"auto\", "
                     "\"bfloat16\", \"float16\", \"float32\", \"fp8\" or \"int8\"")
            model = None
    return model


def _roles(rec: _Recorder, e: Engine, policy: Backend, model: catalog.ModelInfo | None,
           base_dir: PathLike | None, timing_options: dict[str, dict[str, Any] | None],
           ) -> tuple[dict[str, RoleArgs], dict[str, Any]]:
    """Every configured role's engine arguments, and its sizing metadata."""
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
        role, meta = _resolve_role(
            rec, _Role(name, worker, e, policy, model, gpu, path, base_dir,
                       timing_options[name]), speculation,
            weights)
        if role is not None:
            roles[name] = role
            metadata[name] = meta
    return roles, metadata


def _routing(rec: _Recorder, e: Engine, roles: dict[str, RoleArgs],
             routing: dict[str, RoutingArgs]) -> dict[str, RoleArgs]:
    """The roles with the routing their config writes (the others: round-robin)."""
    for name, args in routing.items():
        if name in roles:
            table = getattr(e.workers, name).routing
            for key in ("type", *args.options):
                rec.note(("engine", "workers", name, "routing", key),
                         "authored" if key in table else "defaulted")
            roles[name] = attrs.evolve(roles[name], routing=args)
    return roles


def _summary(metadata: dict[str, Any]) -> dict[str, Any]:
    """The payload's provenance: each role's state-cache and capacity sizing."""
    return {
        "state_cache": {name: meta.get("state_cache", {"source": "disabled"})
                        for name, meta in metadata.items()},
        "capacity": {name: meta["capacity"] for name, meta in metadata.items()
                     if "capacity" in meta},
    }


def _gpu_prices(rec: _Recorder, authored: pricing.Authored,
                roles: dict[str, RoleArgs]) -> dict[str, GpuPriceArgs]:
    """The price of each GPU type the roles run on (a GPU the catalog does not price has
    none, and no cost)."""
    out: dict[str, GpuPriceArgs] = {}
    for hardware in dict.fromkeys(role.hardware for role in roles.values()):
        price = pricing.gpu_hour_price(hardware, authored)
        if price is None:
            continue
        out[hardware] = price
        path = (*pricing.PRICE_PATH, hardware)
        if price.source == "config":
            rec.note(path, "authored")
        else:
            rec.note(path, "defaulted", "the catalog's indicative price")
    return out


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
        rec.fail(path, catalog.error_code(exc, "model" if path[-1] == "model" else "hardware"),
                 str(exc))
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
                               seed=rec.take(path, s, "seed"))
    nextn = e.nextn or 0
    if nextn == 0 or e.nextn_accepted is None:
        return None
    rates = mtp_acceptance_rates(nextn, e.nextn_accepted)
    rec.note(path, "derived", f"legacy nextn = {nextn}, nextn_accepted = {e.nextn_accepted} "
             f"-> kind = \"mtp\", acceptance_rates = {list(rates)}")
    return SpeculationArgs(kind="mtp", num_speculative_tokens=nextn, acceptance_rates=rates,
                           seed=default_of(Speculation, "seed"))


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


@attrs.frozen
class _Role:
    """What every section resolver of one worker role reads."""

    name: str
    worker: Worker
    engine: Engine
    policy: Backend  # the registered backend's
    model: catalog.ModelInfo
    gpu: catalog.GpuSpec
    path: Path
    base_dir: PathLike | None = None
    timing_options: dict[str, Any] | None = None  # the provider's, defaults applied

    @property
    def backend(self) -> str:
        return self.policy.NAME


@attrs.frozen
class _KvGeometry:
    """Block size and KV bytes per token, and the state-cache bytes they were sized with."""

    block_size: int
    bytes_per_token: int
    state_bytes: int | None = None
    raw: int | None = None
    source: str = "overridden"


def _resolve_role(rec: _Recorder, role: _Role, speculation: SpeculationArgs | None,
                  weights: _WeightQuant) -> tuple[RoleArgs | None, dict[str, Any]]:
    """One role's engine arguments, a resolver per config section."""
    meta: dict[str, Any] = {"state_cache": {"source": "disabled"}}
    shape = _parallelism(rec, role)
    scheduler = _scheduler(rec, role, shape["attention_data"])
    kv = role.worker.kv_cache or KvCache()
    prefix_caching = rec.take((*role.path, "kv_cache"), kv, "prefix_caching")
    geo = _kv_geometry(rec, role, shape, speculation)
    if geo is None:
        return None, meta
    num_blocks = _capacity(rec, role, shape, scheduler["max_batched_tokens"], geo, meta)
    if num_blocks is None:
        return None, meta
    state = _state_cache(rec, role, geo, meta)
    host = _host_offload(rec, role, geo)
    max_model_len = _context(rec, role)
    _note_fixed(rec, role, kv, speculation)
    timing = _timing(rec, role, weights)
    startup = rec.take(role.path, role.worker, "startup_seconds")
    sections: dict[str, Any] = {**shape, **scheduler}
    return RoleArgs(
        worker_type=role.name,  # type: ignore[arg-type]
        backend=role.backend, model=role.model.name, hardware=role.gpu.name, **sections,
        block_size=geo.block_size, prefix_caching=prefix_caching,
        kv_bytes_per_token=geo.bytes_per_token, num_gpu_blocks=num_blocks,
        max_model_len=max_model_len, prefix_match_unit=kv.prefix_match_unit, state_cache=state,
        host_offload=host,
        timing=timing, speculation=speculation, startup_seconds=float(startup)), meta


def _parallelism(rec: _Recorder, role: _Role) -> dict[str, int]:
    par = role.worker.parallelism or Parallelism()
    pp: Path = (*role.path, "parallelism")
    shape = {k: rec.take(pp, par, k)
             for k in ("replicas", "tensor", "pipeline", "attention_data", "moe_tensor",
                       "moe_expert")}
    # moe_tensor x moe_expert repartition the attention GPUs (tensor x attention_data); left
    # at 1 x 1, the experts are split tensor-parallel over all of them, as vLLM does. The
    # memory estimate, the timing and the payload all read this one resolved shape.
    attention_gpus = shape["tensor"] * shape["attention_data"]
    if role.model.is_moe and attention_gpus > 1 and shape["moe_tensor"] * shape["moe_expert"] == 1:
        shape["moe_tensor"] = attention_gpus
        rec.note((*pp, "moe_tensor"), "derived",
                 f"tensor x attention_data = {attention_gpus}: with moe_tensor x moe_expert "
                 "left at 1, the experts are split tensor-parallel over the attention GPUs")
    return shape


def _scheduler(rec: _Recorder, role: _Role, attention_data: int) -> dict[str, Any]:
    """The scheduler section's RoleArgs fields (and chunked prefill, an engine key)."""
    name, path = role.name, role.path
    sch = role.worker.scheduler or Scheduler()
    sp: Path = (*path, "scheduler")
    max_batched_tokens = rec.pick(
        (*sp, "max_batched_tokens"), sch.max_batched_tokens,
        role.policy.default_token_budget(attention_data),
        role.policy.token_budget_note)
    max_sequences = rec.pick((*sp, "max_sequences"), sch.max_sequences,
                             1 if name == "prefill" else default_of(Scheduler, "max_sequences"),
                             "1 for the prefill role" if name == "prefill" else None)
    psi = rec.take(sp, sch, "prefill_schedule_interval")
    pdi = rec.take(sp, sch, "prefill_decode_interval")
    balance = rec.take(sp, sch, "attention_dp_balance")
    timeout_iters = rec.take(sp, sch, "attention_dp_timeout_iters", "TensorRT-LLM default")
    wait_iters = rec.take(sp, sch, "attention_dp_batching_wait_iters", "TensorRT-LLM default")
    placement: Placement = rec.take(sp, sch, "attention_dp_placement")
    chunked = True
    if name != "decode":
        chunked = rec.pick((*path, "enable_chunked_prefill"), role.engine.enable_chunked_prefill,
                           default_of(Engine, "enable_chunked_prefill"))
    return dict(max_batched_tokens=max_batched_tokens, max_sequences=max_sequences,
                prefill_schedule_interval=psi, prefill_decode_interval=pdi,
                attention_dp_balance=balance, attention_dp_timeout_iters=timeout_iters,
                attention_dp_batching_wait_iters=wait_iters, attention_dp_placement=placement,
                enable_chunked_prefill=chunked)


def _kv_geometry(rec: _Recorder, role: _Role, shape: dict[str, int],
                 speculation: SpeculationArgs | None) -> _KvGeometry | None:
    """KV bytes per token and block size (state-cache inference may enlarge the block)."""
    model, e, backend = role.model, role.engine, role.backend
    kv = role.worker.kv_cache or KvCache()
    kp: Path = (*role.path, "kv_cache")
    kv_dtype = geometry.kv_dtype_bytes(model, e.kvcache_quant_mode)
    sc = kv.state_cache
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
            rec.fail((*kp, "state_cache"), codes.STATE_CACHE_INFERENCE, str(exc))
            return None
        rec.note((*kp, "block_size"), "derived", _formula(inf.formula, "block_size"))
        rec.note((*kp, "bytes_per_token"), "authored" if isinstance(kv.bytes_per_token, int)
                 else "derived", _formula(inf.formula, "bytes_per_token"))
        rec.note((*kp, "state_cache", "bytes_per_request"), "derived",
                 _formula(inf.formula, "bytes_per_request"))
        return _KvGeometry(inf.block_size, inf.bytes_per_token, inf.bytes_per_request,
                           inf.raw_bytes_per_request, "inferred")
    block_size = rec.pick((*kp, "block_size"), kv.block_size,
                          role.policy.default_block_size,
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
            rec.fail((*role.path, "parallelism", "tensor"), codes.INDIVISIBLE_HEADS, str(exc))
            return None
        rec.note((*kp, "bytes_per_token"), "derived", formula)
    return _KvGeometry(block_size, bytes_per_token,
                       sc.bytes_per_request if sc is not None else None)


def _capacity(rec: _Recorder, role: _Role, shape: dict[str, int], max_batched_tokens: int,
              geo: _KvGeometry, meta: dict[str, Any]) -> int | None:
    """The pool size per attention-DP rank: authored, from bytes, or from GPU memory."""
    model, gpu, e, backend = role.model, role.gpu, role.engine, role.backend
    kv = role.worker.kv_cache or KvCache()
    cap = kv.capacity or Capacity()
    kp: Path = (*role.path, "kv_cache")
    cpath: Path = (*kp, "capacity")
    block_size, bytes_per_token = geo.block_size, geo.bytes_per_token
    if cap.blocks is not None:
        rec.note((*kp, "num_gpu_blocks"), "authored", "capacity.blocks")
        return cap.blocks
    if cap.bytes is not None:
        try:
            num_blocks, formula = geometry.fixed_blocks_from_bytes(cap.bytes, block_size,
                                                                   bytes_per_token)
        except geometry.GeometryError as exc:
            rec.fail((*cpath, "bytes"), codes.CAPACITY_TOO_SMALL, str(exc))
            return None
        rec.note((*kp, "num_gpu_blocks"), "derived", formula)
        return num_blocks
    fraction = rec.pick((*cpath, "memory_fraction"), cap.memory_fraction,
                        role.policy.default_memory_fraction,
                        f"{backend} default")
    try:
        num_blocks, breakdown, formula = geometry.default_kv_blocks(
            model, gpu, backend=role.policy, tensor=shape["tensor"],
            pipeline=shape["pipeline"], moe_tensor=shape["moe_tensor"],
            moe_expert=shape["moe_expert"], max_batched_tokens=max_batched_tokens,
            memory_fraction=fraction,
            cuda_graph_reserved_bytes=cap.cuda_graph_reserved_bytes
            or default_of(Capacity, "cuda_graph_reserved_bytes"),
            kv_bytes_per_token=bytes_per_token, block_size=block_size,
            weight_dtype_bytes=_weight_dtype_bytes(e.gemm_quant_mode),
            expert_dtype_bytes=_weight_dtype_bytes(e.moe_quant_mode))
    except geometry.GeometryError as exc:
        rec.fail(cpath, codes.NO_KV_BUDGET, str(exc))  # the message names the remedies
        return None
    rec.note((*kp, "num_gpu_blocks"), "derived", formula)
    meta["capacity"] = breakdown
    return num_blocks


def _state_cache(rec: _Recorder, role: _Role, geo: _KvGeometry,
                 meta: dict[str, Any]) -> StateCacheArgs | None:
    """The per-request recurrent state, in blocks of the resolved geometry."""
    if geo.state_bytes is None:
        return None
    kp: Path = (*role.path, "kv_cache")
    block_size, bytes_per_token, source, raw = (geo.block_size, geo.bytes_per_token,
                                                geo.source, geo.raw)
    bytes_per_request = geo.state_bytes
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
    return state


def _host_offload(rec: _Recorder, role: _Role, geo: _KvGeometry) -> HostOffloadArgs | None:
    """The host (G2) tier: its capacity in whole blocks of the role's geometry, and its
    link (the GPU's PCIe bandwidth in the catalog unless given)."""
    host = (role.worker.kv_cache or KvCache()).host_offload
    if host is None or (host.capacity_blocks is None and host.capacity_gb is None):
        return None  # the parse pass reported a missing capacity
    hp: Path = (*role.path, "kv_cache", "host_offload")
    if host.capacity_blocks is not None:
        blocks = host.capacity_blocks
        rec.note((*hp, "capacity_blocks"), "authored")
    else:
        assert host.capacity_gb is not None
        block_bytes = geo.block_size * geo.bytes_per_token
        blocks = int(host.capacity_gb * 1e9) // block_bytes
        if blocks < 1:
            rec.fail((*hp, "capacity_gb"), codes.HOST_OFFLOAD_CAPACITY,
                     f"{host.capacity_gb:g} GB holds no KV block of {block_bytes} bytes "
                     f"({geo.block_size} tokens x {geo.bytes_per_token} B)",
                     "raise capacity_gb or give capacity_blocks")
            return None
        rec.note((*hp, "capacity_blocks"), "derived",
                 f"floor({host.capacity_gb:g} GB / ({geo.block_size} x "
                 f"{geo.bytes_per_token} B)) = {blocks}")
    bandwidth = host.bandwidth_gb_per_second
    if bandwidth is None:
        if role.gpu.pcie_bw is None:
            rec.fail((*hp, "bandwidth_gb_per_second"), codes.HOST_OFFLOAD_BANDWIDTH,
                     f"the catalog gives {role.gpu.name} no PCIe bandwidth to default to",
                     "set bandwidth_gb_per_second (e.g. 64 for PCIe 5.0 x16)")
            return None
        bandwidth = role.gpu.pcie_bw / 1e9
        rec.note((*hp, "bandwidth_gb_per_second"), "derived",
                 f"{role.gpu.name} PCIe bandwidth in the catalog: {bandwidth:g} GB/s")
    else:
        rec.note((*hp, "bandwidth_gb_per_second"), "authored")
    write_back = rec.take(hp, host, "write_back")
    return HostOffloadArgs(capacity_blocks=blocks, bandwidth_gb_per_second=bandwidth,
                           write_back=write_back)


def _context(rec: _Recorder, role: _Role) -> int | None:
    """``max_model_len``: authored, the model's own on vLLM, else unlimited."""
    e, backend, model, path = role.engine, role.backend, role.model, role.path
    ctx_len = e.context_length if e.context_length is not None else "max"
    if isinstance(ctx_len, int):
        max_model_len: int | None = ctx_len
        rec.note((*path, "max_model_len"), "authored", "engine.context_length")
    elif role.policy.context_max_from_model:
        max_model_len = model.max_position_embeddings
        rec.note((*path, "max_model_len"), "derived",
                 f"context_length = \"max\": the model's max_position_embeddings "
                 f"{max_model_len}")
    else:
        max_model_len = None
        rec.note((*path, "max_model_len"), "defaulted", f"unlimited on {backend}")
    return max_model_len


def _note_fixed(rec: _Recorder, role: _Role, kv: KvCache,
                speculation: SpeculationArgs | None) -> None:
    """Provenance of the values a role takes as they are (its name, the engine's keys)."""
    name, backend, model, path = role.name, role.backend, role.model, role.path
    kp: Path = (*path, "kv_cache")
    rec.note((*path, "worker_type"), "derived", f"the role name {name!r}")
    rec.note((*path, "backend"), "derived", f"engine.backend {backend!r}")
    rec.note((*path, "model"), "derived", f"engine.model {model.name!r}")
    rec.pick((*path, "preemption_mode"), None, "lifo", "vLLM default")
    rec.pick((*kp, "prefix_match_unit"), kv.prefix_match_unit, None, "the block size")
    if speculation is None:
        rec.note(("engine", "speculation"), "defaulted", "no speculative decoding")


def _timing(rec: _Recorder, role: _Role, weights: _WeightQuant) -> TimingArgs:
    """The step-time provider and the precisions it prices, with any calibration."""
    e, name, path, base_dir = role.engine, role.name, role.path, role.base_dir
    t = role.worker.timing or Timing()
    table = t.path
    if table is not None and base_dir is not None and not PathLike(table).is_absolute():
        table = str(base_dir / table)  # like a trace path: relative to the config's folder
        rec.note((*path, "timing", "path"), "derived", f"{t.path} relative to the config's folder")
    timing_type = rec.take((*path, "timing"), t, "type")
    gemm_quant = moe_quant = kv_quant = version = None
    if timing_type in ("default", "measured"):
        gemm_quant, moe_quant = weights.gemm, weights.moe
        for key, why in (("gemm_quant", weights.gemm_why), ("moe_quant", weights.moe_why)):
            rec.note((*path, "timing", key), "derived" if why.startswith("engine.")
                     else "defaulted", why)
    if timing_type == "measured":
        kv_quant, version = _measured_keys(rec, e, path)
    for key in role.timing_options or {}:
        rec.note((*path, "timing", "options", key),
                 "authored" if key in (t.options or {}) else "defaulted")
    return TimingArgs(type=timing_type, prefill_ms=t.prefill_ms, decode_ms=t.decode_ms,
                      path=table, gemm_quant=gemm_quant, moe_quant=moe_quant,
                      kv_quant=kv_quant, backend_version=version,
                      calibration=_calibration(rec, t.calibration, name, timing_type,
                                               (*path, "timing"), base_dir),
                      options=role.timing_options)


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
    mode: Literal["destination_missing", "full_prompt"] = rec.take(path, kt or KvTransfer(),
                                                                   "timing_mode")
    sharing: Literal["prefill_worker", "decode_worker", "none"] = rec.take(
        path, kt or KvTransfer(), "sharing")
    state_bytes = prefill.state_cache.bytes_per_request if prefill.state_cache else 0
    return KvTransferArgs(bytes_per_token=bpt, bandwidth_gb_per_second=bandwidth,
                          timing_mode=mode, state_bytes=state_bytes, sharing=sharing)


def _workload(rec: _Recorder, t: Traffic | None, base_dir: PathLike | None) -> WorkloadSpec:
    """The resolved traffic: source, load and stop with every default applied."""
    t = t or Traffic()
    source = _source(rec, t.source or Source(), base_dir)
    load, unit = _load(rec, t.load or Load(), source.type, t.seed)
    if source.type != "trace":
        source = attrs.evolve(source, seed=_length_seed(rec, t.seed, source, load))
    return WorkloadSpec(source, load, _stop(rec, t.stop or Stop(), source.type, unit))


def _length_seed(rec: _Recorder, seed: int | None, source: spec.SyntheticSource
                 | spec.SessionSource, load: spec.Load) -> int | None:
    """The seed of drawn lengths (and session prefix groups): ``traffic.seed``, else, when
    a length is drawn, the arrivals' (None: nothing drawn, as before)."""
    path: Path = ("traffic", "source", "seed")
    if seed is not None:
        rec.note(path, "derived", "traffic.seed")
        return seed
    if not any(isinstance(v, LengthDistribution) for v in attrs.astuple(source, recurse=False)):
        return None
    arrivals = load.arrival_seed if isinstance(load, spec.RateLoad) else spec.DEFAULT_POISSON_SEED
    rec.note(path, "defaulted", "the arrivals' seed")
    return arrivals


def _length(rec: _Recorder, path: Path, authored: Any, default: int,
            base_dir: PathLike | None) -> Any:
    """A fixed length, or a length table with its empirical file relative to the config."""
    value = rec.pick(path, authored, default)
    if not isinstance(value, LengthDistribution) or value.path is None:
        return value
    file = PathLike(value.path)
    if base_dir is not None and not file.is_absolute():
        file = base_dir / file
    return attrs.evolve(value, path=str(file),
                        format=value.format or lengths.empirical_format(value.path))


def _source(rec: _Recorder, src: Source, base_dir: PathLike | None) -> spec.Source:
    sp: Path = ("traffic", "source")
    stype = rec.take(sp, src, "type")

    def length(key: str, authored: Any, cls: type) -> Any:
        return _length(rec, (*sp, key), authored, spec.default_of(cls, key), base_dir)

    if stype == "synthetic":
        ratio = None
        if src.output_range_ratio is not None:  # written only when authored: 0 spreads nothing
            ratio = float(rec.take(sp, src, "output_range_ratio"))
        return spec.SyntheticSource(
            input_tokens=length("input_tokens", src.input_tokens, spec.SyntheticSource),
            output_tokens=length("output_tokens", src.output_tokens, spec.SyntheticSource),
            output_range_ratio=ratio,
            cached_prefix_tokens=rec.take(sp, src, "cached_prefix_tokens"))
    if stype == "synthetic-session":
        s, cls = src.session or Session(), spec.SessionSource
        return cls(  # (the session's provenance is noted under traffic.source)
            new_input_tokens_per_turn=length("new_input_tokens_per_turn",
                                             src.new_input_tokens_per_turn, cls),
            output_tokens_per_turn=length("output_tokens_per_turn", src.output_tokens_per_turn,
                                          cls),
            turns=rec.take(sp, s, "turns"),
            shared_prefix_ratio=float(rec.take(sp, s, "shared_prefix_ratio")),
            prefix_groups=rec.take(sp, s, "prefix_groups"),
            inter_turn_delay_ms=float(rec.take(sp, s, "inter_turn_delay_ms")))
    assert src.paths is not None
    trace = PathLike(src.paths[0])
    if base_dir is not None and not trace.is_absolute():
        trace = base_dir / trace
        rec.note((*sp, "path"), "derived", f"{src.paths[0]} relative to the config's folder")
    else:
        rec.note((*sp, "path"), "authored")
    return spec.TraceSource(path=str(trace),
                            format=rec.take(sp, src, "format"),
                            block_size=rec.take(sp, src, "block_size"))


def _load(rec: _Recorder, load: Load, stype: str, seed: int | None
          ) -> tuple[spec.Load, float]:
    """The resolved load, and its load unit (concurrency or rate) for relative stops."""
    lp: Path = ("traffic", "load")
    ltype: Any = rec.take(lp, load, "type")
    if ltype == "concurrency":
        concurrency = rec.take(lp, load, "concurrency")
        return spec.ConcurrencyLoad(concurrency=concurrency), concurrency
    if ltype in ("poisson", "constant_rate", "gamma"):
        key = "sessions_per_second" if stype == "synthetic-session" else "requests_per_second"
        rate = getattr(load, key)
        assert rate is not None  # the parse pass requires the rate of an open loop
        rec.note((*lp, key), "authored")
        arrival_seed = cv = None
        if ltype != "constant_rate":
            if load.seed is None and seed is not None:
                arrival_seed = seed
                rec.note((*lp, "seed"), "derived", "traffic.seed")
            else:
                arrival_seed = rec.pick((*lp, "seed"), load.seed, spec.DEFAULT_POISSON_SEED)
        if ltype == "gamma":
            cv = rec.pick((*lp, "cv"), load.cv, 1.0)
        return spec.RateLoad(type=ltype, seed=arrival_seed, cv=cv, **{key: rate}), rate
    speedup = rec.take(lp, load, "speedup")
    return spec.TimestampLoad(speedup=speedup), 1.0


def _stop(rec: _Recorder, stop: Stop, stype: str, unit: float) -> spec.Stop:
    stp: Path = ("traffic", "stop")
    if stype == "trace":
        for key in ("requests", "max_virtual_time_seconds"):  # the first rows, or a time
            if getattr(stop, key) is not None:
                rec.note((*stp, key), "authored")
        return spec.Stop(requests=stop.requests,
                         max_virtual_time_seconds=stop.max_virtual_time_seconds)
    count_key = "sessions" if stype == "synthetic-session" else "requests"
    absolute, relative = getattr(stop, count_key), getattr(stop, f"{count_key}_per_load_unit")
    if relative is not None and absolute is None:
        # round, not ceil: 0.07 x 100 is 7.000000000000001 in floating point
        count = max(1, round(relative * unit))
        if count > limits.COUNT:
            rec.fail((*stp, f"{count_key}_per_load_unit"), codes.STOP_OVER_LIMIT,
                     f"{relative:g} x the load unit {unit:g} is {count} {count_key}, more "
                     f"than {limits.COUNT}", f"lower {count_key}_per_load_unit")
        rec.note((*stp, count_key), "derived",
                 f"max(1, round({relative} x {unit})) ({count_key}_per_load_unit x load unit)")
    else:
        count = rec.take(stp, stop, count_key)
    return spec.Stop(**{count_key: count})
