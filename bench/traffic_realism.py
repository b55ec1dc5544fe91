"""Drawn traffic against its parameters: sampled mean and CV of lengths and arrival gaps.

Usage: ``python bench/traffic_realism.py [--requests N] [--seed S]``. For each length
distribution and each gamma CV it prints the target, the sampled value and their ratio,
and how many requests per second the workload draws (lengths and arrivals included).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

from servesim.workloads import build_workload, gamma_arrivals

LENGTHS: list[tuple[str, dict[str, Any], float, float]] = [  # name, table, mean, cv
    ("uniform 100..300", {"distribution": "uniform", "min": 100, "max": 300}, 200, 0.2887),
    ("normal 1000/200", {"distribution": "normal", "mean": 1000, "std": 200}, 1000, 0.2),
    ("lognormal 2000/800", {"distribution": "lognormal", "mean": 2000, "std": 800}, 2000, 0.4),
    ("lognormal 2000/3000", {"distribution": "lognormal", "mean": 2000, "std": 3000}, 2000, 1.5),
]


def _lengths(table: dict[str, Any], n: int, seed: int) -> tuple[list[int], float]:
    spec = {"source": {"type": "synthetic", "input_tokens": table, "seed": seed},
            "load": {"type": "gamma", "requests_per_second": 10.0, "cv": 2.0, "seed": seed},
            "stop": {"requests": n}}
    start = time.perf_counter()
    with build_workload(spec) as w:
        xs = [s.input_length for s in w.start()]
    return xs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    n = args.requests
    print(f"{'lengths':<22}{'mean':>10}{'ratio':>8}{'cv':>8}{'ratio':>8}{'req/s drawn':>14}")
    for name, table, mean, cv in LENGTHS:
        xs, seconds = _lengths(table, n, args.seed)
        m = statistics.fmean(xs)
        c = statistics.pstdev(xs) / m
        print(f"{name:<22}{m:>10.1f}{m / mean:>8.3f}{c:>8.3f}{c / cv:>8.3f}{n / seconds:>14,.0f}")
    print(f"\n{'gamma arrivals':<22}{'gap ms':>10}{'ratio':>8}{'cv':>8}{'ratio':>8}")
    for cv in (0.5, 1.0, 2.0, 4.0):
        times = list(itertools.islice(gamma_arrivals(10.0, cv, args.seed), n + 1))
        gaps = [b - a for a, b in itertools.pairwise(times)]
        m = statistics.fmean(gaps)
        c = statistics.pstdev(gaps) / m
        print(f"{'rate 10/s, cv ' + str(cv):<22}{m:>10.2f}{m / 100:>8.3f}{c:>8.3f}{c / cv:>8.3f}")


if __name__ == "__main__":
    main()
