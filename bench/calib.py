"""Shared by bench/accuracy.py and bench/fit_timing.py: calibration rows -> replays.

A row of ``bench/data/silicon_dev.csv`` is one measured closed-loop benchmark: fixed
ISL/OSL prompts, ``concurrency`` requests in flight, mean TTFT and TPOT. Each row is
replayed through the config a user would write for it (:func:`config`: the deployment
from the row's columns, the benchmark as a ``concurrency`` load of a synthetic source),
compiled as ``servesim replay`` compiles it, so the accuracy reported is the accuracy a
user gets: no rule of the replay depends on a row's source, version or GPU.

How a row was measured: ``concurrency`` clients start together and each re-sends as soon
as its request completes, every request measured; TTFT / TPOT are means over them all.
The replay sends ``WAVES x concurrency`` requests (fewer above ``MAX_TOKENS`` output
tokens). The engine admits each request after the front end's latency
(:meth:`AnalyticalTimer.request_ms`), as ``servesim replay`` does.

Recording: in this closed loop the engine's schedule (which requests are in which pass,
with which token counts) does not depend on the pass durations: requests arrive at the
start or when another one finishes, i.e. at a pass end, and reach the scheduler once the
next pass has started. So one replay records every pass (the timer calls of each rank)
and which passes carry each request's arrival, first and last token; re-pricing the
recorded passes with any timer then gives the TPOT that a replay with that timer would
give, and its TTFT up to the front end's latency: re-pricing adds that latency to the pass
the request waits for, while in a replay the two overlap. The fit uses this to evaluate
thousands of constant sets without re-running the engine.
"""

from __future__ import annotations

import bisect
import csv
import json
import math
import re
import zlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from servesim.catalog import CatalogError, load_gpu, load_model
from servesim.compiler import compile_text
from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay
from servesim.errors import ServesimError
from servesim.payload import Payload, RoleArgs
from servesim.timing import StepTimer, make_timer
from servesim.timing.analytical import (
    AnalyticalConstants,
    AnalyticalTimer,
    StepGeometry,
    timer_from_role,
)
from servesim.workloads import build_workload

DATA = Path(__file__).resolve().parent / "data" / "silicon_dev.csv"

# Names in the measurements -> shipped catalog configs of the same architecture.
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "zhipuai/GLM-5": "zai-org/GLM-5-FP8",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
}

# Engine defaults of the measured stacks (per attention-DP rank).
BLOCK_SIZE = {"vllm": 64, "sglang": 64, "trtllm": 32}  # sglang pages are 1 token; 64 is cheaper
MAX_SEQS = {"vllm": 1024, "sglang": 4096, "trtllm": 2048}
MEMORY_FRACTION = {"vllm": 0.9, "sglang": 0.88, "trtllm": 0.9}
# TensorRT-LLM deployments with attention DP balance prompts across their ranks
# (attention_dp_config: enable_balance, timeout_iters, batching_wait_iters). The rows do not
# record the setting. Over the 38 TensorRT-LLM attention-DP rows (B200 DeepSeek-R1 and
# gpt-oss-120b), TTFT / TPOT MAPE replayed without it is 49.6 / 25.9% (each rank's prompt
# stalls every rank's decoding); with TensorRT-LLM's defaults, timeout 50 and batching wait
# 10, 64.9 / 16.9%; with timeout 60 and no batching wait, 57.3 / 16.2%; and with that and
# each new request placed on the rank with the fewest, as TensorRT-LLM places them,
# 31.5 / 15.9%.
ADP_BALANCE = {"attention_dp_balance": True, "attention_dp_timeout_iters": 60,
               "attention_dp_batching_wait_iters": 0, "attention_dp_placement": "least_loaded"}

# The benchmark client: requests per client (all measured) and the spread of the output
# lengths around OSL (traffic.source.output_range_ratio). Every measured request stopped at
# OSL tokens, yet the clients drift apart after the first wave; the spread stands in for
# that drift.
WAVES = 6
OSL_SPREAD = 0.2
MAX_TOKENS = 4_000_000  # output tokens of one row's replay; fewer waves above that

# Accuracy targets on the aggregated rows (MAPE %): overall, and no (GPU, backend, model)
# partition worse than twice these.
TARGET_TTFT, TARGET_TPOT = 25.0, 10.0


