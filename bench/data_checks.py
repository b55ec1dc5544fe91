"""Model-free checks of the calibration rows: ratios between measurements that differ in
one column only.

    .venv/bin/python bench/data_checks.py              # output length, then version
    .venv/bin/python bench/data_checks.py --column system --min-configs 1
    .venv/bin/python bench/data_checks.py --remeasured # one configuration, several runs

For the chosen column (``osl``, ``version``, ``system``, ...) each configuration
(``calib.configuration``) of the aggregated rows measured at two values of it (each
measurement once: rows ``calib.load_rows`` excludes are left out) gives one
ratio of the second value's TTFT and TPOT to the first's (repeated measurements by their
median). One line per GPU, backend, model, version (where the column is not the version)
and the two values: how many configurations, and the median (lowest-highest) ratios.

What to expect: at the same prompts and concurrency a longer output leaves TTFT alike (the
same prompt work, a little less often). Once outputs are long enough that prompts seldom
interrupt decoding (1024 -> 8192 after 1024-token prompts), TPOT stays alike or grows
(longer contexts to read), so a TPOT ratio well under 1 there is speculative decoding;
short outputs (128 -> 512) lower TPOT by spreading each prompt's prefill over more
tokens. A TTFT ratio far from 1 is a setting of the runs that the columns do not record.
``bench/data/README.md`` discusses what these lines show.

``--remeasured`` checks the other way round: configurations alike in every column that
distinct runs measured more than once give one ratio each, the highest measurement over
the lowest, which run-to-run noise keeps near 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib


def ratios(rows: list[calib.Row], column: str
           ) -> dict[tuple[object, ...], list[tuple[float, float]]]:
    """Per group, one (TTFT, TPOT) ratio for each configuration measured at two values of
    ``column`` and alike in every other column: the second value's median measurements
    over the first's (repeated measurements of one configuration count once). Groups are
    GPU, backend, model, version (unless ``column`` is the version) and the two values,
    lower first."""
    if column not in calib.CONFIGURATION:
        raise ValueError(f"not a configuration column: {column!r}")
    alike: dict[tuple[object, ...], dict[object, list[calib.Row]]] = defaultdict(
        lambda: defaultdict(list))
    for r in rows:
        if calib.counted(r):
            alike[calib.configuration(r, (column,))][getattr(r, column)].append(r)
    out: dict[tuple[object, ...], list[tuple[float, float]]] = defaultdict(list)
    for by_value in alike.values():
        for a, b in combinations(sorted(by_value), 2):  # type: ignore[type-var]
            first, second = by_value[a], by_value[b]
            group: tuple[object, ...] = (first[0].system, first[0].backend,
                                         first[0].model.split("/")[-1])
            if column != "version":
                group += (first[0].version or "-",)
            group += (f"{a or '-'} -> {b or '-'}",)
            out[group].append(
                (statistics.median(r.ttft_ms for r in second)
                 / statistics.median(r.ttft_ms for r in first),
                 statistics.median(r.tpot_ms for r in second)
                 / statistics.median(r.tpot_ms for r in first)))
    return out


def remeasured(rows: list[calib.Row]) -> dict[tuple[object, ...], list[tuple[float, float]]]:
    """Per GPU, backend, model and version, one (TTFT, TPOT) ratio, highest over lowest,
    for each configuration that several rows measure (distinct runs: the rows
    ``calib.load_rows`` excludes as repeats are left out)."""
    alike: dict[tuple[object, ...], list[calib.Row]] = defaultdict(list)
    for r in rows:
        if calib.counted(r):
            alike[calib.configuration(r)].append(r)
    out: dict[tuple[object, ...], list[tuple[float, float]]] = defaultdict(list)
    for same in alike.values():
        if len(same) > 1:
            first = same[0]
            ttft, tpot = [r.ttft_ms for r in same], [r.tpot_ms for r in same]
            out[(first.system, first.backend, first.model.split("/")[-1],
                 first.version or "-")].append((max(ttft) / min(ttft), max(tpot) / min(tpot)))
    return out


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):5.2f} ({min(values):.2f}-{max(values):.2f})"


def report(title: str, groups: dict[tuple[object, ...], list[tuple[float, float]]],
           min_configs: int, total: bool = False) -> None:
    """One line per group of (TTFT, TPOT) ratios, after one over all of them if ``total``."""
    print(f"\n{title:68} configs  TTFT ratio        TPOT ratio")
    lines = sorted((" / ".join(map(str, group)), found) for group, found in groups.items())
    if total:
        lines.insert(0, ("all", [ratio for found in groups.values() for ratio in found]))
    for label, found in lines:
        if found and len(found) >= min_configs:
            print(f"  {label[:66]:66} {len(found):5d}  {_spread([t for t, _ in found]):17} "
                  f"{_spread([p for _, p in found])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--column", action="append", choices=calib.CONFIGURATION,
                    help="the column the rows of a pair differ in (repeatable; default: "
                         "osl, then version)")
    ap.add_argument("--remeasured", action="store_true",
                    help="instead: configurations that distinct runs measured more than once")
    ap.add_argument("--min-configs", type=int, default=3,
                    help="leave out lines of fewer configurations")
    ap.add_argument("--data", type=Path, default=calib.DATA,
                    help="measurements in the calibration CSV's columns")
    args = ap.parse_args()
    rows = calib.load_rows(args.data)
    if args.remeasured:
        report("one configuration: highest over lowest", remeasured(rows), args.min_configs,
               total=True)
    for column in [] if args.remeasured else args.column or ["osl", "version"]:
        report(f"{column}: second value over first", ratios(rows, column), args.min_configs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
