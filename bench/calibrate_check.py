"""How far ``servesim calibrate`` takes the default timing on a deployment family it is
given a few measurements of.

    .venv/bin/python bench/calibrate_check.py                  # every partition, ~16 min
    .venv/bin/python bench/calibrate_check.py --holdout 12     # fewer held-out rows each
    .venv/bin/python bench/calibrate_check.py --partition Qwen3-32B

For each (GPU, backend, model) partition of ``bench/data/silicon_dev.csv`` with at least
``--min-rows`` replayable aggregated rows (``calib.counted``), ``--calib-rows`` of its
rows spread over concurrency (the lowest, the highest and evenly between, in the order of
concurrency; with ``--one-deployment``, rows of the deployment the partition measured at
the most concurrencies: one parallelism, precision, ISL, OSL and version) are the user's
measurements: the corrections of
:mod:`servesim.calibrate.fit` (prefill and decode scales, front end per request and per
prompt token, a fixed time per decode pass, as far as those rows determine them) are
fitted to them, each row's prediction a re-pricing of its recorded passes
(``calib.record``, exact for TPOT; TTFT up to the front end's overlap with a pass). The
other rows of the partition (at most ``--holdout`` of them, spread over the partition)
are then replayed (``calib.replay``'s closed loop, the engine as ``servesim replay`` runs
it) with the uncalibrated and the calibrated timing, and their TTFT and TPOT MAPE are
printed side by side. The rows' parallelism, precision, ISL and OSL differ within a
partition: the held-out error is that of predicting configurations that were not
measured, from a few that were. ``oracle`` is the held-out MAPE the uncalibrated
predictions would have if scaled by the one factor that suits the held-out rows best
(``calib.level_floor``, chosen with hindsight): what no per-partition level can remove.

Target: the median partition's held-out MAPE at most 5% (TPOT) and 15% (TTFT).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib

from servesim.calibrate.fit import FitResult, Latencies, Target, Values, fit
from servesim.timing.analytical import AnalyticalTimer, load_constants
from servesim.timing.calibration import CalibratedTimer

TARGET_TTFT, TARGET_TPOT = 15.0, 5.0
ROLE = "aggregated"
COLUMNS = ("ttft_before", "ttft_after", "tpot_before", "tpot_after")


def spread_over_concurrency(rows: Sequence[calib.Row], k: int,
                            one_deployment: bool = False) -> list[calib.Row]:
    """``k`` rows from the lowest to the highest concurrency, evenly spaced in that order
    (ties broken by id, so the choice is deterministic). With ``one_deployment``, of one
    deployment only, as a user would measure theirs: the configuration (everything but
    the concurrency) measured at the most concurrencies (then the most rows), one row per
    concurrency."""
    ordered = sorted(rows, key=lambda r: (r.concurrency, r.id))
    if one_deployment:
        groups: dict[tuple[object, ...], list[calib.Row]] = defaultdict(list)
        for r in ordered:
            groups[calib.configuration(r, ("concurrency",))].append(r)
        best = max(groups.values(), key=lambda g: (len({r.concurrency for r in g}), len(g)))
        once = {r.concurrency: r for r in reversed(best)}
        ordered = [once[c] for c in sorted(once)]
    if k >= len(ordered):
        return ordered
    return [ordered[round(i * (len(ordered) - 1) / (k - 1))] for i in range(k)]


def evenly(rows: Sequence[calib.Row], limit: int) -> list[calib.Row]:
    if limit <= 0 or limit >= len(rows):
        return list(rows)
    step = len(rows) / limit
    return [rows[int(i * step)] for i in range(limit)]


def timer(s: calib.Setup, values: Values | None) -> AnalyticalTimer | CalibratedTimer:
    base = AnalyticalTimer(s.geometry, load_constants())
    return base if values is None else CalibratedTimer(base, values[ROLE])


def replay(s: calib.Setup, values: Values | None) -> tuple[float, float]:
    result = calib.replay(s, timer_for=lambda role, geometry: timer(s, values))
    return result.ttft_ms, result.tpot_ms


def calibrate(setups: Sequence[calib.Setup]) -> FitResult:
    recordings = [calib.record(s) for s in setups]

    def predict(i: int, values: Values) -> Latencies:
        ttft, tpot = recordings[i].evaluate(timer(setups[i], values))  # type: ignore[arg-type]
        return ttft, tpot

    targets = [Target(label=s.row.id, ttft_ms=s.row.ttft_ms, tpot_ms=s.row.tpot_ms,
                      input_tokens=s.row.isl, load=float(s.row.concurrency)) for s in setups]
    return fit(targets, [ROLE], predict)


def mape(errors: Sequence[float]) -> float:
    return 100.0 * statistics.fmean(abs(e) for e in errors) if errors else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-rows", type=int, default=12)
    ap.add_argument("--calib-rows", type=int, default=4)
    ap.add_argument("--holdout", type=int, default=20,
                    help="held-out rows replayed per partition (0: all)")
    ap.add_argument("--max-tokens", type=int, default=1_000_000,
                    help="output tokens per replay (fewer waves above)")
    ap.add_argument("--partition", default="", help="only partitions naming this text")
    ap.add_argument("--one-deployment", action="store_true",
                    help="calibrate on rows of one deployment (one parallelism, precision, "
                    "ISL, OSL and version) rather than of the whole partition")
    args = ap.parse_args()
    started = time.perf_counter()
    by: dict[tuple[str, str, str], list[calib.Setup]] = defaultdict(list)
    rows = [r for r in calib.load_rows() if calib.counted(r)
            and args.partition in " / ".join((r.system, r.backend, r.model))]
    for row, s in calib.iter_setups(rows, max_tokens=args.max_tokens):
        if isinstance(s, calib.Setup):
            by[(row.system, row.backend, row.model)].append(s)
    print(f"{'partition':58} {'rows':>4} {'held':>4}  {'TTFT before':>11} {'after':>6}  "
          f"{'TPOT before':>11} {'after':>6}  {'oracle TTFT':>5} {'TPOT':>5}  fitted")
    summary: list[tuple[float, ...]] = []
    same_rows: list[tuple[float, ...]] = []
    for key in sorted(by, key=lambda k: -len(by[k])):
        name = " / ".join(key)
        setups = by[key]
        if len(setups) < args.min_rows or args.partition not in name:
            continue
        chosen = spread_over_concurrency([s.row for s in setups], args.calib_rows,
                                         args.one_deployment)
        ids = {r.id for r in chosen}
        result = calibrate([s for s in setups if s.row.id in ids])
        deployment = calib.configuration(chosen[0], ("concurrency",))
        held = evenly([s for s in setups if s.row.id not in ids], args.holdout)
        errs: dict[str, list[float]] = defaultdict(list)
        for s in held:
            same = calib.configuration(s.row, ("concurrency",)) == deployment
            for label, values in (("before", None), ("after", result.values)):
                ttft, tpot = replay(s, values)
                for kind in ("all", "same") if same else ("all",):
                    errs[f"{kind}_ttft_{label}"].append(ttft / s.row.ttft_ms - 1)
                    errs[f"{kind}_tpot_{label}"].append(tpot / s.row.tpot_ms - 1)
        row = tuple(mape(errs[f"all_{k}"]) for k in COLUMNS) + tuple(
            calib.level_floor([[1 + e for e in errs[f"all_{k}_before"]]])
            for k in ("ttft", "tpot"))
        summary.append(row)
        if errs["same_ttft_after"]:
            same_rows.append(tuple(mape(errs[f"same_{k}"]) for k in COLUMNS))
        v = result.values[ROLE]
        fitted = ", ".join(f"{f}={getattr(v, f):.3g}" for f in result.fitted[ROLE])
        cv = [abs(e) for p in result.points for e in (
            p.cross[0] / p.target.ttft_ms - 1 if p.cross and p.cross[0] else float("nan"),)]
        print(f"{name:58} {len(setups):4d} {len(held):4d}  {row[0]:10.1f}% {row[1]:5.1f}%  "
              f"{row[2]:10.1f}% {row[3]:5.1f}%  {row[4]:5.1f}% {row[5]:5.1f}%  {fitted}",
              flush=True)
        if errs["same_ttft_after"]:
            r = same_rows[-1]
            print(f"{'  of which the calibrated deployment':58} {'':4} "
                  f"{len(errs['same_ttft_after']):4d}  {r[0]:10.1f}% {r[1]:5.1f}%  "
                  f"{r[2]:10.1f}% {r[3]:5.1f}%  (cross-validated TTFT on the four: "
                  f"{100 * statistics.fmean(cv):.1f}%)", flush=True)
    if not summary:
        print("no partition with enough rows")
        return 1
    for title, rows in (("held-out rows", summary),
                        ("held-out rows of the calibrated deployment", same_rows)):
        if not rows:
            continue
        print(f"\n{title}:")
        names = ("TTFT before", "TTFT after", "TPOT before", "TPOT after", "TTFT oracle",
                 "TPOT oracle")
        for i, what in enumerate(names[:len(rows[0])]):
            values = sorted(r[i] for r in rows)
            q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
            print(f"{what:12} over {len(values):2d} partitions: median "
                  f"{statistics.median(values):5.1f}%  quartiles {q[0]:5.1f}% / {q[2]:5.1f}%"
                  f"  min {values[0]:5.1f}%  max {values[-1]:5.1f}%")
    ttft = statistics.median(r[1] for r in summary)
    tpot = statistics.median(r[3] for r in summary)
    print(f"\ntarget (median partition, held-out rows): TTFT <= {TARGET_TTFT:g}% "
          f"({'met' if ttft <= TARGET_TTFT else 'missed'}: {ttft:.1f}%), TPOT <= "
          f"{TARGET_TPOT:g}% ({'met' if tpot <= TARGET_TPOT else 'missed'}: {tpot:.1f}%)")
    print(f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
