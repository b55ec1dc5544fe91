"""Cross-layer rules over resolved engine arguments, shared by compiler and engines.

Each rule is a pure function of resolved values (:class:`RoleArgs`, the mode, the KV
transfer) that yields :class:`Diagnostic` values. The compiler's validate pass runs
:func:`check_deployment` on the resolved config; every engine runs the same function
on a payload it is handed (a payload may be written by hand, bypassing the compiler).
There is no second copy of any rule.

Paths name the config key that carries the value, so a diagnostic reads the same at
compile time and at engine handoff, e.g.
``engine.workers.decode.kv_cache.prefix_match_unit: prefix_match_unit must be a positive
divisor of the resolved block_size 1536, got 1000``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from servesim import backends, codes, limits
from servesim.backends.base import Backend, names_of
from servesim.catalog import CatalogError, load_model
from servesim.converter import check_limits, check_limits_of_field
from servesim.errors import Diagnostic, Path, error
from servesim.geometry import parallel_problems, unpriced_weight_quant
from servesim.payload import KvTransferArgs, Payload, RoleArgs, role_field_path
from servesim.sla import check_sla
from servesim.sweep.pricing import check_prices

# a rule on one resolved role, given the registered backends
RoleRule = Callable[[RoleArgs, Path, Mapping[str, Backend]], Iterator[Diagnostic]]


def _takers(test: Callable[[Backend], bool], known: Mapping[str, Backend]) -> str:
    """``backend=vllm`` (or several, joined by "or"): the registered backends passing
    ``test``, for a message."""
    return names_of([b for b in known.values() if test(b)])


def _in_limits(obj: Any, name: str) -> bool:
    """Whether ``obj.name`` is within the bounds its field declares (the limits rule)."""
    return not check_limits_of_field(attrs.fields_dict(type(obj))[name], getattr(obj, name), ())


def role_path(role: str) -> Path:
    return ("engine", "workers", role)


def value_limits(r: RoleArgs, path: Path,
                 known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """Every numeric value within its bounds (:mod:`servesim.limits`, spec V55)."""
    role = str(path[-1])
    for d in check_limits(r, path_of=lambda name: role_field_path(role, name)):
        yield attrs.evolve(d, stage="validate")


def backend_fields(r: RoleArgs, path: Path,
                   known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """A registered backend, and its own rules on the role (spec V10-V12)."""
    backend = known.get(r.backend)
    if backend is None:
        quoted = ", ".join(f'"{name}"' for name in known)
        yield error(codes.UNKNOWN_BACKEND, ("engine", "backend"),
                    f"expected one of {quoted}, got {r.backend!r}")
        return
    yield from backend.rules(r, path, tuple(known.values()))


def timing_values(r: RoleArgs, path: Path,
                  known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """Fixed timing needs both step times (spec V15, V57) and table timing its file, which
    no other timing takes; the default timing prices only weight precisions it knows."""
    t = r.timing
    tp = (*path, "timing")
    if t.type == "fixed":
        for key in ("prefill_ms", "decode_ms"):
            v = getattr(t, key)
            if v is None:
                yield error(codes.TIMING_FIXED, (*tp, key),
                            "fixed timing requires prefill_ms and decode_ms")
                continue
            if not math.isfinite(v) or v < 0:
                yield error(codes.TIMING_FIXED, (*tp, key),
                            f"must be a finite number >= 0, got {v}")
    elif t.prefill_ms is not None or t.decode_ms is not None:
        yield error(codes.TIMING_FIXED, tp, f"{t.type} timing rejects fixed timing values "
                    "(prefill_ms, decode_ms)")
    if t.type == "table" and t.path is None:
        yield error(codes.TIMING_TABLE, (*tp, "path"), "table timing requires path (a CSV file)")
    if t.type != "table" and t.path is not None:
        yield error(codes.TIMING_TABLE, (*tp, "path"), f"{t.type} timing rejects path")
    # the weight precision the default and measured timings price comes from the engine's
    # quant modes; the measured timing also reads the KV precision and backend version
    model_timings = ("default", "measured")
    for key in ("gemm_quant", "moe_quant", "kv_quant", "backend_version"):
        readers = model_timings if key.endswith("_quant") and key != "kv_quant" else (
            "measured",)
        if getattr(t, key) is not None and t.type not in readers:
            only = "the default and measured timings read" if len(readers) > 1 \
                else "the measured timing reads"
            yield error(codes.TIMING_QUANT, (*tp, key), f"{t.type} timing rejects {key}, which "
                        f"only {only}")
    if t.type != "default":
        return
    for key, config_key in (("gemm_quant", "gemm_quant_mode"), ("moe_quant", "moe_quant_mode")):
        name = getattr(t, key)
        if name is None:
            continue
        problem = unpriced_weight_quant(name)
        # experts that follow the GEMMs' precision are reported with it, once
        if problem and not (key == "moe_quant" and name == t.gemm_quant):
            yield error(codes.TIMING_UNSUPPORTED, ("engine", config_key), problem,
                        'choose a precision it prices, or timing.type = "table" / "fixed"')


def state_cache_geometry(r: RoleArgs, path: Path,
                         known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """State cache needs vLLM and room for one token block plus one state (V22, V23, V25)."""
    sc = r.state_cache
    kp = (*path, "kv_cache")
    if sc is None:
        return
    backend = known.get(r.backend)
    if backend is not None and not backend.state_cache:  # else backend_fields reports it
        yield error(codes.STATE_CACHE_BACKEND, (*kp, "state_cache"),
                    f"state_cache requires {_takers(lambda b: b.state_cache, known)}, got "
                    f"backend={r.backend}")
    if r.block_size < 2:
        yield error(codes.STATE_CACHE_BLOCK, (*kp, "block_size"),
                    "state_cache requires block_size at least two for vLLM")
    block_bytes = r.block_size * r.kv_bytes_per_token
    needed = -(-sc.bytes_per_request // block_bytes) if block_bytes > 0 else 0
    if needed != sc.state_blocks:
        yield error(codes.STATE_CACHE_BLOCKS, (*kp, "state_cache", "state_blocks"),
                    f"must be ceil(bytes_per_request / block bytes) = ceil({sc.bytes_per_request}"
                    f" / {block_bytes}) = {needed}, got {sc.state_blocks}")
    elif sc.allocated_bytes_per_request != needed * block_bytes and _in_limits(
            sc, "allocated_bytes_per_request"):  # else value_limits reports it
        yield error(codes.STATE_CACHE_BLOCKS, (*kp, "state_cache", "allocated_bytes_per_request"),
                    f"must be state_blocks x block bytes = {needed} x {block_bytes} = "
                    f"{needed * block_bytes}, got {sc.allocated_bytes_per_request}")
    if r.num_gpu_blocks < sc.state_blocks + 1:
        yield error(codes.STATE_CACHE_CAPACITY, (*kp, "capacity"),
                    "state_cache capacity must fit one token block and one request state: "
                    f"{r.num_gpu_blocks} blocks of {r.block_size} tokens < {sc.state_blocks} state "
                    f"blocks + 1", "raise capacity.blocks or capacity.bytes")


def prefix_match_unit(r: RoleArgs, path: Path,
                      known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """``prefix_match_unit`` against the block size the role resolves to (V27-V30).

    Without speculation any positive divisor of the resolved block size is allowed.
    With speculation (ngram or MTP, canonical or legacy form) only a unit equal to the
    resolved block size is allowed: a sub-block checkpoint would need the drafter's
    hidden state inside a block.
    """
    unit = r.prefix_match_unit
    if unit is None:
        return
    up = (*path, "kv_cache", "prefix_match_unit")
    if r.state_cache is None:
        yield error(codes.PREFIX_MATCH_UNIT_REQUIRES_STATE_CACHE, up,
                    "prefix_match_unit currently requires state_cache")
        return
    if unit < 1 or r.block_size % unit != 0:
        yield error(codes.PREFIX_MATCH_UNIT_NOT_DIVISOR, up,
                    "prefix_match_unit must be a positive divisor of the resolved block_size "
                    f"{r.block_size}, got {unit}")
        return
    if r.speculation is not None and unit != r.block_size:
        yield error(codes.PREFIX_MATCH_UNIT_SPECULATION, up,
                    "prefix_match_unit does not support speculative decoding (speculation or "
                    f"nextn > 0) unless it equals the resolved block_size {r.block_size}, got "
                    f"{unit}", f"set prefix_match_unit = {r.block_size} or remove it")


def host_offload(r: RoleArgs, path: Path,
                 known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """The host (G2) tier holds prefix blocks of token KV: it needs prefix caching, and a
    recurrent state cache (whose snapshots it would not hold) is refused."""
    if r.host_offload is None:
        return
    hp = (*path, "kv_cache", "host_offload")
    backend = known.get(r.backend)
    if backend is not None and (backend.no_evict or backend.separate_prefill):
        takers = _takers(lambda b: not (b.no_evict or b.separate_prefill), known)
        yield error(codes.HOST_OFFLOAD_CONFLICT, hp,
                    f"host_offload requires {takers or 'another backend'}, got "
                    f"backend={r.backend}")
    if not r.prefix_caching:
        yield error(codes.HOST_OFFLOAD_CONFLICT, hp,
                    "host_offload requires prefix_caching = true: the host tier holds "
                    "cached prefix blocks", "remove host_offload or enable prefix_caching")
    if r.state_cache is not None:
        yield error(codes.HOST_OFFLOAD_CONFLICT, hp,
                    "host_offload does not support state_cache: the host tier holds token KV "
                    "blocks, not recurrent state snapshots", "remove host_offload")


def speculation(r: RoleArgs, path: Path,
                known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """Speculative decoding parameters (V34, V36, V39)."""
    s = r.speculation
    if s is None:
        return
    sp = ("engine", "speculation")
    if not 1 <= s.num_speculative_tokens <= 5:
        yield error(codes.SPECULATION_TOKENS, (*sp, "num_speculative_tokens"),
                    f"must be in [1, 5], got {s.num_speculative_tokens}")
    if len(s.acceptance_rates) != s.num_speculative_tokens:
        yield error(codes.SPECULATION_RATES, (*sp, "acceptance_rates"),
                    "acceptance_rates must contain one conditional probability per speculative "
                    f"token: {s.num_speculative_tokens} expected, got {len(s.acceptance_rates)}")
    for i, rate in enumerate(s.acceptance_rates):
        if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
            yield error(codes.SPECULATION_RATES, (*sp, "acceptance_rates", i),
                        f"must be in [0, 1], got {rate}")
    backend = known.get(r.backend)
    if s.kind == "ngram" and backend is not None and not backend.ngram_speculation:
        takers = [n for n, b in known.items() if b.ngram_speculation]
        yield error(codes.SPECULATION_BACKEND, (*sp, "kind"),
                    f"ngram speculation requires {' or '.join(takers) or 'another backend'}"
                    f" aggregated/disaggregated language workers, got backend={r.backend}")


def parallelism(r: RoleArgs, path: Path,
                known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """The parallel shape fits the model: heads split over TP, a layer per pipeline stage,
    the experts over the attention GPUs (or no expert split for a dense model)."""
    if min(r.tensor, r.pipeline, r.attention_data, r.moe_tensor, r.moe_expert) < 1:
        return  # value_limits reports it
    try:
        model = load_model(r.model)
    except CatalogError:
        return  # reported by what needs the model (the memory estimate, the default timing)
    for key, code, message in parallel_problems(
            model, tensor=r.tensor, pipeline=r.pipeline, attention_data=r.attention_data,
            moe_tensor=r.moe_tensor, moe_expert=r.moe_expert):
        yield error(code, (*path, "parallelism", key), message)


def startup(r: RoleArgs, path: Path,
            known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """``startup_seconds`` delays workers that join during a run; a replay starts every
    worker at t=0 and adds none, so a value would change nothing: refused, not ignored."""
    if r.startup_seconds and _in_limits(r, "startup_seconds"):
        yield error(codes.UNSUPPORTED_FIELD, (*path, "startup_seconds"),
                    f"startup_seconds = {r.startup_seconds:g} would have no effect: it delays "
                    "workers that join during a run, and a replay starts every worker at t=0",
                    "remove startup_seconds")


def rank_count(r: RoleArgs, path: Path,
               known: Mapping[str, Backend] = backends.BUILTIN) -> Iterator[Diagnostic]:
    """The role's scheduler ranks (each with its queues and block pool) fit in a replay."""
    if not (_in_limits(r, "replicas") and _in_limits(r, "attention_data")):
        return  # value_limits reports it
    ranks = r.replicas * r.attention_data
    if ranks > limits.RANKS:
        yield error(codes.OUT_OF_RANGE, (*path, "parallelism"),
                    f"replicas x attention_data = {r.replicas} x {r.attention_data} = {ranks} "
                    f"scheduler ranks, more than the {limits.RANKS} a replay holds",
                    "lower replicas or attention_data (a replay of fewer replicas with the same "
                    "load per replica gives the same latencies)")