@dataclass
class Row:
    id: str
    backend: str
    system: str
    model: str
    mode: str
    isl: int
    osl: int
    concurrency: int
    tp: int
    dp: int
    moe_tp: int
    moe_ep: int
    gemm_quant: str
    moe_quant: str
    ttft_ms: float
    tpot_ms: float
    # ``backend_version`` ("" when not recorded)
    version: str = ""
    # why ``concurrency`` is 0 (unknown), if it is
    load_problem: str = ""
    # why the row is not replayed although it could be: its measurement is not a steady
    # state (:func:`inconsistent`), is a P/D deployment's (:func:`pd_copies`) or repeats
    # another row's (:func:`repeats`)
    excluded: str = ""
    # P/D rows: per pool ("prefill", "decode") its workers and each worker's tp, dp,
    # moe_tp and moe_ep; empty for aggregated rows
    pools: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def partition(self) -> tuple[str, str, str, str]:
        return (self.system, self.backend, self.model, self.mode)


def _int(value: str, default: int = 1) -> int:
    try:
        v = int(float(value))
    except ValueError:
        return default
    return v if v > 0 else default


def _concurrency(raw: dict[str, str]) -> tuple[int, str]:
    """Client concurrency of one worker, or 0 and why it is unknown.

    The benchmark's client concurrency is ``silicon_concurrency`` (the id's ``c<N>``).
    Aggregated rows also record ``batch_size`` per attention-DP rank; the two agree on
    almost every row. Where they disagree the row is not replayed: some sources name the
    total over several replicas there, others a server batch limit, and the measured
    figures fit neither reading. A row with only ``batch_size`` (its id names no
    concurrency) is not replayed either: its TTFTs of tens of seconds show more clients
    than the batch.
    """
    m = re.search(r"silicon_concurrency=(\d+)", raw.get("silicon_data_source", ""))
    clients = int(m.group(1)) if m else 0
    bs = _int(raw.get("batch_size", ""), 0)
    if not bs:
        return clients, "" if clients else "no concurrency recorded"
    per_worker = bs * _int(raw.get("attention_dp_size", ""))
    if not clients:
        return 0, "no client concurrency recorded (only batch_size)"
    if per_worker != clients:
        return 0, "batch_size x attention DP disagrees with the recorded concurrency"
    return clients, ""


def _parallel(raw: dict[str, str]) -> dict[str, int]:
    """Parallel sizes of one worker.

    Some sources record a ``tpX_epX`` deployment (X GPUs: attention TP or DP over X ranks,
    experts spread over the same X GPUs) as ``moe_tp = moe_ep = X`` and ``tp`` (or attention
    DP) ``= X * X``, i.e. X**2 GPUs; the row id names the real layout. Such rows are mapped
    back to X GPUs with expert parallelism X (the client concurrency is unaffected).
    """
    tp, dp = _int(raw["tp_size"]), _int(raw["attention_dp_size"])
    mtp, mep = _int(raw["moe_tp_size"]), _int(raw["moe_ep_size"])
    if mtp > 1 and mtp == mep and tp * dp == mtp * mep:
        m = re.search(r"_tp(\d+)(?:_0)?_ep(\d+)", raw["id"])
        if m is None or (int(m.group(1)), int(m.group(2))) == (mtp, mep):
            if dp > 1:
                dp, tp = mep, 1
            else:
                tp = mep
            mtp = 1
    elif mtp == 1 and tp == dp > 1 and mep == tp * dp:
        # The same X**2 recording of a vLLM "tpX + expert parallel" deployment (the ids
        # say tpX_epX): X GPUs, attention TP X, experts over the same X GPUs.
        dp, mep = 1, tp
    return {"tp": tp, "dp": dp, "moe_tp": mtp, "moe_ep": mep}


def _pools(raw: dict[str, str]) -> dict[str, dict[str, int]]:
    """Workers and parallel sizes of each pool of a P/D row (0 workers: not recorded)."""
    return {pool: {"workers": _int(raw[f"{pool}_num_workers"], 0),
                   "tp": _int(raw[f"{pool}_tp_size"]),
                   "dp": _int(raw[f"{pool}_attention_dp_size"]),
                   "moe_tp": _int(raw[f"{pool}_moe_tp_size"]),
                   "moe_ep": _int(raw[f"{pool}_moe_ep_size"])}
            for pool in ("prefill", "decode")}


def _model(raw: dict[str, str]) -> str:
    """The model measured: the model path, but where an export files DeepSeek-R1 runs
    under DeepSeek-V3's path. Every row filed under DeepSeek-V3 has a ``dsr1_...`` id, and
    those that repeat a measurement (:func:`repeats`) repeat DeepSeek-R1 rows: all of
    SGLang's and 58 of TensorRT-LLM's 82. (The two models share one architecture, so
    this moves rows between partitions of the report, not their replay.)"""
    if raw["id"].startswith("dsr1_") and raw["model_path"] == "deepseek-ai/DeepSeek-V3":
        return "deepseek-ai/DeepSeek-R1"
    return raw["model_path"]


