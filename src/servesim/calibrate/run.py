"""``servesim calibrate``: replay measured points through a config's deployment, fit the
corrections of its timing, and write them as a calibration file.

Each measured point is replayed with the config's deployment (its roles, their timing)
and the point's load in place of the config's traffic: synthetic requests of the
point's mean prompt and output lengths, ``concurrency`` clients in a closed loop or
Poisson arrivals at its request rate, as many requests as the benchmark completed (six
per client when it does not say), bounded by :data:`MAX_OUTPUT_TOKENS` per replay.

The clients of a measured closed loop drift apart after the first wave (their requests
do not finish in the same pass, as they would if every part of the server took exactly
the modelled time); replayed in lockstep, every wave's prompts would queue together. So
the output lengths are spread uniformly over ``mean x (1 +- spread)``, the synthetic
source's ``output_range_ratio`` (``--output-spread``; by default the config's own
``traffic.source.output_range_ratio``, else :data:`OUTPUT_SPREAD`; 0 replays the clients in
lockstep).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from servesim import codes
from servesim.calibrate.fit import (
    FitResult,
    Latencies,
    Predict,
    Progress,
    Target,
    Values,
    fit,
    mape,
)
from servesim.calibrate.measurements import MeasuredPoint, MeasurementFile
from servesim.errors import Diagnostic, ServesimError
from servesim.payload import Payload
from servesim.plugins.manager import EngineRegistry
from servesim.timing.calibration import calibration_document
from servesim.version import __version__
from servesim.workloads.driver import (
    ClosedLoop,
    OpenLoop,
    Session,
    SessionWorkload,
    poisson_arrivals,
)
from servesim.workloads.spec import (
    ConcurrencyLoad,
    RateLoad,
    Stop,
    SyntheticSource,
    WorkloadSpec,
)
from servesim.workloads.synthetic import synthetic_requests

WAVES = 6  # requests per client when the measurement does not record its count
RATE_REQUESTS = 200  # requests of a rate-driven point that does not record its count
MAX_OUTPUT_TOKENS = 2_000_000  # per replay: fewer requests beyond (at least one wave)
SEED = 42
OUTPUT_SPREAD = 0.2
MAX_POINTS = 200


def targets(points: Sequence[MeasuredPoint]) -> list[Target]:
    return [Target(label=p.label, ttft_ms=p.ttft_ms, tpot_ms=p.tpot_ms,
                   input_tokens=p.input_tokens,
                   load=float(p.concurrency) if p.concurrency is not None
                   else -float(p.request_rate or 0.0))
            for p in points]


def replay_workload(p: MeasuredPoint, spread: float) -> SessionWorkload:
    """The workload that replays ``p``'s benchmark (see the module docstring)."""
    spec = measured_workload(p)
    # the spread is the synthetic source's own (traffic.source.output_range_ratio)
    source = SyntheticSource(input_tokens=p.input_tokens, output_tokens=p.output_tokens,
                             output_range_ratio=spread)

    def units() -> Iterator[Session]:
        return iter(synthetic_requests(source))

    plan: ClosedLoop | OpenLoop
    if p.concurrency is not None:
        plan = ClosedLoop(p.concurrency)
    else:
        rate = float(p.request_rate or 1.0)
        plan = OpenLoop(lambda: poisson_arrivals(rate, SEED))
    return SessionWorkload(units, plan, max_requests=spec.stop.requests)