ROLE_RULES: tuple[RoleRule, ...] = (
    value_limits, backend_fields, timing_values, state_cache_geometry, prefix_match_unit,
    speculation, parallelism, startup, rank_count, host_offload,
)


def check_payload(payload: Payload,
                  known: Mapping[str, Backend] = backends.BUILTIN) -> list[Diagnostic]:
    """Every shared rule on a payload's resolved values (``known``: the registered
    backends): the deployment's, the SLA's and the GPU prices'. The compiler's validate
    pass and an engine's payload check both run this."""
    return (check_deployment(payload.mode, payload.roles, payload.kv_transfer, known)
            + check_sla(payload.sla) + check_prices(payload.gpu_hour_usd, payload.roles))


def check_deployment(mode: str, roles: Mapping[str, RoleArgs],
                     kv_transfer: KvTransferArgs | None = None,
                     known: Mapping[str, Backend] = backends.BUILTIN) -> list[Diagnostic]:
    """Run every rule on every role and across roles, ``known`` being the registered
    backends; return all diagnostics."""
    out: list[Diagnostic] = []
    expected = {"aggregated": {"aggregated"}, "disaggregated": {"prefill", "decode"}}.get(mode)
    if expected is None:
        return [error(codes.UNKNOWN_MODE, ("engine", "mode"),
                      f"expected \"aggregated\" or \"disaggregated\", got {mode!r}")]
    if set(roles) != expected:
        out.append(error(codes.ROLE_MODE_MISMATCH, ("engine", "workers"),
                         f"{mode} mode requires workers {sorted(expected)}, got {sorted(roles)}"))
    for name, role in roles.items():
        path = role_path(name)
        if role.worker_type != name and name in expected:  # else the roles are misnamed
            out.append(error(codes.ROLE_MISMATCH, (*path, "worker_type"),
                             f"must be {name!r}, got {role.worker_type!r}"))
        for rule in ROLE_RULES:
            out.extend(rule(role, path, known))
    if mode == "disaggregated" and expected <= set(roles):
        out.extend(_pd_rules(roles["prefill"], roles["decode"], kv_transfer))
    elif kv_transfer is not None:
        # a hand-written payload is held to the config's rule (and to the limits)
        if mode == "aggregated":
            out.append(error(codes.ROLE_MODE_MISMATCH, ("engine", "kv_transfer"),
                             "aggregated mode rejects kv_transfer"))
        out.extend(attrs.evolve(d, stage="validate")
                   for d in check_limits(kv_transfer, ("engine", "kv_transfer")))
    # a rule about the deployment applies once, not once per role
    seen: set[tuple[str, str]] = set()
    unique = []
    for d in out:
        key = (repr(d.path), d.message)
        if key not in seen:
            seen.add(key)
            unique.append(attrs.evolve(d, stage="validate"))
    return unique


