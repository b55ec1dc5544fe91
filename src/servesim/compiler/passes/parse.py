"""Pass 1: parse.

Requires: a TOML document (:class:`SourceText`).
Establishes: a :class:`ParsedConfig` whose values have the right types and ranges and
whose *authored shape* is consistent (roles match the mode, capacity keys match the
capacity type, load keys match the load type, ...), and whose plugin-defined values
(``engine.engine``, ``[engine.options]``, timing types, trace formats) are registered
and well-typed (:mod:`servesim.compiler.plugin_sections`). Rules that need resolved
geometry run later, in :mod:`servesim.rules`.

Example: ``[engine] model = "Qwen/Qwen3-32B"`` with ``hardware = "h200_sxm"`` and
``[engine.workers.aggregated]`` parses; the same with ``[engine.workers.decode]`` added
fails with ``engine.workers: aggregated mode rejects prefill/decode workers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from servesim import codes
from servesim.compiler.context import CompileContext
from servesim.compiler.model.parsed import (
    Capacity,
    Engine,
    KvCache,
    Load,
    ParsedConfig,
    Sla,
    Source,
    Stop,
    Traffic,
    Worker,
)
from servesim.compiler.plugin_sections import check_plugin_sections
from servesim.compiler.source import SourceText, load_toml
from servesim.converter import check_limits, make_converter, structure
from servesim.errors import CompileError, Diagnostic, Path, error
from servesim.payload import drop_none
from servesim.sweep.pricing import check_price_names
from servesim.traffic_rules import check_traffic
from servesim.workloads.lengths import LengthDistribution


def parse(source: SourceText, ctx: CompileContext) -> ParsedConfig:
    """Parse and type-check a config document; raise CompileError with every problem."""
    data = load_toml(source)
    cfg, diags = structure(make_converter(ctx.registry.backends), data, ParsedConfig)
    if cfg is None:
        raise CompileError([_staged(d) for d in diags])
    diags = check_limits(cfg) + list(check_shape(cfg)) \
        + check_plugin_sections(cfg, ctx.registry)
    if diags:
        raise CompileError([_staged(d) for d in diags])
    return cfg


def _staged(d: Diagnostic) -> Diagnostic:
    from attrs import evolve

    return evolve(d, stage="parse")


def check_shape(cfg: ParsedConfig) -> Iterator[Diagnostic]:
    """Rules on the authored shape of the document (spec V1-V7, V15-V20, V35, V38, V46, V49-V53)."""
    yield from _engine(cfg.engine)
    yield from _traffic(cfg.traffic)
    sla = cfg.evaluation.sla if cfg.evaluation else None
    yield from check_price_names(cfg.evaluation.gpu_hour_usd if cfg.evaluation else None)
    if sla is not None:
        yield from _sla(sla)


def _sla(sla: Sla) -> Iterator[Diagnostic]:
    for f in attrs.fields(Sla):
        if getattr(sla, f.name) == {}:
            yield error(codes.SLA_EMPTY, ("evaluation", "sla", f.name),
                        "an empty table sets no target",
                        f"write a number (a per-request bound) or targets such as "
                        f"{f.name} = {{ p99 = 1000 }}")


def _engine(e: Engine) -> Iterator[Diagnostic]:
    root: Path = ("engine",)
    for key in ("model", "hardware"):
        if not getattr(e, key).strip():
            yield error(codes.EMPTY_VALUE, (*root, key), "value must be nonempty")
    if e.hardware.strip() == "auto":
        yield error(codes.NOT_SUPPORTED, ("engine", "hardware"),
                    "'auto' hardware is recommendation-only and not supported; name one GPU, "
                    "e.g. \"h200_sxm\"")
    mode = e.mode or "aggregated"
    if mode == "afd" or e.afd is not None:
        path = (*root, "afd") if e.afd is not None else (*root, "mode")
        yield error(codes.NOT_SUPPORTED, path, "attention-FFN disaggregation (afd) is not "
                    "supported; use mode = \"aggregated\" or \"disaggregated\"")
    w = e.workers
    roles = {name: getattr(w, name) for name in ("aggregated", "prefill", "decode")}
    if mode == "aggregated":
        if roles["aggregated"] is None:
            yield error(codes.MISSING_ROLE, (*root, "workers", "aggregated"),
                        "aggregated mode requires workers.aggregated",
                        "add an [engine.workers.aggregated] table (it may be empty)")
        if roles["prefill"] is not None or roles["decode"] is not None:
            yield error(codes.ROLE_MODE_MISMATCH, (*root, "workers"),
                        "aggregated mode rejects prefill/decode workers",
                        "set engine.mode = \"disaggregated\" or remove them")
        if e.kv_transfer is not None:
            yield error(codes.ROLE_MODE_MISMATCH, (*root, "kv_transfer"),
                        "aggregated mode rejects kv_transfer")
    elif mode == "disaggregated":
        if roles["prefill"] is None or roles["decode"] is None:
            missing = [r for r in ("prefill", "decode") if roles[r] is None]
            yield error(codes.MISSING_ROLE, (*root, "workers", missing[0]),
                        "disaggregated mode requires prefill and decode workers")
        if roles["aggregated"] is not None:
            yield error(codes.ROLE_MODE_MISMATCH, (*root, "workers", "aggregated"),
                        "disaggregated mode rejects aggregated workers")
    for name, worker in roles.items():
        if worker is not None:
            yield from _worker(name, worker, mode, (*root, "workers", name))
    yield from _speculation(e)


def _worker(name: str, w: Worker, mode: str, path: Path) -> Iterator[Diagnostic]:
    if w.hardware is not None:
        if mode != "disaggregated" or name == "aggregated":
            yield error(codes.HARDWARE_OVERRIDE, (*path, "hardware"),
                        "worker hardware overrides require prefill/decode workers in "
                        "disaggregated mode")
        elif w.hardware != w.hardware.strip() or w.hardware.strip() in ("", "auto"):
            yield error(codes.HARDWARE_OVERRIDE, (*path, "hardware"),
                        "must be one concrete nonempty hardware identifier, got "
                        f"{w.hardware!r}")
    if w.kv_cache is not None:
        yield from _kv_cache(w.kv_cache, (*path, "kv_cache"))


def _kv_cache(kv: KvCache, path: Path) -> Iterator[Diagnostic]:
    if kv.g3_offload is not None:
        yield error(codes.NOT_SUPPORTED, (*path, "g3_offload"),
                    "g3_offload (the G3 KV tier: disk or remote storage) is not supported; "
                    "remove it (host_offload, the G2 host-memory tier, is)")
    host = kv.host_offload
    if host is not None and (host.capacity_blocks is None) == (host.capacity_gb is None):
        yield error(codes.HOST_OFFLOAD_CAPACITY, (*path, "host_offload"),
                    "host_offload needs exactly one of capacity_blocks or capacity_gb",
                    "e.g. host_offload = { capacity_gb = 256 }")
    cap = kv.capacity or Capacity()
    cpath = (*path, "capacity")
    if cap.type == "fixed":
        if cap.blocks is None and cap.bytes is None:
            yield error(codes.CAPACITY_FIXED, cpath, "fixed KV capacity requires blocks or bytes")
        if cap.blocks is not None and cap.bytes is not None:
            yield error(codes.CAPACITY_FIXED, cpath, "fixed KV capacity accepts only one of blocks "
                        "or bytes")
        if cap.memory_fraction is not None:
            yield error(codes.CAPACITY_FIXED, (*cpath, "memory_fraction"),
                        "fixed KV capacity rejects memory_fraction")
        if cap.cuda_graph_reserved_bytes not in (None, 0):
            yield error(codes.CAPACITY_FIXED, (*cpath, "cuda_graph_reserved_bytes"),
                        "fixed KV capacity rejects cuda_graph_reserved_bytes")
    elif cap.blocks is not None or cap.bytes is not None:
        key = "blocks" if cap.blocks is not None else "bytes"
        yield error(codes.CAPACITY_DEFAULT, (*cpath, key),
                    "default KV capacity rejects blocks or bytes",
                    "set capacity.type = \"fixed\" to give the pool size")
    sc = kv.state_cache
    manual = sc is not None and sc.bytes_per_request is not None
    if cap.bytes is not None or manual:
        why = "manual state_cache" if manual else "fixed KV capacity in bytes"
        if kv.block_size is None and not (sc is not None and not manual):
            yield error(codes.MANUAL_GEOMETRY, (*path, "block_size"),
                        f"manual KV capacity requires explicit positive block_size ({why})")
        if (kv.bytes_per_token is None or kv.bytes_per_token == "auto") and not (
                sc is not None and not manual):
            yield error(codes.MANUAL_GEOMETRY, (*path, "bytes_per_token"),
                        f"manual KV capacity requires explicit positive bytes_per_token ({why})")
    if sc is not None and cap.type != "fixed":
        yield error(codes.STATE_CACHE_CAPACITY, (*path, "state_cache"),
                    "state_cache requires fixed capacity (blocks or bytes)",
                    "set capacity = { type = \"fixed\", blocks = N }")


def _speculation(e: Engine) -> Iterator[Diagnostic]:
    root: Path = ("engine",)
    nextn = e.nextn or 0
    if e.speculation is not None:
        s = e.speculation
        if len(s.acceptance_rates) != s.num_speculative_tokens:
            yield error(codes.SPECULATION_RATES, (*root, "speculation", "acceptance_rates"),
                        "acceptance_rates must contain one conditional probability per "
                        f"speculative token: {s.num_speculative_tokens} expected, got "
                        f"{len(s.acceptance_rates)}")
        if nextn > 0:
            yield error(codes.SPECULATION_NEXTN, (*root, "nextn"),
                        "speculation cannot be combined with nextn")
    if nextn > 0 and e.nextn_accepted is None:
        yield error(codes.NEXTN_ACCEPTED, (*root, "nextn_accepted"),
                    "nextn requires explicit nextn_accepted")
    if e.nextn_accepted is not None and not 0 <= e.nextn_accepted <= nextn:
        yield error(codes.NEXTN_ACCEPTED, (*root, "nextn_accepted"),
                    f"nextn_accepted must be within [0, nextn] = [0, {nextn}], got "
                    f"{e.nextn_accepted}")


def _authored(table: Any) -> dict[str, Any]:
    """The values a table sets, without its nested tables (a length table in its JSON
    form: it is a value)."""
    if table is None:
        return {}
    values = {f.name: getattr(table, f.name) for f in attrs.fields(type(table))}
    return {k: drop_none(attrs.asdict(v)) if isinstance(v, LengthDistribution) else v
            for k, v in values.items()
            if v is not None and (isinstance(v, LengthDistribution) or not attrs.has(type(v)))}


def _traffic(t: Traffic | None) -> Iterator[Diagnostic]:
    if t is None:
        return
    src, load = t.source or Source(), t.load or Load()
    stype = src.type or "synthetic"
    ltype = load.type or "concurrency"
    yield from _source_keys(src, stype)
    yield from _load_keys(load, ltype)
    # the rules between values, shared with a payload's workload (in the payload's shape)
    yield from check_traffic({**_authored(src), **_authored(src.session), "type": stype},
                             {**_authored(load), "type": ltype})
    yield from _stop_keys(t, stype)


def _source_keys(src: Source, stype: str) -> Iterator[Diagnostic]:
    """The source keys its type reads, and a trace's one path."""
    sp: Path = ("traffic", "source")
    allowed_src = {
        "synthetic": {"type", "input_tokens", "output_tokens", "cached_prefix_tokens",
                      "output_range_ratio"},
        "synthetic-session": {"type", "new_input_tokens_per_turn", "output_tokens_per_turn",
                              "session"},
        "trace": {"type", "paths", "format", "block_size"},
    }[stype]
    for key in ("input_tokens", "output_tokens", "cached_prefix_tokens", "output_range_ratio",
                "new_input_tokens_per_turn", "output_tokens_per_turn", "session", "paths",
                "format", "block_size"):
        if getattr(src, key) is not None and key not in allowed_src:
            yield error(codes.TRAFFIC_KEY, (*sp, key),
                        f"source type {stype!r} does not accept {key}")
    if stype == "trace":
        if not src.paths:
            yield error(codes.TRAFFIC_KEY, (*sp, "paths"),
                        "trace source requires paths (one file)")
        elif len(src.paths) != 1:
            yield error(codes.TRAFFIC_KEY, (*sp, "paths"),
                        f"mooncake traces take exactly one path, got {len(src.paths)}")
        elif not src.paths[0].strip():
            yield error(codes.EMPTY_VALUE, (*sp, "paths", 0), "value must be nonempty")


