"""Prefix-token reuse of request routers on the Mooncake conversation trace.

    .venv/bin/python bench/routing.py                    # every case
    .venv/bin/python bench/routing.py --case kv_aware    # one router on 4 replicas
    .venv/bin/python bench/routing.py --requests 3000    # the trace's first rows only

Setup: aggregated vLLM workers of Qwen3-32B on one H200 each, block 64, max_batched_tokens
8192, max_sequences 256, prefix caching on, polynomial timing, and *ample* KV capacity (a
fixed pool per worker larger than every block the trace names, so nothing is evicted and
reuse is lost only where a request lands away from its prefix). The trace
(bench/traces/mooncake_conversation.jsonl, 12,031 rows, timestamps replayed) has no
session ids: a conversation's turns are the rows whose hash ids extend an earlier row's.

Cases: one worker (the reuse the trace allows at this capacity), then 4 replicas with each
built-in router (``kv_aware`` also with a temperature and with larger overlap weights), then
a P/D deployment of 2 prefill and 2 decode workers (50 GB/s link), both roles round-robin
or both ``kv_aware``; a P/D request's reuse is its prefill worker's. For each it prints the
reuse (``prefix_cache_reused_ratio``: reused over all prompt tokens), its ratio to the
one-worker reuse, the mean TTFT and the wall time. The target for ``kv_aware`` on 4
replicas is at least 0.90 of the one-worker reuse.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "mooncake_conversation.jsonl"
BLOCKS = 2_000_000  # per worker: more than the 1.46M 64-token blocks the trace names

CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
{deployment}
[traffic.source]
type = "trace"
paths = ["{trace}"]
[traffic.load]
type = "trace_timestamps"
{stop}
"""
PD = 'mode = "disaggregated"\n[engine.kv_transfer]\nbandwidth_gb_per_second = 50.0\n'

ROLE = """
[engine.workers.{role}.parallelism]
replicas = {replicas}
[engine.workers.{role}.scheduler]
max_batched_tokens = 8192
max_sequences = {sequences}
[engine.workers.{role}.kv_cache]
block_size = 64
prefix_caching = true
bytes_per_token = 262144
capacity = {{ type = "fixed", blocks = {blocks} }}
[engine.workers.{role}.timing]
type = "polynomial"
[engine.workers.{role}.routing]
{routing}
"""

# name -> (replicas, routing table); a "pd_" case runs that many prefill and decode workers

CASES = {
    "single": (1, 'type = "round_robin"'),
    "round_robin": (4, 'type = "round_robin"'),
    "least_loaded": (4, 'type = "least_loaded"'),
    "least_loaded_tokens": (4, 'type = "least_loaded"\nby = "tokens"'),
    "session_affinity": (4, 'type = "session_affinity"'),
    "kv_aware": (4, 'type = "kv_aware"'),
    "kv_aware_t0.1": (4, 'type = "kv_aware"\ntemperature = 0.1\nseed = 7'),
    "kv_aware_w4": (4, 'type = "kv_aware"\noverlap_weight = 4.0'),
    "kv_aware_w16": (4, 'type = "kv_aware"\noverlap_weight = 16.0'),
    "kv_aware_w64": (4, 'type = "kv_aware"\noverlap_weight = 64.0'),
    "pd_round_robin": (2, 'type = "round_robin"'),
    "pd_kv_aware_w4": (2, 'type = "kv_aware"\noverlap_weight = 4.0'),
}


def run_case(name: str, requests: int | None) -> dict[str, float | str]:
    from servesim.compiler import compile_text
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import replay_payload

    replicas, routing = CASES[name]
    stop = f"[traffic.stop]\nrequests = {requests}" if requests else ""
    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    roles = (("prefill", 8), ("decode", 256)) if name.startswith("pd_") else (
        ("aggregated", 256),)
    deployment = (PD if len(roles) == 2 else "") + "".join(
        ROLE.format(role=role, replicas=replicas, sequences=sequences, blocks=BLOCKS,
                    routing=routing) for role, sequences in roles)
    text = CONFIG.format(deployment=deployment, trace=TRACE.as_posix(), stop=stop)
    payload = compile_text(text, registry=registry)
    with tempfile.TemporaryDirectory():
        started = time.perf_counter()
        report = replay_payload(payload, registry=registry).report
        wall = time.perf_counter() - started
    return {"case": name, "replicas": replicas, "reuse": report["prefix_cache_reused_ratio"],
            "ttft_mean_ms": report["mean_ttft_ms"], "completed": report["completed"],
            "requests": report["num_requests"], "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=sorted(CASES), action="append",
                        help="the cases to run (default: all); the single-worker case "
                        "always runs, for the ratio")
    parser.add_argument("--requests", type=int, default=None,
                        help="replay only the trace's first N rows")
    parser.add_argument("--json", action="store_true", help="one JSON object per case")
    args = parser.parse_args()
    names = ["single", *[c for c in (args.case or CASES) if c != "single"]]
    base = None
    if not args.json:
        print(f"{'case':22} {'replicas':>8} {'reuse':>8} {'x single':>9} {'TTFT ms':>10} "
              f"{'completed':>10} {'wall s':>7}")
    for name in names:
        r = run_case(name, args.requests)
        base = base if base is not None else float(r["reuse"])
        ratio = float(r["reuse"]) / base if base else 0.0
        if args.json:
            print(json.dumps({**r, "ratio_to_single": ratio}))
            continue
        print(f"{name:22} {r['replicas']:8} {float(r['reuse']):8.2%} {ratio:9.3f} "
              f"{float(r['ttft_mean_ms']):10.1f} {r['completed']:10} {float(r['wall_s']):7.1f}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
