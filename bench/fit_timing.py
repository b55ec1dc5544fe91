"""Refit the analytical timing constants on the calibration rows.

    .venv/bin/python bench/fit_timing.py            # fit and rewrite the shipped JSON
    .venv/bin/python bench/fit_timing.py --dry-run  # fit and print only
    .venv/bin/python bench/fit_timing.py --report   # accuracy of the shipped constants
    .venv/bin/python bench/fit_timing.py --cross-validate --cache rec.pkl
                                           # leave-one-GPU-out: fit on two GPUs, score the third

Rows: the aggregated rows of bench/data/silicon_dev.csv that the catalog can describe,
each measurement once (``calib.repeats``), P/D runs filed as aggregated left out
(``calib.pd_copies``; disaggregated rows are not used). Prediction
per row: what bench/accuracy.py's replay gives (``calib.replay``: the benchmark's closed
loop through the vLLM engine), computed by re-pricing a recording of that replay
(``calib.record``; TTFT up to the front end's latency), so one constant set costs
milliseconds per row instead of a replay.
``--fit-rows`` subsamples the rows (spread over the partitions) to keep a fit within
minutes; ``--report`` and ``--cross-validate`` use the same subsample (so ``--cache``
serves all three), the fit its rows outside the holdout fold.

Split: the holdout fold of ``calib.holdout`` (one configuration in five, by a hash of the
measured configuration) is never fitted; MAPE is reported on the fit rows, the holdout
rows and all rows, overall and per backend, and the worst (GPU, backend, model)
partitions are listed. ``--cross-validate`` measures transfer instead: for each GPU, the
constants fitted on the other GPUs' rows (both folds) score its rows, which is what a
user of a GPU the fit never saw gets; ``--leave-out-gpu`` writes one such fit (``--out``).
Rows are also split by whether the GPUs fitted show their kernel class (backend, GEMM and
expert kernels, attention), as extrapolation to a class no row showed is another matter.

Start: every fit, each fold's included, starts from ``START`` (constants no serving row
shaped), not from the shipped constants: those were fitted on every GPU's rows, so a fold
started from them would not really leave its GPU out; and the rows leave many constants
undetermined, so where a fit ends depends on where it starts. A ridge (``--ridge``) pulls
each constant's logarithm back towards its start.

Loss: robust (Huber, ``--huber``) least squares of the error of TPOT and, with weight
``--ttft-weight``, of TTFT, the error being ``log(predicted / measured)`` or, with
``--error relative``, ``predicted / measured - 1`` (what the MAPE report averages); each
row weighs ``1 / sqrt(rows of its (GPU, backend, model) partition)`` so that no partition
dominates. Search: Levenberg-Marquardt over the logarithms of the fitted scalars (global
efficiency scales, the fp8, FP4 and 4-bit weight-only kernels' efficiency relative to
bf16 for dense and expert GEMMs, the exposed share of the softmax, all-reduce latency,
per-expert cost, activation copies per token-expert pair, per-backend overheads) with a
finite-difference Jacobian, projected onto the bounds in ``BOUNDS``. Standard library
only.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import math
import os
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calib

from servesim.timing.analytical import (
    CONSTANTS_RESOURCE,
    AnalyticalConstants,
    AnalyticalTimer,
    load_constants,
)

OUT = (Path(__file__).resolve().parent.parent / "src" / "servesim" / "timing" / "data"
       / CONSTANTS_RESOURCE)
GLOBAL = ("gemm_scale", "moe_scale", "mem_scale", "attn_scale", "kv_scale", "allreduce_us",
          "expert_us", "moe_act_passes", "quant_level.fp8", "quant_level.fp4",
          "quant_level.w4a16", "moe_quant_level.fp8", "moe_quant_level.fp4",
          "moe_quant_level.w4a16", "softmax_exposed")
PER_BACKEND = ("step_ms", "layer_us", "moe_layer_us", "decode_req_us", "prefill_req_ms",
               "prefill_layer_us", "request_ms", "request_us_per_token", "request_layer_us",
               "request_moe_layer_us", "mla_layer_us", "request_mla_layer_us")
BACKENDS = ("vllm", "sglang", "trtllm")
BOUNDS = {
    "gemm_scale": (0.3, 1.2), "moe_scale": (0.05, 1.2), "mem_scale": (0.4, 1.15),
    "attn_scale": (0.2, 1.3), "kv_scale": (0.3, 1.5), "softmax_exposed": (0.01, 1.5),
    "allreduce_us": (2.0, 60.0),
    "expert_us": (0.01, 20.0), "moe_act_passes": (0.01, 32.0),
    "step_ms": (0.01, 20.0), "layer_us": (0.5, 200.0), "moe_layer_us": (0.01, 500.0),
    "decode_req_us": (0.01, 200.0),
    "prefill_req_ms": (0.001, 200.0), "prefill_layer_us": (0.1, 2000.0),
    "request_ms": (0.1, 1000.0), "request_us_per_token": (0.001, 200.0),
    "request_layer_us": (0.01, 5000.0), "request_moe_layer_us": (0.01, 5000.0),
    "mla_layer_us": (0.01, 500.0), "request_mla_layer_us": (0.01, 5000.0),
    # a dtype's kernel efficiency relative to bf16's
    "fp8": (0.2, 1.0), "fp4": (0.2, 1.0), "w4a16": (0.2, 1.0),
}
HUBER = 0.15  # error beyond which a residual counts linearly (outlier rows)
# Where every fit starts: unit efficiency scales; the fp8 levels are the ratios of
# aiconfigurator-core's measured H100, B200 and GB200 tables (fp8 over bf16 efficiency per
# FLOP, dense GEMMs at n = k = 8192 and expert GEMMs at 4,096-16,384 tokens); the other
# values are round ones inside their bounds; every backend starts from the overheads of the
# constants' ``default`` backend (``start``).
START = {"gemm_scale": 1.0, "moe_scale": 1.0, "mem_scale": 1.0, "attn_scale": 1.0,
         "kv_scale": 1.0, "allreduce_us": 5.0, "expert_us": 1.0, "moe_act_passes": 4.0,
         "quant_level.fp8": 0.72, "quant_level.fp4": 0.9, "quant_level.w4a16": 0.6,
         "moe_quant_level.fp8": 0.55, "moe_quant_level.fp4": 0.9,
         "moe_quant_level.w4a16": 0.5, "softmax_exposed": 0.5}


def start(shipped: AnalyticalConstants) -> AnalyticalConstants:
    """``shipped`` with every fitted constant at its start (``START``)."""
    default = shipped.overheads("default")
    values = dict(START)
    for b in BACKENDS:
        for f in PER_BACKEND:
            lo, hi = BOUNDS[f]
            values[f"{b}.{f}"] = min(hi, max(lo, getattr(default, f) or lo))
    return shipped.with_values(**values)


def _mape(errors: list[float]) -> float:
    return 100.0 * sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


Item = tuple[calib.Setup, calib.Recording]


def predict(c: AnalyticalConstants, item: Item) -> tuple[float, float]:
    s, rec = item
    return rec.evaluate(AnalyticalTimer(s.geometry, c))


def report(c: AnalyticalConstants, items: list[Item], worst: int = 12) -> None:
    """TTFT / TPOT MAPE of the replay prediction on fit, holdout and all rows."""
    errs: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for item in items:
        ttft, tpot = predict(c, item)
        r = item[0].row
        e = (ttft / r.ttft_ms - 1, tpot / r.tpot_ms - 1)
        fold = "holdout" if calib.holdout(r) else "fit"
        for key in ((fold,), ("all",), (fold, r.backend), ("all", r.backend),
                    ("all", r.system), ("part", r.system, r.backend, r.model)):
            errs.setdefault(key, []).append(e)
    print(f"\n{'rows':40} {'n':>5} {'TTFT MAPE%':>11} {'TPOT MAPE%':>11}")
    for key in sorted((k for k in errs if k[0] != "part"), key=lambda k: (len(k), k)):
        v = errs[key]
        print(f"{' / '.join(key):40} {len(v):5d} {_mape([e[0] for e in v]):11.1f} "
              f"{_mape([e[1] for e in v]):11.1f}")
    parts = sorted((k for k in errs if k[0] == "part"),
                   key=lambda k: -max(_mape([e[0] for e in errs[k]]) / calib.TARGET_TTFT,
                                      _mape([e[1] for e in errs[k]]) / calib.TARGET_TPOT))
    print("\nworst partitions (all rows):")
    for key in parts[:worst]:
        v = errs[key]
        print(f"{' / '.join(key[1:])[:60]:60} {len(v):5d} {_mape([e[0] for e in v]):11.1f} "
              f"{_mape([e[1] for e in v]):11.1f}")


def _record(s: calib.Setup | calib.PdSetup) -> calib.Recording | None:
    try:
        return calib.record(s)
    except calib.Unsupported:
        return None


def load_items(rows: list[calib.Row], cache: Path | None, jobs: int) -> list[Item]:
    """Setups and recordings of ``rows``, ``jobs`` replays at once. A recording depends
    on the row's config, not on the constants or the timing model, so recordings can be
    cached between runs (by row id); setups are built afresh."""
    cached: dict[str, calib.Recording] = {}
    if cache is not None and cache.exists():
        with cache.open("rb") as f:
            cached = {k: v[1] if isinstance(v, tuple) else v for k, v in pickle.load(f).items()}
    started = time.perf_counter()
    setups = [(row, s) for row, s in calib.iter_setups(rows, max_tokens=calib.MAX_TOKENS)
              if not isinstance(s, str)]
    fresh = [(row, s) for row, s in setups if row.id not in cached]
    with concurrent.futures.ProcessPoolExecutor(jobs) as pool:
        recordings = list(pool.map(_record, [s for _, s in fresh], chunksize=4))
    recorded = {row.id for row, _ in fresh}
    for (row, _), rec in zip(fresh, recordings, strict=True):
        if rec is not None:
            cached[row.id] = rec
    items: list[Item] = []
    for row, s in setups:
        rec = cached.get(row.id)
        if rec is not None and isinstance(s, calib.Setup):
            items.append((s, rec if row.id in recorded else calib.compact(rec)))
    if cache is not None:  # written whole or not at all
        tmp = cache.with_name(cache.name + ".tmp")
        with tmp.open("wb") as f:
            pickle.dump(cached, f)
        os.replace(tmp, cache)
    print(f"{len(items)} recordings ({time.perf_counter() - started:.0f} s)", flush=True)
    return items


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (small dense systems)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        p = m[col][col]
        if abs(p) < 1e-300:
            continue
        for r in range(col + 1, n):
            f = m[r][col] / p
            if f:
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        p = m[r][r]
        acc = m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))
        x[r] = acc / p if abs(p) > 1e-300 else 0.0
    return x


def _log_error(pred: float, meas: float) -> float:
    return math.log(max(pred, 1e-9) / meas)


def _relative_error(pred: float, meas: float) -> float:
    return pred / meas - 1.0


ERRORS = {"log": _log_error, "relative": _relative_error}


def fit(base: AnalyticalConstants, items: list[Item], keys: list[str], ttft_weight: float,
        iterations: int, error: str = "relative", ridge: float = 0.0) -> AnalyticalConstants:
    """Constants fitted on ``items``, starting from ``base``'s values of ``keys``, each
    constant's logarithm pulled back towards its start with weight ``ridge``."""
    parts: dict[tuple[str, str, str], int] = {}
    for s, _ in items:
        parts[(s.row.system, s.row.backend, s.row.model)] = parts.get(
            (s.row.system, s.row.backend, s.row.model), 0) + 1
    row_w = [1.0 / math.sqrt(parts[(s.row.system, s.row.backend, s.row.model)])
             for s, _ in items]
    tw = math.sqrt(ttft_weight)
    err = ERRORS[error]
    bounds = [tuple(math.log(v) for v in BOUNDS[k.split(".")[-1]]) for k in keys]

    def clamp(x: list[float]) -> list[float]:
        return [min(hi, max(lo, v)) for v, (lo, hi) in zip(x, bounds, strict=True)]

    def consts(x: list[float]) -> AnalyticalConstants:
        return base.with_values(**{k: math.exp(v) for k, v in zip(keys, x, strict=True)})

    def residuals(x: list[float]) -> list[float]:
        c = consts(x)
        out: list[float] = []
        for item in items:
            ttft, tpot = predict(c, item)
            r = item[0].row
            out.append(err(tpot, r.tpot_ms))
            out.append(tw * err(ttft, r.ttft_ms))
        out.extend(pull * (v - v0) for v, v0 in zip(x, x0, strict=True))
        return out

    def weights(res: list[float]) -> list[float]:
        # Huber IRLS weights times the row weights; the ridge's residuals weigh 1
        w = []
        for i, r in enumerate(res[:2 * len(items)]):
            h = 1.0 if abs(r) <= HUBER else HUBER / abs(r)
            w.append(h * row_w[i // 2])
        return w + [1.0] * len(keys)

    def loss(res: list[float], w: list[float]) -> float:
        return sum(wi * ri * ri for wi, ri in zip(w, res, strict=True))

    x = x0 = clamp([math.log(max(base.value(k), 1e-9)) for k in keys])
    pull = math.sqrt(ridge)
    res = residuals(x)
    lam = 1e-2
    step = 0.03
    for it in range(iterations):
        w = weights(res)
        cur = loss(res, w)
        started = time.perf_counter()
        jac: list[list[float]] = []  # columns
        for j in range(len(x)):
            xj = x[:]
            _lo, hi = bounds[j]
            h = step if xj[j] + step <= hi else -step
            xj[j] += h
            rj = residuals(xj)
            jac.append([(a - b) / h for a, b in zip(rj, res, strict=True)])
        n = len(x)
        jtj = [[sum(w[i] * jac[a][i] * jac[b][i] for i in range(len(res))) for b in range(n)]
               for a in range(n)]
        jtr = [sum(w[i] * jac[a][i] * res[i] for i in range(len(res))) for a in range(n)]
        # active set: a parameter at a bound that the gradient pushes outwards stays put
        free = [j for j in range(n)
                if not ((x[j] >= bounds[j][1] - 1e-12 and jtr[j] < 0)
                        or (x[j] <= bounds[j][0] + 1e-12 and jtr[j] > 0))]
        gain = 0.0  # the step's loss reduction, at this iteration's weights
        for _ in range(10):
            a = [[jtj[r][k] + (lam * max(jtj[r][r], 1e-9) if r == k else 0.0)
                  for k in free] for r in free]
            sol = _solve(a, [-jtr[r] for r in free])
            delta = [0.0] * n
            for j, d in zip(free, sol, strict=True):
                delta[j] = d
            cand = clamp([v + d for v, d in zip(x, delta, strict=True)])
            cres = residuals(cand)
            if (new := loss(cres, w)) < cur:
                x, res, gain = cand, cres, cur - new
                lam = max(lam / 3, 1e-6)
                break
            lam *= 4
        print(f"iteration {it}: loss {loss(res, weights(res)):.4f} (was {cur:.4f}), "
              f"lambda {lam:.2g}, {time.perf_counter() - started:.0f} s", flush=True)
        if gain <= 1e-6 * cur:  # no step found, or converged
            break
    return consts(x)


def _errors(c: AnalyticalConstants, items: list[Item]) -> tuple[float, float]:
    """TTFT and TPOT MAPE (%) of ``items`` re-priced with ``c``."""
    errs = [(t / i[0].row.ttft_ms - 1, p / i[0].row.tpot_ms - 1)
            for i in items for t, p in [predict(c, i)]]
    return _mape([e[0] for e in errs]), _mape([e[1] for e in errs])


def kernel_class(s: calib.Setup) -> tuple[str, ...]:
    """What a row's price rests on: its backend, GEMM and expert kernels and attention."""
    g = s.geometry
    return (g.backend, g.gemm_kernel, g.moe_kernel if g.experts else "",
            "mla" if g.mla else "")


def cross_validate(base: AnalyticalConstants, items: list[Item], keys: list[str],
                   args: argparse.Namespace) -> None:
    """Leave-one-GPU-out: each GPU's rows scored by constants fitted on the other GPUs'
    (both folds), beside the in-sample figure of a fit on every GPU."""
    gpus = sorted({s.row.system for s, _ in items})
    print("\nleave-one-GPU-out (re-priced TTFT / TPOT MAPE %; the rows left out split by "
          "whether the fitted rows show their kernel class):")
    print(f"{'GPU left out':14} {'rows':>5} {'fit rows':>8} {'in-sample':>17} "
          f"{'left out':>17} {'class fitted':>23} {'class not fitted':>23}")
    scored: list[tuple[float, float, int]] = []
    for gpu in gpus:
        train = [i for i in items if i[0].row.system != gpu]
        test = [i for i in items if i[0].row.system == gpu]
        c = fit(base, train, keys, args.ttft_weight, args.iterations, error=args.error,
                ridge=args.ridge)
        inside, outside = _errors(c, train), _errors(c, test)
        scored.append((*outside, len(test)))
        fitted = {kernel_class(s) for s, _ in train}
        split = ""
        for seen in (True, False):
            part = [i for i in test if (kernel_class(i[0]) in fitted) == seen]
            t, p = _errors(c, part)
            split += f" {len(part):5d} {t:8.1f} {p:8.1f}"
        print(f"{gpu:14} {len(test):5d} {len(train):8d} {inside[0]:8.1f} {inside[1]:8.1f} "
              f"{outside[0]:8.1f} {outside[1]:8.1f}{split}", flush=True)
    n = sum(k for _, _, k in scored)
    print(f"{'every GPU':14} {n:5d} {'':8} {'':17} "
          f"{sum(t * k for t, _, k in scored) / n:8.1f} "
          f"{sum(p * k for _, p, k in scored) / n:8.1f}  (row-weighted)")


def _result_args(argv: list[str]) -> list[str]:
    """The command-line arguments that shape the fitted constants: not where recordings
    are cached, how many processes make them, or whether the JSON is written."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--cache", "--jobs", "--out"):
            skip = True
        elif not arg.startswith(("--cache=", "--jobs=", "--out=", "--dry-run")):
            out.append(arg)
    return out


def main() -> int:
    global HUBER
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="do not rewrite the JSON")
    ap.add_argument("--ttft-weight", type=float, default=1.0,
                    help="weight of the TTFT error beside the TPOT error (1.0 transfers "
                         "better than 0.15: bench/data/README.md)")
    ap.add_argument("--error", choices=sorted(ERRORS), default="relative",
                    help="residual of a row: log(predicted / measured) or predicted / "
                         "measured - 1 (the latter weighs errors like the MAPE report)")
    ap.add_argument("--huber", type=float, default=HUBER,
                    help="residual size beyond which a row counts linearly")
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--ridge", type=float, default=0.03,
                    help="pull of each constant's logarithm back towards its start (START): "
                         "0.03 transfers better than none (bench/data/README.md)")
    ap.add_argument("--fit-rows", type=int, default=700,
                    help="subsample of the fit rows, spread over partitions (0: all)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                    help="rows recorded at once, one process each (default: every core)")
    ap.add_argument("--cache", type=Path, default=None,
                    help="pickle file caching the recordings between runs")
    ap.add_argument("--report", action="store_true",
                    help="only report the shipped constants' accuracy (no fit) on a sample "
                         "of --fit-rows rows of both folds")
    ap.add_argument("--leave-out-gpu", metavar="SYSTEM", default=None,
                    help="fit on the other GPUs' rows only (both folds), for leave-one-GPU-"
                         "out cross-validation; bench/accuracy.py --gpu SYSTEM --constants "
                         "FILE then scores the GPU left out")
    ap.add_argument("--cross-validate", action="store_true",
                    help="leave-one-GPU-out: for each GPU, fit on the others' rows and score "
                         "its rows (re-priced), then print the table; writes nothing")
    ap.add_argument("--out", type=Path, default=OUT,
                    help="where to write the fitted constants (default: the shipped JSON)")
    args = ap.parse_args()
    HUBER = args.huber

    rows = [r for r in calib.load_rows() if r.mode == "agg"]
    if args.leave_out_gpu is not None:
        if args.leave_out_gpu not in {r.system for r in rows}:
            ap.error(f"no rows of GPU {args.leave_out_gpu!r}")
        rows = [r for r in rows if r.system != args.leave_out_gpu]
    shipped = load_constants()
    if args.report:
        report(shipped, load_items(calib.sample(rows, args.fit_rows or None), args.cache,
                                   args.jobs))
        return 0
    base = start(shipped)
    keys = [*GLOBAL, *(f"{b}.{f}" for b in BACKENDS for f in PER_BACKEND)]
    if args.cross_validate:
        items = load_items(calib.sample(rows, args.fit_rows or None), args.cache, args.jobs)
        cross_validate(base, items, keys, args)
        return 0
    # the subsample of --cross-validate's rows (so they share recordings), less the holdout
    fit_rows = [r for r in calib.sample(rows, args.fit_rows or None)
                if args.leave_out_gpu or not calib.holdout(r)]
    items = load_items(fit_rows, args.cache, args.jobs)
    print(f"fitting on {len(items)} rows ({len(rows)} aggregated rows in the file, "
          f"holdout fold excluded)")
    best = fit(base, items, keys, args.ttft_weight, args.iterations, error=args.error,
               ridge=args.ridge)
    report(best, items)
    at_bound = [k for k in keys if any(math.isclose(best.value(k), v, rel_tol=1e-6)
                                       for v in BOUNDS[k.split(".")[-1]])]
    if at_bound:
        print("at a bound: " + ", ".join(f"{k}={best.value(k):g}" for k in at_bound))
    data = best.to_json()
    data["provenance"] = {
        "fitted_by": "bench/fit_timing.py",
        "command": " ".join(["python bench/fit_timing.py", *_result_args(sys.argv[1:])]),
        "rows": f"{len(items)} aggregated rows of bench/data/silicon_dev.csv ("
                + ("every row" if not args.fit_rows else
                   "a subsample spread over the (GPU, backend, model) partitions")
                + " that can be replayed, each measurement once; "
                + (f"{args.leave_out_gpu} left out)" if args.leave_out_gpu
                   else "calib.holdout fold excluded)"),
        "prediction": "each row's config (calib.config) compiled and replayed as servesim "
                      "replay does (calib.replay), re-priced from calib.record",
        "loss": f"Huber ({HUBER}) least squares of the {args.error} TPOT error + "
                f"{args.ttft_weight} x the {args.error} TTFT error, rows weighted "
                f"1/sqrt(partition size), + {args.ridge} x the squared log distance of each "
                "constant from its start (bench/fit_timing.py START)",
        "date": datetime.date.today().isoformat(),
    }
    text = json.dumps(data, indent=2) + "\n"
    if args.dry_run:
        print(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