def _pd_rules(prefill: RoleArgs, decode: RoleArgs,
              kv_transfer: KvTransferArgs | None) -> Iterator[Diagnostic]:
    """Prefill/decode pairing (V9, V25 [newer], V47, V48)."""
    if prefill.model != decode.model:  # the decode workers read the prefill workers' KV
        yield error(codes.PD_MODEL, ("engine", "model"),
                    "prefill and decode must serve the same model, got "
                    f"{prefill.model!r:.80} and {decode.model!r:.80}")
    if prefill.backend != decode.backend:
        yield error(codes.PD_BACKEND, ("engine", "backend"),
                    "prefill and decode must use the same backend, got "
                    f"{prefill.backend} and {decode.backend}")
    if (prefill.state_cache is None) != (decode.state_cache is None):
        missing = "prefill" if prefill.state_cache is None else "decode"
        yield error(codes.PD_STATE_CACHE, (*role_path(missing), "kv_cache", "state_cache"),
                    "a disaggregated state_cache requires it on both prefill and decode workers")
    if kv_transfer is not None:
        for d in check_limits(kv_transfer, ("engine", "kv_transfer")):
            yield attrs.evolve(d, stage="validate")
        yield from _transfer_time(decode, kv_transfer)
        # the prefill worker sends each request's state with its KV (spec §3.7)
        state = prefill.state_cache.bytes_per_request if prefill.state_cache else 0
        if kv_transfer.state_bytes != state:
            should = ("0: the prefill role has no state_cache to send" if prefill.state_cache
                      is None else f"the prefill role's state_cache.bytes_per_request, {state}")
            yield error(codes.PD_STATE_CACHE, ("engine", "kv_transfer", "state_bytes"),
                        f"must be {should}, got {kv_transfer.state_bytes}")


