"""Maximum throughput of the default (analytical) timing against TensorRT-LLM's published
table.

    .venv/bin/python bench/throughput.py                  # every run, seconds
    .venv/bin/python bench/throughput.py --max-batch 256  # at most 256 sequences per rank

Each row of bench/data/trtllm_max_throughput.csv is one published ``trtllm-bench
throughput`` run: ``requests`` prompts of fixed ISL/OSL queued at once, output tokens per
second per GPU over the whole run. It is replayed the same way: every request arrives at
t=0, the worker (TensorRT-LLM defaults as in the calibration replays: ``calib.setup``,
FP8 KV cache for these checkpoints) admits as many as its KV cache and batch limit take,
and the throughput is the output tokens over the time the last one is emitted, divided by
the worker's GPUs. The table does not say what batch limit ``trtllm-bench`` chose for a
run, and at maximum load the throughput depends on it: ``--max-batch`` sets one.

None of these runs is in the calibration rows, and five are on the H200, a GPU the
constants were not fitted on: the figures test the fitted model away from its data, at
the batch sizes that set a deployment's cost. The script prints each row's published and
replayed figures and their ratio, and the mean absolute error per GPU and overall.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import attrs
import calib

from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm.engine import AggregatedReplay
from servesim.timing.analytical import AnalyticalTimer, load_constants
from servesim.workloads import build_workload

DATA = Path(__file__).resolve().parent / "data" / "trtllm_max_throughput.csv"


@dataclass(frozen=True)
class Run:
    published_model: str
    model: str
    system: str
    tp: int
    dp: int
    moe_ep: int
    gemm_quant: str
    isl: int
    osl: int
    requests: int
    tok_s_gpu: float

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def label(self) -> str:
        mapping = f"DEP{self.dp}" if self.dp > 1 else f"TP{self.tp}"
        return f"{self.published_model} / {self.system} / {mapping} / {self.isl}x{self.osl}"


def load_runs(path: Path = DATA) -> list[Run]:
    with path.open(newline="", encoding="utf-8") as f:
        return [Run(published_model=r["published_model"], model=r["model"],
                    system=r["system"], tp=int(r["tp"]), dp=int(r["attention_dp"]),
                    moe_ep=int(r["moe_ep"]), gemm_quant=r["gemm_quant"], isl=int(r["isl"]),
                    osl=int(r["osl"]), requests=int(r["requests"]),
                    tok_s_gpu=float(r["output_tok_s_per_gpu"]))
                for r in csv.DictReader(f)]


def replay(run: Run, max_batch: int = 0) -> float | str:
    """Output tokens per second per GPU of ``run``'s replay (at most ``max_batch``
    sequences per rank if set), or why it cannot be replayed."""
    row = calib.Row(
        id=run.label, backend="trtllm", system=run.system, model=run.model, mode="agg",
        isl=run.isl, osl=run.osl, concurrency=run.requests, tp=run.tp, dp=run.dp, moe_tp=1,
        moe_ep=run.moe_ep, gemm_quant=run.gemm_quant, moe_quant="", ttft_ms=0.0,
        tpot_ms=0.0)
    try:
        s = calib.setup(row, max_tokens=run.requests * run.osl, waves=1)
    except calib.Unsupported as exc:
        return str(exc)
    assert isinstance(s, calib.Setup)
    role = s.role
    if max_batch:
        role = attrs.evolve(role, max_sequences=min(role.max_sequences, max_batch))
    records: list[RequestRecord] = []
    # every request at once (a closed loop as wide as the run), exactly OSL tokens each
    workload = s.payload.workload
    source = attrs.evolve(workload.source, output_range_ratio=None)
    with build_workload(attrs.evolve(workload, source=source)) as load:
        AggregatedReplay(role, AnalyticalTimer(s.geometry, load_constants()), load,
                         records.append, None).run()
    done = [r for r in records if r.status == "completed" and r.token_times]
    if len(done) < run.requests:
        return f"{run.requests - len(done)} of {run.requests} requests did not complete"
    makespan_s = max(r.token_times[-1] for r in done) / 1e3
    return sum(r.output_length for r in done) / makespan_s / run.gpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="runs replayed at once, one process each (default: every core)")
    ap.add_argument("--max-batch", type=int, default=0,
                    help="sequences per rank at most (default: the TensorRT-LLM default the "
                         "calibration replays use, 2048, and what the KV cache holds)")
    args = ap.parse_args()
    runs = load_runs(args.data)
    started = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        results = list(pool.map(partial(replay, max_batch=args.max_batch), runs))
    print(f"{'published':>10} {'replayed':>9} {'ratio':>6}  output tok/s/GPU, run")
    errors: dict[str, list[float]] = {}
    for run, res in zip(runs, results, strict=True):
        if isinstance(res, str):
            print(f"{run.tok_s_gpu:10.0f} {'-':>9} {'-':>6}  {run.label}: not replayed, {res}")
            continue
        ratio = res / run.tok_s_gpu
        print(f"{run.tok_s_gpu:10.0f} {res:9.0f} {ratio:6.2f}  {run.label}")
        for key in ("all", run.system):
            errors.setdefault(key, []).append(ratio - 1)
    elapsed = time.perf_counter() - started
    print(f"\nmean absolute error of the replayed throughput ({elapsed:.0f} s):")
    for key, errs in sorted(errors.items(), key=lambda kv: (kv[0] != "all", kv[0])):
        mape = 100 * sum(abs(e) for e in errs) / len(errs)
        bias = 100 * sum(errs) / len(errs)
        print(f"  {key:10} {len(errs):3d} runs  {mape:5.1f}%  (bias {bias:+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