def load_rows(path: Path = DATA) -> list[Row]:
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            concurrency, load_problem = _concurrency(raw)
            rows.append(Row(
                id=raw["id"], backend=raw["backend"], system=raw["system"],
                model=_model(raw), mode=raw["mode"], isl=int(raw["isl"]),
                osl=int(raw["osl"]), concurrency=concurrency, load_problem=load_problem,
                version=raw["backend_version"],
                **_parallel(raw),
                gemm_quant=raw["gemm_quant_mode"], moe_quant=raw["moe_quant_mode"],
                ttft_ms=float(raw["silicon_ttft_ms"]), tpot_ms=float(raw["silicon_tpot_ms"]),
                pools=_pools(raw) if raw["mode"] == "disagg" else {},
            ))
    for row in inconsistent(rows):
        row.excluded = ("TPOT under half the same deployment's at a lower concurrency "
                        "(not a steady state)")
    for row in pd_copies(rows):
        row.excluded = "a P/D run filed as aggregated (no prefill/decode split recorded)"
    for row in repeats(rows):
        row.excluded = "repeats another row's measurement (counted once)"
    return rows


# The columns that name one measured configuration (the measurements aside).
CONFIGURATION = ("system", "backend", "version", "model", "gemm_quant", "moe_quant", "isl",
                 "osl", "tp", "dp", "moe_tp", "moe_ep", "concurrency")


def configuration(row: Row, without: Collection[str] = ()) -> tuple[object, ...]:
    """The row's measured configuration, but for the columns ``without``: rows with equal
    keys measured the same thing in all other respects."""
    return tuple(getattr(row, name) for name in CONFIGURATION if name not in without)


def counted(row: Row) -> bool:
    """Whether the row is an aggregated measurement at a known concurrency that
    :func:`load_rows` keeps (not excluded): one the report and the checks count."""
    return row.mode == "agg" and row.concurrency > 0 and not row.excluded


def inconsistent(rows: Sequence[Row], ratio: float = 0.5) -> list[Row]:
    """Aggregated rows whose TPOT is under ``ratio`` x the TPOT that the same deployment
    (model, GPU, backend, precision, parallelism, ISL and OSL; any source) measured at a
    lower concurrency.

    A decode step over more sequences cannot take half the time of one over fewer, so
    such a row did not measure the steady state its concurrency names. Five H100 vLLM
    gpt-oss-120b rows at concurrency 512 are the case: 4.4-5.6 ms TPOT next to 20-24 s
    TTFT, where the same deployments measure 9.7-16.7 ms at concurrency 64. Repeated
    measurements of one configuration differ by far less than a factor of two.
    """
    groups: dict[tuple[object, ...], list[Row]] = {}
    for r in rows:
        if r.mode == "agg" and r.concurrency > 0:
            groups.setdefault(configuration(r, ("version", "concurrency")), []).append(r)
    return [r for group in groups.values() for r in group
            if any(o.concurrency < r.concurrency and r.tpot_ms < ratio * o.tpot_ms
                   for o in group)]


# Two rows whose TTFT and TPOT agree this closely (ms) carry one measurement: some exports
# round to two decimals, and no two runs agree to that.
SAME_MEASUREMENT_MS = 0.005


def repeats(rows: Sequence[Row]) -> list[Row]:
    """Aggregated rows that repeat a measurement another row already carries: the same
    GPU, backend, precision, parallelism, ISL, OSL and concurrency, and the same TTFT and
    TPOT (to :data:`SAME_MEASUREMENT_MS`, the rounding of the coarsest export).

    The CSV joins exports of one database that overlap: nearly a quarter of its
    aggregated rows repeat another's measurement, one export filing DeepSeek-R1 runs
    under DeepSeek-V3's model path (:func:`_model` files them back), another leaving the
    version out. So that each measurement counts once, of each set one row stays, the
    first whose version is recorded; the others are returned.
    """
    alike: dict[tuple[object, ...], list[list[Row]]] = {}
    for r in rows:
        if not counted(r):
            continue
        sets = alike.setdefault(configuration(r, ("model", "version")), [])
        for same in sets:
            if (abs(same[0].ttft_ms - r.ttft_ms) <= SAME_MEASUREMENT_MS
                    and abs(same[0].tpot_ms - r.tpot_ms) <= SAME_MEASUREMENT_MS):
                same.append(r)
                break
        else:
            sets.append([r])
    out = []
    for sets in alike.values():
        for same in sets:
            kept = max(same, key=lambda r: bool(r.version))  # the first of the best
            out += [r for r in same if r is not kept]
    return out


