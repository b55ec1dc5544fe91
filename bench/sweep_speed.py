"""Sweep speed: a 64-point sweep of examples/configs/qwen3_32b_h200.toml-sized replays
(200 requests each), run one point after another in this process, then on the local
process executor and on Ray, with each one's parallel efficiency:

    efficiency = serial wall time / (parallel wall time x workers)

1.0 means the sweep took 64 x (one replay) / workers; every executor's time includes
starting its workers (Ray's is also shown warm, its worker processes already started). The
rows of every executor are compared with the serial ones (they must be identical). Usage::

    python bench/sweep_speed.py                  # every core; Ray when installed
    python bench/sweep_speed.py --jobs 2 --points 32
    python bench/sweep_speed.py --no-ray
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from servesim.compiler.source import SourceText
from servesim.sweep.executors import default_jobs, run_tasks
from servesim.sweep.space import parse_settings, points
from servesim.sweep.trial import Base

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "configs" / "qwen3_32b_h200.toml"


def sweep(base: Base, tasks: list[Any], **kw: Any) -> tuple[float, list[Any]]:
    started = time.perf_counter()
    rows = dict(run_tasks(base, tasks, **kw))
    return time.perf_counter() - started, [rows[i] for i in sorted(rows)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=default_jobs())
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    source = SourceText.from_path(CONFIG)
    base = Base(text=source.text, name=source.name, base_dir=str(source.base_dir))
    # one point per concurrency: replays of the example's size, each a little different
    values = ",".join(str(8 + i % 16) for i in range(args.points))
    _, axes = parse_settings([f"traffic.load.concurrency={values}"])
    tasks = list(enumerate(points(axes)))
    serial, reference = sweep(base, tasks, jobs=1)
    one = serial / len(tasks)
    print(f"{len(tasks)} points, one replay {one * 1000:.0f} ms on average, serial "
          f"{serial:.2f} s; {args.jobs} workers")
    runs = [("process", {"jobs": args.jobs})]
    if not args.no_ray:
        try:
            import ray

            ray.init(num_cpus=args.jobs, include_dashboard=False, log_to_driver=False)
            # the first Ray sweep also starts Ray's worker processes (each imports
            # servesim); the second shows a long sweep's steady state
            runs += [("ray", {"executor": "ray"}), ("ray warm", {"executor": "ray"})]
        except ImportError:
            print("ray: not installed (pip install 'servesim[ray]')")
    for name, kw in runs:
        wall, rows = sweep(base, tasks, **kw)
        same = json.dumps(rows, sort_keys=True) == json.dumps(reference, sort_keys=True)
        ideal = len(tasks) * one / args.jobs
        print(f"{name:9s} wall {wall:6.2f} s  ideal {ideal:6.2f} s  efficiency "
              f"{serial / (wall * args.jobs):.2f}  rows identical to serial: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