def prompt_over_budget(role: RoleArgs, request_id: int, tokens: int) -> Diagnostic | None:
    """The admission rule of a prompt with chunked prefill off: its ``tokens`` uncached
    tokens must fit one pass (``max_batched_tokens``), or the replay would deadlock. A
    prompt at or over the context length is rejected instead, and is no problem here.
    The scheduler applies it to every prompt, ``validate`` to the first of the traffic."""
    if role.enable_chunked_prefill or tokens <= role.max_batched_tokens or (
            role.max_model_len is not None and tokens >= role.max_model_len):
        return None
    return Diagnostic(
        code=codes.REQUEST_UNSCHEDULABLE,
        path=("engine", "workers", role.worker_type, "scheduler", "max_batched_tokens"),
        message=f"request {request_id} needs {tokens} uncached prompt tokens in one pass, but "
        f"chunked prefill is disabled and max_batched_tokens is {role.max_batched_tokens}; "
        "the replay would deadlock",
        hint="set enable_chunked_prefill = true, or raise scheduler.max_batched_tokens to at "
        f"least {tokens}")


def _transfer_time(decode: RoleArgs, kv: KvTransferArgs) -> Iterator[Diagnostic]:
    """The longest prompt's KV transfer ends within the virtual time a replay spans, where
    times still step in fractions of a millisecond."""
    from servesim.engines.disagg.transfer import transfer_delay_ms

    tokens = decode.max_model_len or limits.TOKENS
    longest = transfer_delay_ms(attrs.evolve(kv, timing_mode="full_prompt"), tokens, tokens)
    if longest > limits.VIRTUAL_MS:
        yield error(codes.OUT_OF_RANGE, ("engine", "kv_transfer", "bandwidth_gb_per_second"),
                    f"a {tokens}-token prompt at bytes_per_token = {kv.bytes_per_token}"
                    f"{f' plus state_bytes = {kv.state_bytes}' if kv.state_bytes else ''} takes "
                    f"{longest:.3g} ms to cross {kv.bandwidth_gb_per_second:g} GB/s, more than "
                    f"the {limits.VIRTUAL_MS:g} ms a replay spans",
                    "raise bandwidth_gb_per_second, or check bytes_per_token")