def pd_copies(rows: Sequence[Row]) -> list[Row]:
    """Aggregated rows that record a P/D deployment: tensor parallelism over more than 8
    GPUs, with the experts tensor-sharded alike and no expert or attention data
    parallelism, where a disaggregated row of the same configuration records both of its
    pools alike at that GPU count.

    One export of GB200 DeepSeek-R1 runs carries each of these runs twice, as
    ``..._disagg_...`` and ``..._agg_...`` under one id, with the same GPU count (12-72) as
    the tensor parallelism of the row and of both pools: 51 of the 55 pairs agree in TPOT
    within 2%, which an aggregated and a disaggregated deployment would not. No engine
    shards DeepSeek's 128 attention heads over 12, 20, 24, 28, 36, 40, 48, 52 or 72 GPUs,
    and most concurrencies (1075, 2150, 538, ...: a batch and 5%) are those of P/D sweeps:
    the count is the whole P/D deployment's. How many of its GPUs prefill is not
    recorded, so neither copy is replayed.
    """
    def key(r: Row, gpus: int) -> tuple[object, ...]:
        return (*configuration(r, ("tp", "dp", "moe_tp", "moe_ep")), gpus)

    both_pools = {key(r, r.pools["prefill"]["tp"]) for r in rows
                  if r.mode == "disagg" and r.pools["prefill"] == r.pools["decode"]}
    return [r for r in rows
            if r.mode == "agg" and r.tp > 8 and r.moe_tp == r.tp and r.moe_ep == 1
            and r.dp == 1 and key(r, r.tp) in both_pools]


class Unsupported(Exception):
    """A row the simulator cannot replay; the message is the reason."""


@dataclass
class Setup:
    """An aggregated row: its config, the compiled worker role and its analytical geometry."""

    row: Row
    config: str
    payload: Payload
    role: RoleArgs
    geometry: StepGeometry


@dataclass
class PdSetup:
    """A P/D row: its config, both pools' roles and geometries."""

    row: Row
    config: str
    payload: Payload
    prefill: RoleArgs
    decode: RoleArgs
    prefill_geometry: StepGeometry
    decode_geometry: StepGeometry


def setup(row: Row, *, max_tokens: int, waves: int = WAVES,
          timing: str = "default") -> Setup | PdSetup:
    """The row's config (:func:`config`) compiled, as ``servesim replay`` compiles it (or
    :class:`Unsupported`)."""
    if row.concurrency < 1:
        raise Unsupported(row.load_problem or "no concurrency recorded")
    if row.excluded:
        raise Unsupported(row.excluded)
    if row.mode != "agg" and not row.pools:
        raise Unsupported(f"mode {row.mode!r} is not replayed")
    if row.mode != "agg" and not all(par["workers"] for par in row.pools.values()):
        # Most P/D sources leave the worker counts empty. The deployment behind them is
        # unknown (one prefill worker cannot sustain their measured TTFT at high
        # concurrency), so such rows are not replayed rather than guessed.
        raise Unsupported("P/D worker counts not recorded")
    try:
        text = config(row, requests=_requests(row, max_tokens, waves), timing=timing)
        payload = compile_text(text, name=f"{row.id}.toml")
    except CatalogError as exc:
        raise Unsupported(f"not in the catalog: {exc}") from None
    except ServesimError as exc:
        raise Unsupported(exc.diagnostics[0].message) from None
    try:
        geometries = {name: timer_from_role(role).geometry
                      for name, role in payload.roles.items()}
    except ServesimError as exc:
        raise Unsupported(exc.diagnostics[0].message) from None
    if row.mode == "agg":
        return Setup(row=row, config=text, payload=payload,
                     role=payload.roles["aggregated"], geometry=geometries["aggregated"])
    return PdSetup(row=row, config=text, payload=payload, prefill=payload.roles["prefill"],
                   decode=payload.roles["decode"], prefill_geometry=geometries["prefill"],
                   decode_geometry=geometries["decode"])


