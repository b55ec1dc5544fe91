"""Prefix reuse with a host-memory (G2) KV tier on the Mooncake conversation trace.

Three replays of bench/traces/mooncake_conversation.jsonl (12,031 requests) on one
vLLM worker of Qwen3-32B on an H200 (block 64, polynomial timing):

* ``ample``: a GPU pool that holds every distinct block of the trace (nothing useful is
  ever evicted): the reuse the trace allows;
* ``gpu_10pct``: a GPU pool of 10% of the trace's distinct blocks;
* ``gpu_10pct+host``: that pool plus a host tier of 10x its size (the trace's distinct
  blocks) over the H200's PCIe link (64 GB/s in the catalog).

Printed per run: first-admission prefix reuse (the share of prompt tokens not computed),
its G1 (GPU) and G2 (host) parts, blocks loaded from host and written back, the time the
loads took (total and mean), the mean TTFT, and the share of the ample reuse reached.
Usage::

    python bench/offload.py
    python bench/offload.py --json      # one JSON object per run
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACE = HERE / "traces" / "mooncake_conversation.jsonl"
BLOCK = 64

CONFIG = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.aggregated.kv_cache]
block_size = {block}
capacity = {{ type = "fixed", blocks = {blocks} }}
{host}
[engine.workers.aggregated.timing]
type = "polynomial"
[traffic.source]
type = "trace"
paths = ["{trace}"]
[traffic.load]
type = "trace_timestamps"
"""


def distinct_blocks(payload: Any) -> int:
    """The distinct full blocks of every prompt of the trace, at the bench's block size."""
    from servesim.engines.kernel.tokens import BlockIds, block_ids
    from servesim.workloads import build_workload

    seen: set[int] = set()
    for spec in build_workload(payload.workload).start():
        ids = BlockIds()
        block_ids(spec.prompt, BLOCK, ids)
        seen.update(ids.as_list())
    return len(seen)


def compile_run(blocks: int, host_blocks: int | None) -> Any:
    from servesim.compiler import compile_text

    host = "" if host_blocks is None else f"host_offload = {{ capacity_blocks = {host_blocks} }}"
    return compile_text(CONFIG.format(block=BLOCK, blocks=blocks, host=host,
                                      trace=TRACE.as_posix()))


def run(name: str, blocks: int, host_blocks: int | None) -> dict[str, Any]:
    from servesim.replay import replay_payload

    started = time.perf_counter()
    report = replay_payload(compile_run(blocks, host_blocks)).report
    reuse = report["first_admission_prefix_cache_reused_ratio"]
    return {
        "run": name,
        "gpu_blocks": blocks,
        "host_blocks": host_blocks or 0,
        "reuse": reuse,
        "g1": report.get("g1_prefix_hit_ratio", reuse),
        "g2": report.get("g2_prefix_hit_ratio", 0.0),
        "loaded_blocks": report.get("g2_onboarded_blocks", 0),
        "written_back_blocks": report.get("g2_written_back_blocks", 0),
        "load_ms_total": report.get("g2_onboard_ms_total", 0.0),
        "load_ms_mean": report.get("g2_onboard_ms_mean", 0.0),
        "ttft_mean_ms": report["mean_ttft_ms"],
        "wall_s": time.perf_counter() - started,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON object per run")
    args = parser.parse_args()
    distinct = distinct_blocks(compile_run(1, None))
    small = distinct // 10
    runs = [run("ample", distinct, None), run("gpu_10pct", small, None),
            run("gpu_10pct+host", small, 10 * small)]
    ample = runs[0]["reuse"]
    for r in runs:
        r["of_ample"] = r["reuse"] / ample if ample else 0.0
    if args.json:
        for r in runs:
            print(json.dumps(r, sort_keys=True))
        return
    print(f"trace: {TRACE.name}, {distinct} distinct blocks of {BLOCK} tokens")
    print(f"{'run':16} {'gpu blk':>8} {'host blk':>8} {'reuse':>7} {'G1':>7} {'G2':>7} "
          f"{'of ample':>8} {'loaded':>8} {'wr-back':>8} {'load ms':>9} {'mean ms':>8} "
          f"{'TTFT ms':>9} {'wall s':>7}")
    for r in runs:
        print(f"{r['run']:16} {r['gpu_blocks']:8d} {r['host_blocks']:8d} {r['reuse']:7.1%} "
              f"{r['g1']:7.1%} {r['g2']:7.1%} {r['of_ample']:8.1%} {r['loaded_blocks']:8d} "
              f"{r['written_back_blocks']:8d} {r['load_ms_total']:9.1f} "
              f"{r['load_ms_mean']:8.2f} {r['ttft_mean_ms']:9.1f} {r['wall_s']:7.1f}")


if __name__ == "__main__":
    main()
