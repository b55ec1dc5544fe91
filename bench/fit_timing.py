"""Refit the analytical timing constants on the calibration rows.

    .venv/bin/python bench/fit_timing.py            # fit and rewrite the shipped JSON
    .venv/bin/python bench/fit_timing.py --dry-run  # fit and print only

Rows: the aggregated rows of bench/data/silicon_dev.csv that the catalog can describe
(disaggregated rows are not used). Prediction per row: the closed-loop steady state of the
analytical timer (``calib.steady_state``), which is O(1) per row, so the search can try
thousands of constant sets; bench/accuracy.py checks the result through the engine.

Split: the holdout fold of ``calib.holdout`` (one configuration in five, by a hash of the
measured configuration) is left out of the fit; MAPE is reported on the fit rows, the
holdout rows and all rows, overall and per backend, and the worst (GPU, backend, model)
partitions are listed.

Loss: mean |log(predicted / measured)| of TPOT plus ``--ttft-weight`` times the same for
TTFT. Search: cyclic coordinate descent in log space over the fitted scalars (global
efficiency scales, all-reduce latency, per-backend overheads), halving the step when no
coordinate improves. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
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
GLOBAL = ("gemm_scale", "moe_scale", "mem_scale", "attn_scale", "kv_scale", "allreduce_us")
PER_BACKEND = ("step_ms", "layer_us", "decode_req_us", "prefill_req_ms", "prefill_layer_us")
BACKENDS = ("vllm", "sglang", "trtllm")
BOUNDS = {
    "gemm_scale": (0.3, 1.25), "moe_scale": (0.1, 1.6), "mem_scale": (0.4, 1.15),
    "attn_scale": (0.2, 1.3), "kv_scale": (0.3, 1.5), "allreduce_us": (2.0, 60.0),
    "step_ms": (0.05, 20.0), "layer_us": (1.0, 200.0), "decode_req_us": (0.1, 200.0),
    "prefill_req_ms": (0.05, 500.0), "prefill_layer_us": (1.0, 5000.0),
}


def _get(c: AnalyticalConstants, key: str) -> float:
    if "." in key:
        name, field = key.split(".", 1)
        return float(getattr(c.backends[name], field))
    return float(getattr(c, key))


def _mape(errors: list[float]) -> float:
    return 100.0 * sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


def report(c: AnalyticalConstants, setups: list[calib.Setup], worst: int = 12) -> None:
    """TTFT / TPOT MAPE of the steady-state prediction on fit, holdout and all rows."""
    errs: dict[tuple[str, ...], list[tuple[float, float]]] = {}
    for s in setups:
        ttft, tpot = calib.steady_state(s, AnalyticalTimer(s.geometry, c))
        e = (ttft / s.row.ttft_ms - 1, tpot / s.row.tpot_ms - 1)
        fold = "holdout" if calib.holdout(s.row) else "fit"
        r = s.row
        for key in ((fold,), ("all",), (fold, r.backend), ("all", r.backend),
                    ("part", r.system, r.backend, r.model)):
            errs.setdefault(key, []).append(e)
    print(f"\n{'rows':40} {'n':>5} {'TTFT MAPE%':>11} {'TPOT MAPE%':>11}")
    for key in sorted((k for k in errs if k[0] != "part"), key=lambda k: (len(k), k)):
        v = errs[key]
        print(f"{' / '.join(key):40} {len(v):5d} {_mape([e[0] for e in v]):11.1f} "
              f"{_mape([e[1] for e in v]):11.1f}")
    parts = sorted((k for k in errs if k[0] == "part"),
                   key=lambda k: -max(_mape([e[0] for e in errs[k]]) / 25,
                                      _mape([e[1] for e in errs[k]]) / 10))
    print("\nworst partitions (all rows):")
    for key in parts[:worst]:
        v = errs[key]
        print(f"{' / '.join(key[1:])[:60]:60} {len(v):5d} {_mape([e[0] for e in v]):11.1f} "
              f"{_mape([e[1] for e in v]):11.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="do not rewrite the JSON")
    ap.add_argument("--ttft-weight", type=float, default=0.2)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--report", action="store_true",
                    help="only report the shipped constants' accuracy (no fit)")
    args = ap.parse_args()

    rows = [r for r in calib.load_rows() if r.mode == "agg"]
    all_setups = [s for _, s in calib.iter_setups(rows, max_tokens=10**15)
                  if not isinstance(s, str)]
    setups = [s for s in all_setups if not calib.holdout(s.row)]
    print(f"fitting on {len(setups)} of {len(all_setups)} simulable aggregated rows "
          f"({len(rows)} in the file); holdout {len(all_setups) - len(setups)}")
    base = load_constants()
    keys = [*GLOBAL, *(f"{b}.{f}" for b in BACKENDS for f in PER_BACKEND)]

    def loss(c: AnalyticalConstants) -> float:
        total = 0.0
        for s in setups:
            ttft, tpot = calib.steady_state(s, AnalyticalTimer(s.geometry, c))
            total += abs(math.log(tpot / s.row.tpot_ms))
            total += args.ttft_weight * abs(math.log(ttft / s.row.ttft_ms))
        return total / len(setups)

    if args.report:
        report(base, all_setups)
        return 0
    best = base
    best_loss = loss(best)
    print(f"start loss {best_loss:.4f}")
    step = 0.4
    for rnd in range(args.rounds):
        improved = False
        for key in keys:
            lo, hi = BOUNDS[key.split(".")[-1]]
            for direction in (1.0, -1.0):
                value = _get(best, key) * math.exp(direction * step)
                value = min(hi, max(lo, value))
                cand = best.with_values(**{key: value})
                cand_loss = loss(cand)
                if cand_loss < best_loss - 1e-6:
                    best, best_loss, improved = cand, cand_loss, True
                    break
        print(f"round {rnd}: step {step:.3f} loss {best_loss:.4f}")
        if not improved:
            step /= 2
            if step < 0.01:
                break

    report(best, all_setups)
    at_bound = [k for k in keys if _get(best, k) in BOUNDS[k.split(".")[-1]]]
    if at_bound:
        print("at a bound: " + ", ".join(f"{k}={_get(best, k):g}" for k in at_bound))
    data = best.to_json()
    data["provenance"] = {
        "fitted_by": "bench/fit_timing.py",
        "rows": "aggregated rows of bench/data/silicon_dev.csv that the catalog can describe, "
                f"minus the calib.holdout fold ({len(setups)} fitted, "
                f"{len(all_setups) - len(setups)} held out, {len(rows)} in the file)",
        "prediction": "closed-loop steady state of the analytical timer (calib.steady_state)",
        "loss": f"mean |log TPOT ratio| + {args.ttft_weight} x mean |log TTFT ratio| = "
                f"{best_loss:.4f}",
        "date": datetime.date.today().isoformat(),
    }
    text = json.dumps(data, indent=2) + "\n"
    if args.dry_run:
        print(text)
    else:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT.relative_to(Path.cwd()) if OUT.is_relative_to(Path.cwd()) else OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
