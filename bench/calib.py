"""Shared by bench/accuracy.py and bench/fit_timing.py: calibration rows -> replays.

A row of ``bench/data/silicon_dev.csv`` is one measured closed-loop benchmark: fixed
ISL/OSL prompts, ``concurrency`` requests in flight, mean TTFT and TPOT. This module turns
an aggregated row into the engine's :class:`RoleArgs`, an analytical step-time geometry
with the row's weight precision, and a closed-loop synthetic workload, and replays it
through the vLLM engine.

Recording: in a closed loop with one worker the engine's schedule (which requests are in
which pass, with which token counts) does not depend on the pass durations: requests
arrive only when another one finishes, i.e. at a pass end. So one replay records every
pass (the timer calls of each rank) and which passes carry each request's arrival, first
and last token; any timer then gives the exact TTFT/TPOT that a replay with that timer
would give, by re-pricing the recorded passes. The fit uses this to evaluate thousands of
constant sets without re-running the engine.
"""

from __future__ import annotations

import csv
import math
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from servesim.catalog import CatalogError, load_gpu, load_model
from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay
from servesim.errors import ServesimError
from servesim.geometry import GeometryError, default_kv_blocks, kv_bytes_per_token
from servesim.payload import RoleArgs
from servesim.timing.analytical import (
    AnalyticalConstants,
    AnalyticalTimer,
    StepGeometry,
    build_geometry,
)
from servesim.workloads.driver import ClosedLoop, SessionWorkload
from servesim.workloads.spec import SyntheticSource
from servesim.workloads.synthetic import synthetic_requests

DATA = Path(__file__).resolve().parent / "data" / "silicon_dev.csv"

# Names in the measurements -> shipped catalog configs of the same architecture.
MODEL_ALIASES = {
    "meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama/Meta-Llama-3.1-8B",
    "zhipuai/GLM-5": "zai-org/GLM-5-FP8",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai/DeepSeek-R1",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-ai/DeepSeek-V3",
    "nvidia/Qwen3-32B-NVFP4": "Qwen/Qwen3-32B",
}

# Engine defaults of the measured stacks (per attention-DP rank).
BLOCK_SIZE = {"vllm": 64, "sglang": 64, "trtllm": 32}  # sglang pages are 1 token; 64 is cheaper
MAX_BATCHED_TOKENS = 8192
MAX_SEQS = {"vllm": 1024, "sglang": 4096, "trtllm": 2048}
MEMORY_FRACTION = {"vllm": 0.9, "sglang": 0.88, "trtllm": 0.9}


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

    @property
    def partition(self) -> tuple[str, str, str, str]:
        return (self.system, self.backend, self.model, self.mode)


def _int(value: str, default: int = 1) -> int:
    try:
        v = int(float(value))
    except ValueError:
        return default
    return v if v > 0 else default


def _concurrency(raw: dict[str, str]) -> int:
    """Client concurrency of one worker: ``batch_size`` per attention-DP rank times the
    ranks (the ids of replicated deployments name the total over all replicas)."""
    bs = _int(raw.get("batch_size", ""), 0)
    if bs:
        return bs * _int(raw.get("attention_dp_size", ""))
    m = re.search(r"silicon_concurrency=(\d+)", raw.get("silicon_data_source", ""))
    return int(m.group(1)) if m else 0


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
    elif tp > 8 and tp == mtp and mep == 1 and dp == 1:
        # TP12..TP72 with "moe_tp" equal: wide expert-parallel deployments (attention DP +
        # EP over the NVL72 domain). Pure TP would need the whole batch's KV on every GPU
        # (e.g. 8192 requests of MLA latents), which cannot fit.
        dp, tp, mtp, mep = tp, 1, 1, tp
    return {"tp": tp, "dp": dp, "moe_tp": mtp, "moe_ep": mep}


def load_rows(path: Path = DATA) -> list[Row]:
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            rows.append(Row(
                id=raw["id"], backend=raw["backend"], system=raw["system"],
                model=raw["model_path"], mode=raw["mode"], isl=int(raw["isl"]),
                osl=int(raw["osl"]), concurrency=_concurrency(raw),
                **_parallel(raw),
                gemm_quant=raw["gemm_quant_mode"], moe_quant=raw["moe_quant_mode"],
                ttft_ms=float(raw["silicon_ttft_ms"]), tpot_ms=float(raw["silicon_tpot_ms"]),
            ))
    return rows


class Unsupported(Exception):
    """A row the simulator cannot replay; the message is the reason."""


@dataclass
class Setup:
    row: Row
    role: RoleArgs
    geometry: StepGeometry
    requests: int