def _requests(row: Row, max_tokens: int, waves: int) -> int:
    c = row.concurrency
    n = waves * c
    if n * row.osl > max_tokens:
        n = max(c, max_tokens // row.osl)
    if n * row.osl > max_tokens:
        raise Unsupported(f"closed loop of {c} x {row.osl} output tokens exceeds the "
                          f"--max-tokens budget {max_tokens}")
    return n


# The row's weight precision as the config names it: the GEMM and expert modes the
# measurements record ("" and int4_wo: the checkpoint's own, which the catalog reads).
CONFIG_QUANT = {"fp8": "fp8", "fp8_block": "fp8_block", "nvfp4": "nvfp4"}


def _toml(value: object) -> str:
    return json.dumps(value) if isinstance(value, str) else str(value).lower() \
        if isinstance(value, bool) else str(value)


def _table(name: str, values: dict[str, object]) -> str:
    lines = [f"[{name}]", *(f"{k} = {_toml(v)}" for k, v in values.items() if v is not None)]
    return "\n".join(lines) + "\n"


def config(row: Row, *, requests: int, timing: str = "default") -> str:
    """The TOML a user would write for the deployment and benchmark of ``row``.

    Everything in it comes from the row's columns and the measured stacks' public
    defaults (block size, batch limit and memory fraction per backend, TensorRT-LLM's
    attention-DP balance), one rule for every row:

    - the weights run at the row's GEMM and expert precision, and a deployment whose
      weights are quantised to FP8 or FP4 (the row's precision, or the checkpoint's: gpt-oss
      ships MXFP4 experts) runs an FP8 KV cache (the CSV does not record the KV cache's
      precision);
    - the client is a closed loop of ``concurrency`` clients, ``requests`` requests in all,
      every one measured, with output lengths spread by ``output_range_ratio``
      :data:`OSL_SPREAD` (the clients of these benchmarks drift apart after the first wave);
    - a P/D row's KV cache crosses the GPUs' scale-out links (NVLink within a GB200 rack):
      one link per GPU of the smaller of the two workers.
    """
    model = load_model(MODEL_ALIASES.get(row.model, row.model))
    gemm = CONFIG_QUANT.get(row.gemm_quant)
    moe = CONFIG_QUANT.get(row.moe_quant) if model.is_moe else None
    if model.weight_quant == "mxfp4":
        gemm = moe = None  # gpt-oss: bf16 attention + MXFP4 experts, whatever the label
    quantised = (gemm or model.weight_quant or "") in ("fp8", "fp8_block", "nvfp4", "mxfp4")
    engine: dict[str, object] = {
        "model": model.name, "hardware": row.system, "backend": row.backend,
        "gemm_quant_mode": gemm, "moe_quant_mode": moe,
        "kvcache_quant_mode": "fp8" if quantised else None}
    pools = ({"aggregated": {"workers": 1, "tp": row.tp, "dp": row.dp, "moe_tp": row.moe_tp,
                             "moe_ep": row.moe_ep}} if row.mode == "agg" else row.pools)
    if row.mode != "agg":
        engine["mode"] = "disaggregated"
    text = _table("engine", engine)
    for name, par in pools.items():
        clients = math.ceil(row.concurrency / par["workers"])
        text += _worker(row, name, par, clients, model.is_moe, timing)
    if row.mode != "agg":
        gpus = min(p["tp"] * p["dp"] for p in row.pools.values())
        link = load_gpu(row.system).inter_node_bw * gpus / 1e9
        text += _table("engine.kv_transfer", {"bandwidth_gb_per_second": round(link, 3)})
    text += _table("traffic.source", {
        "type": "synthetic", "input_tokens": row.isl, "output_tokens": row.osl,
        "output_range_ratio": OSL_SPREAD})
    text += _table("traffic.load", {"type": "concurrency", "concurrency": row.concurrency})
    text += _table("traffic.stop", {"requests": requests})
    return text


def _worker(row: Row, name: str, par: dict[str, int], clients: int, moe: bool,
            timing: str) -> str:
    """The tables of one worker role serving ``clients`` clients each."""
    backend = row.backend
    w = f"engine.workers.{name}"
    per_rank = math.ceil(clients / par["dp"])
    scheduler: dict[str, object] = {"max_sequences": min(MAX_SEQS[backend], max(per_rank, 1))}
    if backend == "trtllm":
        scheduler.update(ADP_BALANCE)
    return (_table(f"{w}.parallelism", {
                "replicas": par["workers"], "tensor": par["tp"], "attention_data": par["dp"],
                "moe_tensor": par["moe_tp"] if moe else None,
                "moe_expert": par["moe_ep"] if moe else None})
            + _table(f"{w}.scheduler", scheduler)
            + _table(f"{w}.kv_cache", {"block_size": BLOCK_SIZE[backend]})
            + _table(f"{w}.kv_cache.capacity", {"type": "default",
                                                "memory_fraction": MEMORY_FRACTION[backend]})
            + _table(f"{w}.timing", {"type": timing}))


@dataclass
class Result:
    ttft_ms: float
    tpot_ms: float
    completed: int


def summarize(records: list[RequestRecord]) -> Result:
    """Mean TTFT and mean TPOT over the completed requests, TPOT being
    ``(last token - first token) / (output tokens - 1)``: what the benchmark client
    reports."""
    done = [r for r in records if r.status == "completed" and r.output_length > 0]
    if not done:
        raise Unsupported("no request completed in the replay")
    ttft = math.fsum(r.token_times[0] - r.arrival_ms for r in done) / len(done)
    multi = [r for r in done if r.output_length > 1]
    tpot = math.fsum((r.token_times[-1] - r.token_times[0]) / (r.output_length - 1)
                     for r in multi) / len(multi) if multi else 0.0
    return Result(ttft, tpot, len(done))


TimerFactory = Callable[[RoleArgs, StepGeometry], StepTimer]


def replay(s: Setup | PdSetup, constants: AnalyticalConstants | None = None,
           timer_for: TimerFactory | None = None) -> Result:
    """Replay one row's config with its own timing, with the analytical timer of
    ``constants``, or with the timers ``timer_for`` makes (P/D rows through the
    disaggregated engine)."""
    records: list[RequestRecord] = []

    def timer(role: RoleArgs, geometry: StepGeometry) -> StepTimer:
        if timer_for is not None:
            return timer_for(role, geometry)
        if constants is None:
            return make_timer(role)
        return AnalyticalTimer(geometry, constants)

    with build_workload(s.payload.workload) as workload:
        if isinstance(s, PdSetup):
            DisaggReplay(s.prefill, s.decode, s.payload.kv_transfer, workload, records.append,
                         prefill_timer=timer(s.prefill, s.prefill_geometry),
                         decode_timer=timer(s.decode, s.decode_geometry)).run()
        else:
            AggregatedReplay(s.role, timer(s.role, s.geometry), workload, records.append,
                             None).run()
    return summarize(records)


# ---------------------------------------------------------------------------------------------
# Recording and re-pricing

# A recording's front-end latency: shorter than any recorded pass (1 ms per timer call),
# and than the send gap of the first wave's clients.
FRONT_END_MS = 1e-7

# (0, batch, isl, prefix, 0), (1, batch, active_kv, mean_ctx, 0) or, for a prefill priced
# with the prompt tokens of every attention-DP rank of the pass, (2, batch, isl, prefix,
# group_tokens)
Call = tuple[int, int, int, int, int]


class _Recorder:
    """One rank's timer: prices every call at 1 ms and files it under the pass the replay
    starts now (a stepwise replay prices each pass of a rank once, when it starts).

    Its front end takes a moment (:data:`FRONT_END_MS`), as every analytical timer's does:
    a request sent when a pass ends reaches the scheduler after the next pass has started,
    and waits for it, as in a replay with that timer (and on a real server).
    """

    def __init__(self, clock: Callable[[], float],
                 pass_at: Callable[[float], list[list[Call]]]) -> None:
        self.clock, self.pass_at = clock, pass_at
        self.at: float | None = None
        self.calls: list[Call] = []

    def _file(self, call: Call) -> float:
        now = self.clock()
        if now != self.at:
            self.at, self.calls = now, []
            self.pass_at(now).append(self.calls)
        self.calls.append(call)
        return 1.0

    def request_ms(self, input_tokens: int) -> float:
        return FRONT_END_MS

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        if batch <= 0 or mean_isl <= mean_prefix:
            return 0.0
        return self._file((0, batch, int(mean_isl), int(mean_prefix), 0))

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        """The worker re-prices this rank's prefill half of the pass: replace its call."""
        if batch <= 0 or mean_isl <= mean_prefix:
            return 0.0
        self.calls.remove((0, batch, int(mean_isl), int(mean_prefix), 0))
        self.calls.append((2, batch, int(mean_isl), int(mean_prefix), group_tokens))
        return 1.0

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        if batch <= 0:
            return 0.0
        return self._file((1, batch, active, int(mean_context), 0))


@dataclass
class Recording:
    """Unique pass signatures with their TTFT/TPOT weights (see the module docstring)."""

    isl: int
    signatures: list[tuple[tuple[Call, ...], ...]] = field(default_factory=list)
    ttft_w: list[float] = field(default_factory=list)
    tpot_w: list[float] = field(default_factory=list)
    completed: int = 0
    _where: dict[tuple[tuple[Call, ...], ...], int] = field(default_factory=dict, repr=False)
    _plan: tuple[list[Call], list[tuple[tuple[int, ...], ...]]] | None = field(
        default=None, repr=False)

    def add(self, sig: tuple[tuple[Call, ...], ...], ttft_w: float, tpot_w: float) -> None:
        i = self._where.get(sig)
        if i is None:
            self._plan = None
            self._where[sig] = i = len(self.signatures)
            self.signatures.append(sig)
            self.ttft_w.append(0.0)
            self.tpot_w.append(0.0)
        self.ttft_w[i] += ttft_w
        self.tpot_w[i] += tpot_w

    def evaluate(self, timer: AnalyticalTimer) -> tuple[float, float]:
        """(mean TTFT, mean TPOT) the replay would give with ``timer``."""
        if self._plan is None:
            self._plan = _plan(self.signatures)
        calls, sigs = self._plan
        pf, dc, gp = timer.prefill_ms, timer.decode_ms, timer.prefill_group_ms
        price = [pf(a, b, c) if kind == 0 else dc(a, b, c, 0) if kind == 1 else gp(a, b, c, g)
                 for kind, a, b, c, g in calls]
        ttft = tpot = 0.0
        for sig, wt, wp in zip(sigs, self.ttft_w, self.tpot_w, strict=True):
            d = 0.0
            for rank in sig:
                r = 0.0
                for i in rank:
                    r += price[i]
                if r > d:
                    d = r
            ttft += d * wt
            tpot += d * wp
        return ttft + timer.request_ms(self.isl), tpot


def _plan(signatures: list[tuple[tuple[Call, ...], ...]]) -> tuple[
        list[Call], list[tuple[tuple[int, ...], ...]]]:
    """The distinct calls of ``signatures`` and each signature as indices into them (a
    call is priced once per evaluation however many passes make it)."""
    index: dict[Call, int] = {}
    calls: list[Call] = []

    def at(c: Call) -> int:
        i = index.get(c)
        if i is None:
            index[c] = i = len(calls)
            calls.append(c)
        return i

    return calls, [tuple(tuple(at(c) for c in rank) for rank in sig) for sig in signatures]


def _bin(active: int) -> int:
    """KV tokens rounded to ~1.6% (2**-6 relative), so passes share signatures (a pass's
    price changes by much less than that over such a step)."""
    if active < 64:
        return active
    step = 1 << (active.bit_length() - 7)
    return (active // step) * step + step // 2


def record(s: Setup | PdSetup) -> Recording:
    """Replay ``s`` once with unit prices and keep every pass (its timer calls per rank)
    and which passes count towards each request's TTFT and TPOT.

    The schedule of this closed loop does not depend on the pass durations (requests
    arrive at pass ends, or all during the first pass), so re-pricing the recorded passes
    with a timer gives what a replay with that timer gives (up to the front end's latency:
    see the module docstring).
    """
    if isinstance(s, PdSetup):
        raise Unsupported("P/D rows are replayed, not recorded")
    records: list[RequestRecord] = []
    starts: list[float] = []
    passes: list[list[list[Call]]] = []  # per pass, per rank with work: its timer calls
    at: dict[float, int] = {}

    def pass_at(now: float) -> list[list[Call]]:
        k = at.get(now)
        if k is None:
            at[now] = k = len(passes)
            starts.append(now)
            passes.append([])
        return passes[k]

    # The reference stepwise replay prices every pass once, when it starts; each rank
    # gets a recorder of its own so that a pass's calls are kept per rank.
    with build_workload(s.payload.workload) as workload:
        run = AggregatedReplay(s.role, _Recorder(lambda: run.now, pass_at), workload,
                               records.append, None, bulk_decode=False)
        for worker in run.workers:
            for rank in worker.ranks:
                rank.timer = _Recorder(lambda: run.now, pass_at)
        run.run()
    # pass end times under the recorder's unit prices (one worker: passes in turn)
    ends = [now + max((float(len(calls)) for calls in ranks), default=0.0)
            for now, ranks in zip(starts, passes, strict=True)]
    index = {end: k for k, end in enumerate(ends)}
    n = len(passes)
    dt = [0.0] * (n + 1)  # difference arrays of the weights
    dp = [0.0] * (n + 1)
    done = [r for r in records if r.status == "completed" and r.output_length > 0]
    if not done:
        raise Unsupported("no request completed in the replay")
    share = 1.0 / len(done)  # means over every completed request
    for r in done:
        f = index[r.token_times[0]]
        a = bisect.bisect_right(ends, r.arrival_ms)  # the first pass to end after arrival
        dt[a] += share  # passes a..f count towards this request's TTFT
        dt[f + 1] -= share
    multi = [r for r in done if r.output_length > 1]
    for r in multi:
        w = 1.0 / len(multi) / (r.output_length - 1)  # passes f+1..last count towards its TPOT
        dp[index[r.token_times[0]] + 1] += w
        dp[index[r.token_times[-1]] + 1] -= w
    rec = Recording(isl=s.row.isl, completed=len(done))
    wt = wp = 0.0
    for k, ranks in enumerate(passes):
        wt += dt[k]
        wp += dp[k]
        if abs(wt) < 1e-12 and abs(wp) < 1e-12:
            continue
        rec.add(signature(ranks), wt, wp)
    return rec


def signature(ranks: Sequence[Sequence[Call]]) -> tuple[tuple[Call, ...], ...]:
    """A pass's timer calls in canonical form: decode KV binned (:func:`_bin`), identical
    ranks once (the pass lasts as long as its slowest rank), ranks sorted."""
    out = set()
    for calls in ranks:
        sig = []
        for c in calls:
            if c[0] == 1:
                a = _bin(c[2])
                sig.append((1, c[1], a, a // c[1], 0))
            else:
                sig.append(c)
        out.add(tuple(sig))
    return tuple(sorted(out))


def compact(rec: Recording) -> Recording:
    """``rec`` with its signatures in canonical form (merging the ones that coincide)."""
    out = Recording(isl=rec.isl, completed=rec.completed)
    for sig, wt, wp in zip(rec.signatures, rec.ttft_w, rec.tpot_w, strict=True):
        out.add(signature(sig), wt, wp)
    return out


def holdout(row: Row, folds: int = 5) -> bool:
    """Deterministic holdout membership (one fold in ``folds``), keyed by the measured
    configuration rather than the row id, so repeated measurements of one configuration
    never straddle the split."""
    key = "|".join(map(str, (row.backend, row.system, row.model, row.gemm_quant, row.tp,
                             row.dp, row.moe_tp, row.moe_ep, row.isl, row.osl,
                             row.concurrency)))
    return zlib.crc32(key.encode()) % folds == 0


# What a level per group of rows cannot explain: each group's predictions rescaled by
# its own best factor. Groups from coarse to fine; the last differs only in concurrency.
LEVELS: tuple[tuple[str, Callable[[Row], tuple[object, ...]]], ...] = (
    ("(GPU, backend, model)", lambda r: (r.system, r.backend, r.model)),
    ("+ backend version", lambda r: (r.system, r.backend, r.model, r.version)),
    ("+ everything but concurrency", lambda r: configuration(r, ("concurrency",))),
)


def best_scale(ratios: Sequence[float]) -> float:
    """The factor ``k`` that minimises ``sum(|k * r - 1|)`` over ``ratios`` (predicted /
    measured): the median of ``1 / r`` weighted by ``r``."""
    points = sorted((1.0 / r, r) for r in ratios)
    half = sum(r for _, r in points) / 2.0
    seen = 0.0
    for k, r in points:
        seen += r
        if seen >= half:
            return k
    raise ValueError("no ratios")


def level_floor(groups: Iterable[Sequence[float]]) -> float:
    """MAPE (%) left when each group's ``predicted / measured`` ratios are scaled by the
    group's :func:`best_scale`: the error that lies within the groups, not in their
    levels."""
    errors = [abs(best_scale(g) * r - 1.0) for g in groups for r in g]
    return 100.0 * sum(errors) / len(errors)


def iter_setups(rows: list[Row], *, max_tokens: int, waves: int = WAVES,
                timing: str = "default") -> Iterator[tuple[Row, Setup | PdSetup | str]]:
    for row in rows:
        try:
            yield row, setup(row, max_tokens=max_tokens, waves=waves, timing=timing)
        except Unsupported as exc:
            yield row, str(exc)


def sample(rows: list[Row], limit: int | None) -> list[Row]:
    """A deterministic subsample spread over the partitions (every k-th row of each)."""
    if limit is None or limit >= len(rows):
        return rows
    by: dict[tuple[str, str, str, str], list[Row]] = {}
    for r in rows:
        by.setdefault(r.partition, []).append(r)
    out: list[Row] = []
    frac = limit / len(rows)
    for key in sorted(by):
        group = by[key]
        k = max(1, round(len(group) * frac))
        step = len(group) / k
        out.extend(group[int(i * step)] for i in range(k))
    return out