def measured_workload(p: MeasuredPoint) -> WorkloadSpec:
    """The payload workload that replays ``p``'s benchmark."""
    source = SyntheticSource(input_tokens=p.input_tokens, output_tokens=p.output_tokens)
    budget = max(1, MAX_OUTPUT_TOKENS // p.output_tokens)
    load: ConcurrencyLoad | RateLoad
    if p.concurrency is not None:
        n = p.requests or WAVES * p.concurrency
        load = ConcurrencyLoad(concurrency=p.concurrency)
        n = min(n, max(budget, p.concurrency))
    else:
        n = min(p.requests or RATE_REQUESTS, budget)
        load = RateLoad(type="poisson", requests_per_second=p.request_rate, seed=SEED)
    return WorkloadSpec(source, load, Stop(requests=n))


def predictor(payload: Payload, points: Sequence[MeasuredPoint], *,
              registry: EngineRegistry, base_dir: Path | None,
              spread: float = OUTPUT_SPREAD) -> Predict:
    """Replays point ``i`` through ``payload``'s deployment with corrections ``values``."""
    from servesim.replay import replay_payload

    def predict(i: int, values: Values) -> Latencies:
        p = points[i]
        roles = {name: attrs.evolve(role, timing=attrs.evolve(
                     role.timing, calibration=values.get(name)))
                 for name, role in payload.roles.items()}
        trial = attrs.evolve(payload, workload=measured_workload(p), roles=roles)
        try:
            report = replay_payload(trial, registry=registry, base_dir=base_dir,
                                    workload=replay_workload(p, spread)).report
        except ServesimError as exc:
            raise ServesimError([attrs.evolve(d, message=f"replaying {p.label}: {d.message}")
                                 for d in exc.diagnostics]) from None
        ttft, tpot = report.get("mean_ttft_ms"), report.get("mean_tpot_ms")
        return (float(ttft) if ttft is not None else None,  # type: ignore[return-value]
                float(tpot) if tpot is not None else None)

    return predict


def deployment_warnings(payload: Payload, points: Sequence[MeasuredPoint]) -> list[str]:
    """Where a point records a deployment other than the config's (the replay runs the
    config's): one line per distinct difference."""
    role = next(iter(payload.roles.values()))
    ours = {"system": role.hardware, "backend": role.backend, "tp_size": str(role.tensor),
            "attention_dp_size": str(role.attention_data),
            "model_path": role.model.rsplit("/", 1)[-1]}
    seen: dict[tuple[str, str], list[str]] = {}
    for p in points:
        for key, value in p.deployment.items():
            mine = ours.get(key)
            theirs = value.rsplit("/", 1)[-1] if key == "model_path" else value
            if key == "model_path" and mine is not None:
                same = theirs.lower() in mine.lower() or mine.lower() in theirs.lower()
            else:
                same = mine is None or _same(theirs, mine)
            if not same:
                seen.setdefault((key, theirs), []).append(p.label)
    return [f"{labels[0]}" + (f" and {len(labels) - 1} more" if len(labels) > 1 else "")
            + f" record {key} {value!r}, the config {ours[key]!r}: replayed with the config's"
            for (key, value), labels in sorted(seen.items())]


def _same(a: str, b: str) -> bool:
    try:
        return float(a) == float(b)
    except ValueError:
        return a.strip().lower() == b.strip().lower()


def output_spread(payload: Payload, given: float | None = None) -> float:
    """The replays' output-length spread: ``given`` (``--output-spread``), else the config's
    own ``traffic.source.output_range_ratio``, else :data:`OUTPUT_SPREAD`."""
    if given is not None:
        return given
    ratio = getattr(payload.workload.source, "output_range_ratio", None)
    return OUTPUT_SPREAD if ratio is None else float(ratio)


def calibrate(payload: Payload, files: Sequence[MeasurementFile], *,
              registry: EngineRegistry, base_dir: Path | None,
              spread: float | None = None,
              progress: Progress | None = None) -> tuple[FitResult, list[str]]:
    """Fit the corrections of every role of ``payload`` to the points of ``files``
    (``spread``: see :func:`output_spread`)."""
    points = [p for f in files for p in f.points]
    if len(points) > MAX_POINTS:
        raise ServesimError([Diagnostic(
            code=codes.CALIBRATE_POINTS, location=", ".join(os.path.basename(f.path)
                                                        for f in files)[:200],
            message=f"{len(points)} measured points; calibrate on at most {MAX_POINTS} "
                    "(each is replayed about 20 times)",
            hint="give the runs of the config's deployment only")])
    notes = deployment_warnings(payload, points)
    calibrated = [name for name, role in payload.roles.items() if role.timing.calibration]
    if calibrated:
        notes.append(f"the config's calibration of {', '.join(calibrated)} is left out: the "
                     "fit starts from the uncalibrated timing")
    for name, role in payload.roles.items():
        if role.timing.type in ("fixed",):
            raise ServesimError([Diagnostic(
                code=codes.CALIBRATE_TIMING, path=("engine", "workers", name, "timing", "type"),
                message="fixed timing has nothing to calibrate against the measurements",
                hint='use timing.type = "default" (or the provider you mean to predict with)')])
    result = fit(targets(points), list(payload.roles), predictor(
        payload, points, registry=registry, base_dir=base_dir,
        spread=output_spread(payload, spread)),
        progress=progress)
    return result, notes + list(result.warnings)


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def document(payload: Payload, result: FitResult, *, config: str,
             files: Sequence[MeasurementFile], warnings: Sequence[str],
             spread: float) -> dict[str, Any]:
    """The calibration file's JSON object (see :mod:`servesim.timing.calibration`);
    ``spread``: the replays' output spread (:func:`output_spread`)."""
    pts = result.points

    def pair(lat: Latencies | None) -> dict[str, float | None] | None:
        return None if lat is None else {"ttft_ms": lat[0], "tpot_ms": lat[1]}

    def errors(which: str) -> dict[str, float | None]:
        lats = [getattr(p, which) for p in pts]
        return {
            "ttft_mape_percent": mape([(la[0] if la else None, p.target.ttft_ms)
                                       for la, p in zip(lats, pts, strict=True)]),
            "tpot_mape_percent": mape([(la[1] if la else None, p.target.tpot_ms)
                                       for la, p in zip(lats, pts, strict=True)])}

    provenance = {
        "servesim_version": __version__,
        "created_by": "servesim calibrate",
        "config": {"file": os.path.basename(config), "sha256": file_sha256(config)},
        "measurements": [{"file": os.path.basename(f.path), "sha256": f.sha256,
                          "format": f.format, "points": len(f.points)} for f in files],
        "fit": {
            "method": "Levenberg-Marquardt on log(predicted / measured) TTFT and TPOT, "
                      "each prediction a replay; cross-validation leaves one point out "
                      "and chooses the constants fitted",
            "output_spread": spread,
            "replays": result.replays,
            "before": errors("before"),
            "after": errors("after"),
            "cross_validated": errors("cross"),
            "points": [{"label": p.target.label,
                        "measured": {"ttft_ms": p.target.ttft_ms, "tpot_ms": p.target.tpot_ms},
                        "before": pair(p.before), "after": pair(p.after),
                        "cross_validated": pair(p.cross)} for p in pts],
        },
        "warnings": list(warnings),
    }
    roles = {name: (role.timing.type, result.values[name], result.fitted[name])
             for name, role in payload.roles.items()}
    return calibration_document(roles, provenance)

