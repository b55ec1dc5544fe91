"""Accuracy of servesim's timing against measured serving runs.

    .venv/bin/python bench/accuracy.py                 # deterministic subsample, a few minutes
    .venv/bin/python bench/accuracy.py --limit 0       # every row (10 min on 2 cores, compiled)
    .venv/bin/python bench/accuracy.py --rows          # also print every row's errors
    .venv/bin/python bench/accuracy.py --data bench/data/validation_gpus.csv --limit 0
                                                       # H200, B300, GB300: GPUs not fitted on
    .venv/bin/python bench/accuracy.py --provider measured ...
                                                       # the measured kernel tables instead
    .venv/bin/python bench/accuracy.py --gpu b200_sxm --constants b200_out.json
                                                       # leave-one-GPU-out (bench/fit_timing.py)

Each row of bench/data/silicon_dev.csv is replayed through the config a user would write
for it (``calib.config``: the row's model, GPU, backend, precision and parallelism, the
stack's public defaults, a closed loop of ``concurrency`` clients with output lengths
spread by ``traffic.source.output_range_ratio``), compiled and replayed as ``servesim
replay`` does: ``--waves`` x concurrency requests in all (fewer when that exceeds
``--max-tokens`` output tokens, at least one wave), priced by ``--provider`` (the default
timing with the shipped or ``--constants`` constants, or the measured kernel tables),
whose front-end latency delays each request's admission. TTFT and TPOT are means over
every request, as the benchmark client reports them.

P/D (disaggregated) rows are replayed the same way through the disaggregated engine:
``prefill_num_workers`` and ``decode_num_workers`` workers of their own parallelism, the
KV of each prompt sent over the GPUs' scale-out links (``inter_node_bw`` of the GPU times
the GPUs of the smaller worker). ``overall`` and the backend, GPU, model and (for the
calibration rows the constants are fitted on) fold partitions are the aggregated rows,
which the accuracy targets are about; P/D rows are reported as ``mode: disagg`` and per
(GPU, backend, model).

To tell a level from a shape, the report ends with the MAPE that would be left if each
group of aggregated rows had its own constant factor (``calib.LEVELS``): per (GPU,
backend, model), per backend version as well, and per everything but the concurrency.

Rows that are not simulated are counted with their reason: models or GPUs missing from
the catalog, no KV budget, too many tokens for the budget, a measurement that is not a
steady state (``calib.inconsistent``), a P/D deployment's filed as aggregated
(``calib.pd_copies``), or one that another row already carries (``calib.repeats``: each
measurement counts once). Errors are
``predicted / measured - 1``; MAPE is the mean of their absolute values.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib

from servesim.errors import ServesimError
from servesim.timing.analytical import AnalyticalConstants, load_constants


def _mape(errors: list[float]) -> float:
    return 100.0 * sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


def _bias(errors: list[float]) -> float:
    """Mean signed error in %: a bias a missing mechanism leaves, where MAPE also counts
    the scatter between rows."""
    return 100.0 * sum(errors) / len(errors) if errors else float("nan")


def _replay(row: calib.Row, *, constants: AnalyticalConstants, max_tokens: int,
            waves: int, provider: str) -> calib.Result | str:
    """One row's replay, or why it could not be simulated."""
    try:
        s = calib.setup(row, max_tokens=max_tokens, waves=waves, timing=provider)
    except calib.Unsupported as exc:
        return str(exc).split(":")[0][:90]
    try:
        # the default timing with the constants asked for; other providers as configured
        return calib.replay(s, constants if provider == "default" else None)
    except (calib.Unsupported, ServesimError) as exc:
        return str(exc).split(":")[0][:90]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=400,
                    help="deterministic subsample size spread over partitions (0: all rows)")
    ap.add_argument("--waves", type=int, default=calib.WAVES,
                    help="requests = waves x concurrency")
    ap.add_argument("--max-tokens", type=int, default=calib.MAX_TOKENS,
                    help="output-token budget of one row's replay")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="rows replayed at once, one process each (default: every core)")
    ap.add_argument("--data", type=Path, default=calib.DATA,
                    help="measurements in the calibration CSV's columns (default: the "
                         "calibration rows; bench/data/unfitted_gpus.csv holds rows of a GPU "
                         "the constants were not fitted on)")
    ap.add_argument("--provider", choices=("default", "measured"), default="default",
                    help="timing.type of the replayed configs (measured: the kernel tables "
                         "of the optional aiconfigurator-core package)")
    ap.add_argument("--constants", type=Path, default=None,
                    help="the default timing's constants from this JSON file (as "
                         "bench/fit_timing.py writes them; default: the shipped ones)")
    ap.add_argument("--gpu", metavar="SYSTEM", default=None,
                    help="only the rows of this GPU (with --constants from bench/fit_timing.py "
                         "--leave-out-gpu SYSTEM: the GPU the fit did not see)")
    args = ap.parse_args()

    constants = load_constants() if args.constants is None else \
        AnalyticalConstants.from_json(json.loads(args.constants.read_text(encoding="utf-8")))
    all_rows = [r for r in calib.load_rows(args.data) if args.gpu in (None, r.system)]
    rows = calib.sample(all_rows, args.limit or None)
    started = time.perf_counter()
    skipped: Counter[str] = Counter()
    ttft: dict[tuple[str, ...], list[float]] = defaultdict(list)
    tpot: dict[tuple[str, ...], list[float]] = defaultdict(list)
    # per level of calib.LEVELS, per group: the aggregated rows' (TTFT, TPOT) ratios
    levels: list[dict[tuple[object, ...], list[tuple[float, float]]]] = [
        defaultdict(list) for _ in calib.LEVELS]
    done = 0
    if args.rows:
        print(f"{'TTFT meas':>10} {'pred':>9} {'err%':>7} "
              f"{'TPOT meas':>10} {'pred':>8} {'err%':>7}  row")
    replay = functools.partial(_replay, constants=constants, max_tokens=args.max_tokens,
                               waves=args.waves, provider=args.provider)
    with concurrent.futures.ProcessPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(replay, rows, chunksize=4))
    for row, res in zip(rows, outcomes, strict=True):
        if isinstance(res, str):
            skipped[res] += 1
            continue
        e_ttft = res.ttft_ms / row.ttft_ms - 1
        e_tpot = res.tpot_ms / row.tpot_ms - 1
        done += 1
        keys: list[tuple[str, ...]] = [("mode", row.mode)]
        if row.mode == "agg":  # the rows the targets are about
            keys += [("overall",), ("backend", row.backend), ("gpu", row.system),
                     ("model", row.model), ("gpu/backend/model", row.system, row.backend,
                                            row.model)]
            if args.data == calib.DATA:  # the fit's rows: which of them it saw
                keys.append(("fold", "holdout" if calib.holdout(row) else "fit"))
            for groups, (_, group_of) in zip(levels, calib.LEVELS, strict=True):
                groups[group_of(row)].append((e_ttft + 1, e_tpot + 1))
        else:
            keys.append(("P/D gpu/backend/model", row.system, row.backend, row.model))
        for key in keys:
            ttft[key].append(e_ttft)
            tpot[key].append(e_tpot)
        if args.rows:
            # the whole id, last: ids differ only in their tails
            print(f"{row.ttft_ms:10.1f} {res.ttft_ms:9.1f} {100 * e_ttft:7.1f} "
                  f"{row.tpot_ms:10.2f} {res.tpot_ms:8.2f} {100 * e_tpot:7.1f}  {row.id}")
    elapsed = time.perf_counter() - started
    print(f"\nrows: {len(all_rows)} in the file, {len(rows)} selected "
          f"(--limit {args.limit}), {done} simulated, {sum(skipped.values())} not simulated "
          f"({elapsed:.0f} s)")
    print(f"\n{'partition':70} {'n':>4} {'TTFT MAPE%':>11} {'bias':>6} {'TPOT MAPE%':>11} "
          f"{'bias':>6}")
    for key in sorted(ttft, key=lambda k: (len(k), k)):
        label = key[0] if len(key) == 1 else f"{key[0]}: {' / '.join(key[1:])}"
        print(f"{label[:70]:70} {len(ttft[key]):4d} {_mape(ttft[key]):11.1f} "
              f"{_bias(ttft[key]):6.1f} {_mape(tpot[key]):11.1f} {_bias(tpot[key]):6.1f}")
    parts = [k for k in ttft if k[0] == "gpu/backend/model"]
    over = sorted((k for k in parts if _mape(ttft[k]) > 2 * calib.TARGET_TTFT
                   or _mape(tpot[k]) > 2 * calib.TARGET_TPOT),
                  key=lambda k: -max(_mape(ttft[k]) / calib.TARGET_TTFT,
                                     _mape(tpot[k]) / calib.TARGET_TPOT))
    print(f"\n{len(over)} of {len(parts)} (GPU, backend, model) partitions over twice the "
          f"targets ({2 * calib.TARGET_TTFT:g}% TTFT, {2 * calib.TARGET_TPOT:g}% TPOT):")
    for key in over:
        print(f"  {' / '.join(key[1:])[:68]:68} {len(ttft[key]):4d} {_mape(ttft[key]):11.1f} "
              f"{_mape(tpot[key]):11.1f}")
    if ttft[("overall",)]:
        print("\naggregated rows' MAPE left once each group's predictions are scaled by its "
              "own best factor\n(the error within groups, which no per-group constant "
              "removes):")
        for groups, (name, _) in zip(levels, calib.LEVELS, strict=True):
            floors = [calib.level_floor([[r[i] for r in g] for g in groups.values()])
                      for i in (0, 1)]
            print(f"  {name:68} {len(groups):4d} {floors[0]:11.1f} {floors[1]:11.1f}")
    if skipped:
        print("\nnot simulated:")
        for reason, n in skipped.most_common():
            print(f"{n:5d}  {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
