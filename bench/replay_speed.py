"""Replay speed: wall and CPU seconds, simulated requests and output tokens per wall second,
peak RSS; the bulk decode advance against the stepwise reference, with their ratio.

Each case and mode runs in its own process so peak RSS is its own. Usage::

    python bench/replay_speed.py                 # poisson_10k and mooncake_conversation,
                                                 # both modes, ratio, report identity
    python bench/replay_speed.py --case poisson_1m   # the 1M-request run (bulk mode only)
    python bench/replay_speed.py --case poisson_10k --mode stepwise
    python bench/replay_speed.py --repeat 4      # best of 4 replays per process (noisy hosts)
    python bench/replay_speed.py --case poisson_1m --requests 40000   # a smaller generated run
    python bench/replay_speed.py --case pd_mooncake_conversation   # prefill/decode (P/D)

Setup: aggregated vLLM workers of Qwen3-32B on one H200 each (pool from GPU memory),
block 64, max_batched_tokens 8192, max_sequences 256, prefix caching on, polynomial
timing. poisson_10k and mooncake_conversation (12,031 requests) run on one worker, from
bench/traces/. poisson_1m runs on 16 workers: a 1,000,000-request Poisson trace generated
here deterministically (seeded; never committed) into a temporary file, with per-request
JSONL streamed to a temporary file. pd_mooncake_conversation replays mooncake_conversation
on six prefill and three decode workers (the same per-worker setup) joined by a 25 GB/s KV
link per prefill worker, which the transfers leaving one worker share.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.parallelism]
replicas = {replicas}
[engine.workers.aggregated.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.aggregated.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.aggregated.timing]
type = "polynomial"
[traffic.source]
type = "trace"
paths = ["{trace}"]
[traffic.load]
type = "trace_timestamps"
"""

