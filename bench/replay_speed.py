"""Replay speed: wall seconds, simulated requests and output tokens per wall second, peak RSS.

Each case runs in its own process so peak RSS is the case's own. Usage::

    python bench/replay_speed.py            # poisson_10k and the Mooncake conversation trace
    python bench/replay_speed.py --case poisson_10k

Setup: one aggregated vLLM worker of Qwen3-32B on one H200 (pool from GPU memory),
block 64, max_batched_tokens 8192, max_sequences 256, prefix caching on, polynomial
timing. The traces are in bench/traces/.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
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

CASES = {
    "poisson_10k": "traces/poisson_10k.jsonl",
    "mooncake_conversation": "traces/mooncake_conversation.jsonl",
}


def run_case(name: str) -> dict[str, float]:
    from servesim.compiler import compile_text
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import replay_payload

    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    trace = (HERE / CASES[name]).as_posix()
    payload = compile_text(CONFIG.format(trace=trace), registry=registry)
    started = time.perf_counter()
    outcome = replay_payload(payload, registry=registry)
    wall = time.perf_counter() - started
    report = outcome.report
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "wall_s": wall,
        "requests": report["num_requests"],
        "completed": report["completed_requests"],
        "output_tokens": report["total_output_tokens"],
        "requests_per_wall_s": report["num_requests"] / wall,
        "output_tokens_per_wall_s": report["total_output_tokens"] / wall,
        "peak_rss_mb": rss_mb,
        "virtual_s": report["duration_ms"] / 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES))
    parser.add_argument("--json", action="store_true", help="print one JSON object per case")
    args = parser.parse_args()
    if args.case:
        print(json.dumps(run_case(args.case)))
        return
    print(f"{'case':24} {'wall s':>8} {'requests':>9} {'req/s':>9} {'out tok/s':>11} "
          f"{'peak RSS MB':>12}")
    for name in CASES:
        out = subprocess.run([sys.executable, __file__, "--case", name], check=True,
                             capture_output=True, text=True).stdout
        r = json.loads(out)
        if args.json:
            print(json.dumps({"case": name, **r}))
            continue
        print(f"{name:24} {r['wall_s']:8.2f} {r['requests']:9d} {r['requests_per_wall_s']:9.0f} "
              f"{r['output_tokens_per_wall_s']:11.0f} {r['peak_rss_mb']:12.0f}")


if __name__ == "__main__":
    main()
