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


def load_rows(path: Path = DATA) -> list[Row]:
    rows = []
    with path.open(newline="", encoding="utf-8") as f:
        for raw in csv.DictReader(f):
            rows.append(Row(
                id=raw["id"], backend=raw["backend"], system=raw["system"],
                model=raw["model_path"], mode=raw["mode"], isl=int(raw["isl"]),
                osl=int(raw["osl"]), concurrency=_concurrency(raw),
                tp=_int(raw["tp_size"]), dp=_int(raw["attention_dp_size"]),
                moe_tp=_int(raw["moe_tp_size"]), moe_ep=_int(raw["moe_ep_size"]),
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
    """(TTFT, TPOT) of a closed loop in steady state, from the timer alone.

    In a long closed loop the ``c`` requests of a rank are spread uniformly over their
    lifetime: every pass decodes ``c`` requests at mean context ``isl + osl/2`` and carries
    ``c / osl`` new prompts on average. TPOT is the mean pass time; TTFT is the wait for
    the pass in flight (half a pass) plus the pass carrying the prompt.
    """
    row = s.row
    c = max(1.0, row.concurrency / s.role.attention_data)
    ctx = row.isl + row.osl / 2
    decode = timer.decode_ms(round(c), round(c * ctx), ctx, 0)
    prefill = timer.prefill_ms(1, row.isl, 0)
    per_pass = min(c / row.osl, c)
    step = decode + per_pass * prefill
    ttft = 0.5 * step + prefill + decode
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
    return summarize(records)