# P/D: prefill and decode pools, each worker like the aggregated one.
PD_CONFIG = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.prefill.parallelism]
replicas = 6
[engine.workers.prefill.scheduler]
max_batched_tokens = 8192
[engine.workers.prefill.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.prefill.timing]
type = "polynomial"
[engine.workers.decode.parallelism]
replicas = 3
[engine.workers.decode.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.decode.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.decode.timing]
type = "polynomial"
[engine.kv_transfer]
bandwidth_gb_per_second = 25.0
[traffic.source]
type = "trace"
paths = ["{trace}"]
[traffic.load]
type = "trace_timestamps"
"""
CONFIGS = {"pd_mooncake_conversation": PD_CONFIG}

CASES = {
    "poisson_10k": "traces/poisson_10k.jsonl",
    "mooncake_conversation": "traces/mooncake_conversation.jsonl",
    "pd_mooncake_conversation": "traces/mooncake_conversation.jsonl",
    "poisson_1m": None,  # generated
}
DEFAULT_CASES = ("poisson_10k", "mooncake_conversation")

# The generated trace: 1M requests, Poisson arrivals at 112 requests/s for 16 workers (7 per
# worker per second: busy, stable), prompt and output lengths like poisson_10k's. Prompts
# are a shared system prompt (one of 64) followed by blocks from a 50k-block vocabulary,
# so the trace reader's hash-id table stays bounded.
MILLION = 1_000_000
MILLION_RATE_PER_S = 112.0
MILLION_WORKERS = 16
MILLION_SEED = 20260101


def generate_million(path: Path, n: int = MILLION) -> None:
    rng = random.Random(MILLION_SEED)
    t = 0.0
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            t += rng.expovariate(MILLION_RATE_PER_S / 1000.0)
            isl = max(16, int(rng.lognormvariate(6.2, 0.6)))
            osl = max(1, int(rng.lognormvariate(5.3, 0.6)))
            blocks = -(-isl // 512)
            ids = [rng.randrange(64)] + [64 + rng.randrange(50_000) for _ in range(blocks - 1)]
            f.write(json.dumps({"timestamp": round(t, 3), "input_length": isl,
                                "output_length": osl, "hash_ids": ids}) + "\n")


def compiled_kernel() -> bool:
    """Whether the replay kernel is the mypyc build (SERVESIM_MYPYC=1, see setup.py)."""
    from servesim.engines.ranks import scheduler

    return not scheduler.__file__.endswith(".py")


def run_case(name: str, mode: str, repeat: int = 1,
             requests: int = MILLION) -> dict[str, float | str]:
    from servesim.compiler import compile_text
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import replay_payload

    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    engine = registry.engine_class("disagg" if name in CONFIGS else "vllm")
    engine.bulk_decode = mode == "bulk"  # type: ignore[union-attr]  # this process only
    with tempfile.TemporaryDirectory() as tmp:
        requests_out = None
        if CASES[name] is None:
            trace = Path(tmp) / "poisson_1m.jsonl"
            generate_million(trace, requests)
            replicas = MILLION_WORKERS
            requests_out = Path(tmp) / "requests.jsonl"
        else:
            trace = HERE / str(CASES[name])
            replicas = 1
        config = CONFIGS.get(name, CONFIG)
        payload = compile_text(config.format(trace=trace.as_posix(), replicas=replicas),
                               registry=registry)
        wall = cpu = float("inf")
        for _ in range(repeat):  # the best of ``repeat`` replays: hosts add noise, not speed
            cpu0 = time.process_time()
            started = time.perf_counter()
            outcome = replay_payload(payload, registry=registry, requests_out=requests_out)
            wall = min(wall, time.perf_counter() - started)
            cpu = min(cpu, time.process_time() - cpu0)
    report = outcome.report
    report.pop("trace_sha256", None)  # the generated trace's temporary file
    digest = hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest()
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": report["num_requests"],
        "completed": report["completed"],
        "output_tokens": report["total_output_tokens"],
        "requests_per_wall_s": report["num_requests"] / wall,
        "output_tokens_per_wall_s": report["total_output_tokens"] / wall,
        "peak_rss_mb": rss_mb,
        "virtual_s": report["duration_ms"] / 1000,
        "report_sha256": digest,
        "compiled": compiled_kernel(),
    }


def _child(name: str, mode: str, repeat: int, requests: int) -> dict[str, float | str]:
    out = subprocess.run([sys.executable, __file__, "--case", name, "--mode", mode,
                          "--repeat", str(repeat), "--requests", str(requests), "--child"],
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, float | str] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--mode", choices=("bulk", "stepwise", "both"), default=None,
                        help="default: both, except bulk for poisson_1m")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="replays per process; the best wall and CPU times are shown")
    parser.add_argument("--requests", type=int, default=MILLION,
                        help="size of the generated trace of poisson_1m")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_case(args.case, args.mode, args.repeat, args.requests)))
        return
    cases = [args.case] if args.case else list(DEFAULT_CASES)
    if not args.json:
        print(f"replay kernel: {'compiled (mypyc)' if compiled_kernel() else 'pure Python'}")
        print(f"{'case':22} {'mode':8} {'wall s':>8} {'cpu s':>8} {'requests':>9} {'req/s':>9} "
              f"{'out tok/s':>11} {'peak RSS MB':>12}")
    for name in cases:
        mode = args.mode or ("bulk" if name == "poisson_1m" else "both")
        modes = ("bulk", "stepwise") if mode == "both" else (mode,)
        runs = [_child(name, m, args.repeat, args.requests) for m in modes]
        for r in runs:
            if args.json:
                print(json.dumps({"case": name, **r}))
                continue
            print(f"{name:22} {r['mode']:8} {r['wall_s']:8.2f} {r['cpu_s']:8.2f} "
                  f"{r['requests']:9d} {r['requests_per_wall_s']:9.0f} "
                  f"{r['output_tokens_per_wall_s']:11.0f} {r['peak_rss_mb']:12.0f}")
        if len(runs) == 2 and not args.json:
            bulk, step = runs
            same = bulk["report_sha256"] == step["report_sha256"]
            wall = float(step["wall_s"]) / float(bulk["wall_s"])
            cpu = float(step["cpu_s"]) / float(bulk["cpu_s"])
            print(f"{name:22} ratio    stepwise/bulk wall {wall:.2f}x, cpu {cpu:.2f}x; "
                  f"reports {'identical' if same else 'DIFFER'}")


if __name__ == "__main__":
    main()