def _load_keys(load: Load, ltype: str) -> Iterator[Diagnostic]:
    """The load keys its type reads."""
    lp: Path = ("traffic", "load")
    load_keys = {
        "concurrency": {"concurrency"},
        "poisson": {"requests_per_second", "sessions_per_second", "seed"},
        "gamma": {"requests_per_second", "sessions_per_second", "seed", "cv"},
        "constant_rate": {"requests_per_second", "sessions_per_second"},
        "trace_timestamps": {"speedup"},
    }[ltype]
    for key in ("concurrency", "requests_per_second", "sessions_per_second", "seed", "cv",
                "speedup"):
        if getattr(load, key) is not None and key not in load_keys:
            yield error(codes.TRAFFIC_KEY, (*lp, key), f"load type {ltype!r} does not accept {key}")


def _stop_keys(t: Traffic, stype: str) -> Iterator[Diagnostic]:
    """The stop conditions the source type takes: one count, or a trace's rows or time."""
    stop = t.stop or Stop()
    stp: Path = ("traffic", "stop")
    set_stops = [k for k in ("requests", "requests_per_load_unit", "sessions",
                             "sessions_per_load_unit", "max_virtual_time_seconds")
                 if getattr(stop, k) is not None]
    if stype == "trace":
        for k in set_stops:
            if k not in ("requests", "max_virtual_time_seconds"):
                yield error(codes.TRAFFIC_STOP, (*stp, k), "trace stop accepts only requests and "
                            "max_virtual_time_seconds")
    else:
        if "max_virtual_time_seconds" in set_stops:
            yield error(codes.TRAFFIC_STOP, (*stp, "max_virtual_time_seconds"),
                        "max_virtual_time_seconds is trace-only")
        unit = "sessions" if stype == "synthetic-session" else "requests"
        counts = [k for k in set_stops if k != "max_virtual_time_seconds"]
        for k in counts:
            if not k.startswith(unit):
                yield error(codes.TRAFFIC_STOP, (*stp, k), f"{stype} source stops by {unit} or "
                            f"{unit}_per_load_unit, not {k}")
        if len(counts) > 1:
            yield error(codes.TRAFFIC_STOP, stp, "set exactly one count condition, got "
                        + ", ".join(counts))
        elif not counts and t.stop is not None:
            yield error(codes.TRAFFIC_STOP, stp, f"{stype} traffic needs exactly one count "
                        f"condition ({unit} or {unit}_per_load_unit)")