def setup(row: Row, *, max_tokens: int, waves: int = 3) -> Setup:
    """Role, geometry and request count for one aggregated row (or :class:`Unsupported`)."""
    if row.mode != "agg":
        raise Unsupported("disaggregated (P/D) replay is not available in the engine yet")
    if row.concurrency < 1:
        raise Unsupported("no concurrency recorded")
    name = MODEL_ALIASES.get(row.model, row.model)
    try:
        model = load_model(name)
        gpu = load_gpu(row.system)
    except CatalogError as exc:
        raise Unsupported(f"not in the catalog: {exc}") from None
    gemm = row.gemm_quant or None
    moe = row.moe_quant or None
    if model.weight_quant == "mxfp4":
        gemm = moe = None  # gpt-oss: bf16 attention + MXFP4 experts, whatever the label
    backend = row.backend
    tp, dp = row.tp, row.dp
    kv_dtype = 1 if backend in ("trtllm", "sglang") and (gemm or "") in (
        "fp8", "fp8_block", "nvfp4") else model.dtype_bytes
    try:
        kv_bpt, _ = kv_bytes_per_token(model, tensor=tp, pipeline=1, kv_dtype_bytes=kv_dtype)
        geometry = build_geometry(
            model, gpu, backend=backend, tensor=tp, attention_data=dp,
            moe_tensor=row.moe_tp if model.is_moe else 1,
            moe_expert=row.moe_ep if model.is_moe else 1,
            kv_bytes_per_token=kv_bpt, gemm_quant=gemm, moe_quant=moe)
        from servesim.timing.analytical import _QUANT

        wbytes = _QUANT[gemm][0] if gemm in _QUANT else None
        blocks, _, _ = default_kv_blocks(
            model, gpu, backend=backend, tensor=tp, pipeline=1,  # type: ignore[arg-type]
            moe_tensor=row.moe_tp if model.is_moe else 1,
            moe_expert=row.moe_ep if model.is_moe else 1,
            max_batched_tokens=MAX_BATCHED_TOKENS, memory_fraction=MEMORY_FRACTION[backend],
            kv_bytes_per_token=kv_bpt, block_size=BLOCK_SIZE[backend],
            weight_dtype_bytes=wbytes)
    except (GeometryError, ServesimError) as exc:
        raise Unsupported(str(exc).splitlines()[0]) from None
    per_rank = math.ceil(row.concurrency / dp)
    role = RoleArgs(
        worker_type="aggregated", backend=backend, model=name, hardware=row.system,
        tensor=tp, attention_data=dp,
        moe_tensor=row.moe_tp if model.is_moe else 1,
        moe_expert=row.moe_ep if model.is_moe else 1,
        max_batched_tokens=MAX_BATCHED_TOKENS // (dp if backend == "sglang" else 1),
        max_sequences=min(MAX_SEQS[backend], max(per_rank, 1)),
        block_size=BLOCK_SIZE[backend], kv_bytes_per_token=kv_bpt, num_gpu_blocks=blocks)
    c = row.concurrency
    n = waves * c
    if n * row.osl > max_tokens:
        n = max(c, max_tokens // row.osl)
    if n * row.osl > max_tokens:
        raise Unsupported(f"closed loop of {c} x {row.osl} output tokens exceeds the "
                          f"--max-tokens budget {max_tokens}")
    return Setup(row=row, role=role, geometry=geometry, requests=n)


def workload(s: Setup) -> SessionWorkload:
    src = SyntheticSource(input_tokens=s.row.isl, output_tokens=s.row.osl)
    return SessionWorkload(lambda: synthetic_requests(src), ClosedLoop(s.row.concurrency),
                           max_requests=s.requests)


@dataclass
class Result:
    ttft_ms: float
    tpot_ms: float
    completed: int


def summarize(records: list[RequestRecord]) -> Result:
    done = [r for r in records if r.status == "completed" and r.output_length > 0]
    if not done:
        raise Unsupported("no request completed in the replay")
    ttft = sum(r.token_times[0] - r.arrival_ms for r in done) / len(done)
    tp = [(r.token_times[-1] - r.token_times[0]) / (r.output_length - 1)
          for r in done if r.output_length > 1]
    return Result(ttft, sum(tp) / len(tp) if tp else 0.0, len(done))


def replay(s: Setup, constants: AnalyticalConstants) -> Result:
    """Replay one row through the engine with the analytical timer."""
    records: list[RequestRecord] = []
    timer = AnalyticalTimer(s.geometry, constants)
    AggregatedReplay(s.role, timer, workload(s), records.append, None).run()
    return summarize(records)


# ---------------------------------------------------------------------------------------------
# Recording and re-pricing

Call = tuple[int, int, int, int]  # (0, batch, isl, prefix) or (1, batch, active_kv, mean_ctx)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[Call] = []

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        if batch <= 0 or mean_isl <= mean_prefix:
            return 0.0
        self.calls.append((0, batch, int(mean_isl), int(mean_prefix)))
        return 1.0

    def decode_ms(self, batch: int, active: int, mean_context: float, total: int) -> float:
        if batch <= 0:
            return 0.0
        self.calls.append((1, batch, active, int(mean_context)))
        return 1.0


@dataclass
class Recording:
    """Unique pass signatures with their TTFT/TPOT weights (see the module docstring)."""

    signatures: list[tuple[tuple[Call, ...], ...]] = field(default_factory=list)
    ttft_w: list[float] = field(default_factory=list)
    tpot_w: list[float] = field(default_factory=list)
    completed: int = 0

    def evaluate(self, timer: AnalyticalTimer) -> tuple[float, float]:
        ttft = tpot = 0.0
        pf, dc = timer.prefill_ms, timer.decode_ms
        for sig, wt, wp in zip(self.signatures, self.ttft_w, self.tpot_w, strict=True):
            d = 0.0
            for rank in sig:
                r = 0.0
                for kind, a, b, c in rank:
                    r += pf(a, b, c) if kind == 0 else dc(a, b, c, 0)
                if r > d:
                    d = r
            ttft += d * wt
            tpot += d * wp
        return ttft, tpot


def _bin(active: int) -> int:
    """KV tokens rounded to ~0.4% (2**-8 relative), so passes share signatures."""
    if active < 256:
        return active
    step = 1 << (active.bit_length() - 9)
    return (active // step) * step + step // 2


def record(s: Setup) -> Recording:
    recorder = _Recorder()
    records: list[RequestRecord] = []
    run = AggregatedReplay(s.role, recorder, workload(s), records.append, None)  # type: ignore[arg-type]
    passes: list[tuple[float, list[list[Call]]]] = []
    for worker in run.workers:
        for rank in worker.ranks:
            inner = rank.execute_pass

            def wrapped(now: float, *args: object,
                        _inner: Callable[..., object] = inner) -> object:
                if not passes or passes[-1][0] != now:
                    passes.append((now, []))
                start = len(recorder.calls)
                out = _inner(now, *args)
                passes[-1][1].append(recorder.calls[start:])
                return out

            rank.execute_pass = wrapped  # type: ignore[method-assign]
    run.run()
    # pass end times under the recorder's unit prices
    index: dict[float, int] = {}
    for k, (now, ranks) in enumerate(passes):
        d = max((float(len(calls)) for calls in ranks), default=0.0)
        index[now + d] = k
    n = len(passes)
    dt = [0.0] * (n + 1)  # difference arrays of the weights
    dp = [0.0] * (n + 1)
    done = [r for r in records if r.status == "completed" and r.output_length > 0]
    if not done:
        raise Unsupported("no request completed in the replay")
    inv = 1.0 / len(done)
    multi = [r for r in done if r.output_length > 1]
    inv_p = 1.0 / len(multi) if multi else 0.0
    for r in done:
        f = index[r.token_times[0]]
        a = index[r.arrival_ms] + 1 if r.arrival_ms > 0 else 0
        dt[a] += inv  # passes a..f count towards this request's TTFT
        dt[f + 1] -= inv
        if r.output_length > 1:
            last = index[r.token_times[-1]]
            w = inv_p / (r.output_length - 1)
            dp[f + 1] += w
            dp[last + 1] -= w
    rec = Recording(completed=len(done))
    where: dict[tuple[tuple[Call, ...], ...], int] = {}
    wt = wp = 0.0
    for k, (_, ranks) in enumerate(passes):
        wt += dt[k]
        wp += dp[k]
        if wt == 0.0 and wp == 0.0:
            continue
        sig = tuple(tuple((c[0], c[1], _bin(c[2]) if c[0] == 1 else c[2], c[3])
                          for c in calls) for calls in ranks)
        i = where.get(sig)
        if i is None:
            where[sig] = i = len(rec.signatures)
            rec.signatures.append(sig)
            rec.ttft_w.append(0.0)
            rec.tpot_w.append(0.0)
        rec.ttft_w[i] += wt
        rec.tpot_w[i] += wp
    return rec


def holdout(row: Row, folds: int = 5) -> bool:
    """Deterministic holdout membership (one fold in ``folds``), keyed by the measured
    configuration rather than the row id, so repeated measurements of one configuration
    never straddle the split."""
    key = "|".join(map(str, (row.backend, row.system, row.model, row.gemm_quant, row.tp,
                             row.dp, row.moe_tp, row.moe_ep, row.isl, row.osl,
                             row.concurrency)))
    return zlib.crc32(key.encode()) % folds == 0


def iter_setups(rows: list[Row], *, max_tokens: int) -> Iterator[tuple[Row, Setup | str]]:
    for row in rows:
        try:
            yield row, setup(row, max_tokens=max_tokens)
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


# ---------------------------------------------------------------------------------------------
# Steady state


def steady_state(s: Setup, timer: AnalyticalTimer) -> tuple[float, float]:
    """(TTFT, TPOT) of a closed loop in steady state, from the timer alone, the way the
    vLLM engine schedules it (checked against ``replay_staggered``).

    One rank runs ``c`` requests at uniformly spread stages. A prompt arrives when another
    request finishes, i.e. at a pass end, and is scheduled in the next pass after the
    running decodes, with the rest of the token budget ``B``: ``k = ceil(isl / (B - c))``
    passes carry it, the last of which also emits its first token. A request lives
    ``k + osl - 1`` passes, so ``lam = c / (k + osl - 1)`` prompts start per pass.
    TPOT is the mean pass: ``c`` decodes at mean context ``isl + osl / 2`` plus ``lam``
    prompts' chunks. TTFT is the ``k`` passes carrying the prompt (the pass in flight has
    just ended when the prompt arrives, so there is no residual wait).
    """
    row, role = s.row, s.role
    clients = max(1.0, row.concurrency / role.attention_data)
    isl, osl = row.isl, row.osl
    budget = role.max_batched_tokens
    # Requests that can run at once: sequence cap, KV blocks at the mean length (blocks are
    # taken as sequences grow), half the token budget.
    fit = role.num_gpu_blocks // max(1, math.ceil((isl + osl / 2) / role.block_size))
    c = max(1.0, min(clients, role.max_sequences, fit, budget // 2))
    room = max(1.0, budget - (c - 1))
    k = max(1, math.ceil(isl / room))
    lam = c / (k + osl - 1)
    b = max(1.0, lam)  # prompts sharing the pass that carries one
    ctx = isl + osl / 2
    decode = timer.decode_ms(round(c), round(c * ctx), ctx, 0)
    chunks = 0.0
    start = 0
    for _ in range(k):
        end = min(isl, start + int(room))
        chunks += timer.prefill_ms(b, end, start)  # type: ignore[arg-type]
        start = end
    step = decode + lam / b * chunks
    ttft = k * decode + chunks
    if clients > c:
        # The other clients wait for a slot: throughput c / lifetime (Little's law).
        ttft += (clients / c - 1) * (ttft + (osl - 1) * step)
    return ttft, step


class StaggeredClosedLoop:
    """Closed loop whose first wave arrives spread over one request lifetime.

    A benchmark that has run for a while has its ``c`` requests at uniformly spread
    stages; starting them all at t=0 instead keeps fixed-length requests in lockstep for
    the whole replay (every wave prefills together). Request ``i < c`` arrives at
    ``i * lifetime / c``; each completion releases the next request at once.
    """

    def __init__(self, isl: int, osl: int, concurrency: int, total: int, gap_ms: float) -> None:
        self.src = SyntheticSource(input_tokens=isl, output_tokens=osl)
        self.concurrency = concurrency
        self.total = total
        self.gap = gap_ms
        self.next_id = 0

    @property
    def max_time_ms(self) -> float | None:
        return None

    def _spec(self, arrival: float):  # type: ignore[no-untyped-def]
        from servesim.workloads.synthetic import SyntheticRequest

        spec = SyntheticRequest(self.src, self.next_id).first_turn(arrival)
        self.next_id += 1
        return spec

    def start(self):  # type: ignore[no-untyped-def]
        self.next_id = 0
        for i in range(min(self.concurrency, self.total)):
            yield self._spec(i * self.gap)

    def on_terminal(self, request, time_ms):  # type: ignore[no-untyped-def]
        if self.next_id >= self.total:
            return []
        return [self._spec(time_ms)]


def replay_staggered(s: Setup, constants: AnalyticalConstants) -> Result:
    """Replay one row through the engine, first wave staggered (see StaggeredClosedLoop)."""
    timer = AnalyticalTimer(s.geometry, constants)
    _, step = steady_state(s, timer)
    lifetime = timer.prefill_ms(1, s.row.isl, 0) + s.row.osl * step
    records: list[RequestRecord] = []
    wl = StaggeredClosedLoop(s.row.isl, s.row.osl, s.row.concurrency, s.requests,
                             lifetime / s.row.concurrency)
    AggregatedReplay(s.role, timer, wl, records.append, None).run()
    c = s.row.concurrency
    if s.requests >= 2 * c:
        # Second wave only: its requests live entirely in a full loop (the first wave ramps
        # up, the last one drains), which is what a steady-state benchmark measures.
        records = [r for r in records if c <= r.request_id < 2 * c]
    return summarize(records)
