"""Fit a role's timing corrections to measured points, with cross-validated errors.

The corrections (:class:`servesim.payload.CalibrationArgs`, per worker role) are fitted
by replaying: ``predict(i, values)`` replays measured point ``i`` with the corrections
``values`` and returns its mean TTFT and TPOT. The fit minimises the squared log ratios
of predicted to measured TTFT and TPOT over every point (a relative error, so a point of
long latencies does not outweigh the others) by Levenberg-Marquardt, each Jacobian by
forward differences, i.e. one replay per point and constant: scales are fitted as their
logarithm, fixed times in units of the measured latencies they add to, so one step size
fits all. A pull towards the neutral values (no correction; :data:`PRIOR`) keeps the
problem well posed where the data say little.

What is fitted: per role, the scale of prompt work and of decode steps and the front
end's per-request time; the front end's time per prompt token only when the points span
prompt lengths (the longest at least 1.5 x the shortest), and a fixed time per decode
pass only from :data:`STEP_MS_POINTS` points over three loads or more (with fewer, it
trades off against the decode scale: four loads of one deployment fit it to a large scale
and a negative time that predict other deployments worse). A constant whose Jacobian
column the others (fitted before it) explain to within :data:`UNDETERMINED` of its length
is not fitted (kept neutral) and named in a warning: the data cannot tell it apart.

Which of the determined constants are fitted is chosen by cross-validation: the nested
sets (none, the first, the first two, ...) are each fitted, and the set that predicts
every point best from the others (leave one out, each extra constant charged
:data:`PARSIMONY`) is kept. A constant that only lets the fit follow the measured points
(points from runs that disagree, or errors no shared correction explains) is then left
neutral, with a warning, rather than carried to the configurations that were not
measured.

Cross-validation: each point is predicted by a fit to the other points (leave one out),
that fit being one Gauss-Newton step from the full fit with the full fit's Jacobian; the
left-out point's prediction is a replay.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import attrs

from servesim.payload import CalibrationArgs

# The fields each role can fit, in the order they are tried (the first ones are fitted
# whenever the data carries them, the last ones only when it spans enough).
ROLE_FIELDS: Mapping[str, tuple[str, ...]] = {
    "aggregated": ("prefill_scale", "decode_scale", "front_end_ms",
                   "front_end_ms_per_1k_tokens", "decode_step_ms"),
    "prefill": ("prefill_scale", "front_end_ms", "front_end_ms_per_1k_tokens"),
    "decode": ("decode_scale", "decode_step_ms"),
}
# finite-difference steps in the fitted units: 10% of a scale, a quarter of the least
# measured latency for a fixed time (a replay's latencies respond to a fixed time in steps,
# as requests cross pass boundaries: a larger step averages over them)
STEP = 0.1
OFFSET_STEP = 0.25
# Weights of the pull towards the neutral values: Gaussian priors of +-25% on each scale
# and of half the least measured latency on each fixed time, against a 5% noise of the
# measured means: (0.05 / 0.25) ** 2 and (0.05 / 0.5) ** 2.
PRIOR = 0.04
PRIOR_OFFSET = 0.01
# A fixed time per decode pass trades off against the decode scale over one
# deployment's loads; it is fitted from this many points spanning three loads or more.
STEP_MS_POINTS = 6
UNDETERMINED = 0.05
# Each knob a set fits raises its leave-one-out score by this fraction: a larger set is
# kept only when it predicts the left-out points better by more than that.
PARSIMONY = 0.05
MAX_ITERATIONS = 6
SCALE_BOUNDS = (math.log(0.05), math.log(20.0))
# in units of the least measured TTFT (per 1k prompt tokens for the per-token time; TPOT
# for decode steps): a fixed time that alone would exceed a measured latency is not a fit
OFFSET_BOUNDS = (-1.0, 1.0)

Values = dict[str, CalibrationArgs]
Latencies = tuple[float, float | None]
Predict = Callable[[int, Values], Latencies]
Progress = Callable[[str, int, int], None]


@attrs.frozen
class Target:
    """A measured point as the fit sees it."""

    label: str
    ttft_ms: float
    tpot_ms: float | None
    input_tokens: int
    load: float  # concurrency or request rate: only told apart from the others' loads


@attrs.frozen
class Knob:
    role: str
    field: str
    unit: float  # the fitted value is ``u * unit`` (scales: ``exp(u)``)

    @property
    def name(self) -> str:
        return f"{self.role}.{self.field}"

    @property
    def is_scale(self) -> bool:
        return self.field.endswith("_scale")

    def value(self, u: float) -> float:
        return math.exp(u) if self.is_scale else u * self.unit

    def bounds(self) -> tuple[float, float]:
        return SCALE_BOUNDS if self.is_scale else OFFSET_BOUNDS

    @property
    def step(self) -> float:
        return STEP if self.is_scale else OFFSET_STEP

    @property
    def prior(self) -> float:
        return PRIOR if self.is_scale else PRIOR_OFFSET


@attrs.frozen
class PointFit:
    target: Target
    before: Latencies
    after: Latencies
    cross: Latencies | None  # predicted by a fit without this point


@attrs.frozen
class FitResult:
    values: Values
    fitted: dict[str, list[str]]  # per role, the fields fitted
    points: tuple[PointFit, ...]
    warnings: tuple[str, ...]
    replays: int


def error(predicted: float | None, measured: float | None) -> float | None:
    """Relative error, predicted over measured minus one."""
    if predicted is None or measured is None:
        return None
    return predicted / measured - 1.0


def mape(pairs: Sequence[tuple[float | None, float | None]]) -> float | None:
    """Mean absolute relative error (%) over the pairs that have both values."""
    errs = [abs(e) for p, m in pairs if (e := error(p, m)) is not None]
    return 100.0 * statistics.fmean(errs) if errs else None


def knobs_for(roles: Sequence[str], targets: Sequence[Target]) -> tuple[list[Knob], list[str]]:
    """The constants the data can carry, and notes on the ones it cannot."""
    notes = []
    # a fixed time cannot exceed the latency it is part of at any point: each is fitted in
    # units of the least such latency measured, within one unit either way
    min_ttft = min(t.ttft_ms for t in targets)
    per_1k = min(t.ttft_ms * 1000.0 / t.input_tokens for t in targets)
    tpots = [t.tpot_ms for t in targets if t.tpot_ms is not None]
    isls = [t.input_tokens for t in targets]
    loads = sorted({t.load for t in targets})
    spans_isl = max(isls) >= 1.5 * min(isls)
    out = []
    for role in roles:
        for field in ROLE_FIELDS[role]:
            if field == "decode_scale" and not tpots:
                notes.append(f"{role}.decode_scale is not fitted: no point has more than one "
                             "output token, so none measures a decode step")
                continue
            if field == "front_end_ms_per_1k_tokens" and not spans_isl:
                continue
            if field == "decode_step_ms" and (len(loads) < 3 or len(tpots) < STEP_MS_POINTS):
                continue
            unit = {"front_end_ms": min_ttft, "front_end_ms_per_1k_tokens": per_1k,
                    "decode_step_ms": min(tpots) if tpots else 1.0}.get(field, 1.0)
            out.append(Knob(role, field, unit))
    if len(loads) == 1:
        notes.append("every point was measured at one load: the fit cannot "
                     "tell work that grows with the batch from fixed costs, so predictions "
                     "at other loads are extrapolations; measure at three loads or more")
    elif len(loads) < 3 or len(tpots) < STEP_MS_POINTS:
        notes.append(f"{len(tpots)} points over {len(loads)} loads: a fixed time per decode "
                     f"pass is not fitted ({STEP_MS_POINTS} points over three loads or more "
                     "fit it)")
    if not spans_isl:
        notes.append(f"every point has about one prompt length ({min(isls)}-{max(isls)} "
                     "tokens): the front end's time per prompt token is not fitted")
    return out, notes


def values_of(knobs: Sequence[Knob], u: Sequence[float], roles: Sequence[str]) -> Values:
    fields: dict[str, dict[str, float]] = {r: {} for r in roles}
    for k, x in zip(knobs, u, strict=True):
        fields[k.role][k.field] = k.value(x)
    return {r: CalibrationArgs(**f) for r, f in fields.items()}  # type: ignore[arg-type]


class _Problem:
    """Residuals of the fit with a cache of replays (a point at the same values is not
    replayed twice)."""

    def __init__(self, targets: Sequence[Target], roles: Sequence[str], knobs: list[Knob],
                 predict: Predict, progress: Progress | None) -> None:
        self.targets, self.roles, self.predict = list(targets), list(roles), predict
        self.knobs, self.progress = knobs, progress
        self.cache: dict[tuple[int, tuple[tuple[str, float], ...]], Latencies] = {}

    def latencies(self, i: int, u: Sequence[float]) -> Latencies:
        # keyed by the non-neutral values, so fits over different sets of knobs share it
        key = (i, tuple((k.name, round(x, 12)) for k, x in zip(self.knobs, u, strict=True)
                        if round(x, 12) != 0.0))
        got = self.cache.get(key)
        if got is None:
            got = self.predict(i, values_of(self.knobs, u, self.roles))
            self.cache[key] = got
        return got

    def residuals(self, i: int, u: Sequence[float]) -> list[float]:
        t = self.targets[i]
        ttft, tpot = self.latencies(i, u)
        out = [_log_ratio(ttft, t.ttft_ms)]
        if t.tpot_ms is not None:
            out.append(_log_ratio(tpot, t.tpot_ms))
        return out

    def all_residuals(self, u: Sequence[float], phase: str,
                      points: Sequence[int] | None = None) -> list[list[float]]:
        which = range(len(self.targets)) if points is None else points
        out = []
        for n, i in enumerate(which):
            out.append(self.residuals(i, u))
            self.tick(phase, n + 1, len(which))
        return out

    def jacobian(self, u: list[float], base: list[list[float]]) -> list[list[list[float]]]:
        """Per point, per residual, per knob: the derivative (forward differences)."""
        jac = [[[0.0] * len(u) for _ in rows] for rows in base]
        total = len(u) * len(self.targets)
        for j in range(len(u)):
            v = list(u)
            hi, step = self.knobs[j].bounds()[1], self.knobs[j].step
            h = step if v[j] + step <= hi else -step
            v[j] += h
            for i in range(len(self.targets)):
                for r, (a, b) in enumerate(zip(self.residuals(i, v), base[i], strict=True)):
                    jac[i][r][j] = (a - b) / h
                self.tick("sensitivities", j * len(self.targets) + i + 1, total)
        return jac

    def tick(self, phase: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(phase, done, total)


def _log_ratio(predicted: float | None, measured: float) -> float:
    if predicted is None or not predicted > 0 or not math.isfinite(predicted):
        return math.log(1e-3)  # nothing predicted: as far off as a thousandth
    return math.log(predicted / measured)


def fit(targets: Sequence[Target], roles: Sequence[str], predict: Predict, *,
        progress: Progress | None = None) -> FitResult:
    """Fit the corrections of ``roles`` to ``targets`` by replaying them with ``predict``.

    The knobs the data determine are fitted as nested sets (none, the first, the first
    two, ...), and the set whose leave-one-out error is least is kept
    (:func:`_fit_knobs` scores each): a constant that lets the fit follow the measured points
    without predicting the left-out ones better is not fitted."""
    knobs, warnings = knobs_for(roles, targets)
    prob = _Problem(targets, roles, knobs, predict, progress)
    zero = [0.0] * len(knobs)
    base = prob.all_residuals(zero, "as configured")
    before = [prob.latencies(i, zero) for i in range(len(targets))]
    jac = prob.jacobian(zero, base)
    keep, notes = _determined(knobs, jac)
    warnings += notes
    kept = [j for j, k in enumerate(keep) if k]
    fits = [_fit_knobs(prob, [knobs[j] for j in kept[:n]], base,
                       [[[row[j] for j in kept[:n]] for row in rows] for rows in jac])
            for n in _sizes(len(kept), len(targets))]
    chosen = min(fits, key=lambda f: f.score)
    if len(fits) > 1 and chosen is not fits[-1]:
        warnings.append(_dropped_note(fits[-1], chosen))
    if len(targets) < 3:
        warnings.append(f"{len(targets)} measured point(s): too few for a cross-validated "
                        "error to mean much; measure three loads or more")
    prob.knobs = chosen.knobs
    values = values_of(chosen.knobs, chosen.u, roles)
    after = [prob.latencies(i, chosen.u) for i in range(len(targets))]
    fitted = {r: [k.field for k in chosen.knobs if k.role == r] for r in roles}
    points = tuple(PointFit(t, b, a, c)
                   for t, b, a, c in zip(targets, before, after, chosen.cross, strict=True))
    return FitResult(values=values, fitted=fitted, points=points, warnings=tuple(warnings),
                     replays=len(prob.cache))


@attrs.frozen
class _KnobFit:
    knobs: list[Knob]
    u: list[float]
    cross: list[Latencies | None]
    score: float  # squared log errors of the left-out predictions (inf: not scored)


def _sizes(kept: int, points: int) -> list[int]:
    """How many of the kept knobs each candidate fits: every nested set when there are
    points enough to leave one out, else all of them."""
    return list(range(kept + 1)) if points >= 3 and kept else [kept]


def _fit_knobs(prob: _Problem, knobs: list[Knob], base: list[list[float]],
               jac: list[list[list[float]]]) -> _KnobFit:
    prob.knobs = knobs
    u, res, jac = _levenberg_marquardt(prob, [0.0] * len(knobs), base, jac)
    cross = _leave_one_out(prob, u, res, jac)
    score = 0.0
    for t, c in zip(prob.targets, cross, strict=True):
        if c is None:
            score = math.inf
            break
        score += _log_ratio(c[0], t.ttft_ms) ** 2
        if t.tpot_ms is not None:
            score += _log_ratio(c[1], t.tpot_ms) ** 2
    # a larger set must predict the left-out points better by more than chance
    return _KnobFit(knobs, u, cross, score * (1.0 + PARSIMONY * len(knobs)))


def _dropped_note(full: _KnobFit, chosen: _KnobFit) -> str:
    dropped = [k.name for k in full.knobs if k not in chosen.knobs]
    return (f"not fitted: {', '.join(dropped)}: with them the fit predicts each measured "
            "point from the others worse (leave-one-out), so they keep their neutral "
            "values")


def _determined(knobs: Sequence[Knob],
                jac: Sequence[Sequence[Sequence[float]]]) -> tuple[list[bool], list[str]]:
    """Which knobs the data determine: Gram-Schmidt over the Jacobian's columns in knob
    order; a column the earlier kept ones explain to within :data:`UNDETERMINED` of its
    length is not kept."""
    cols = [[row[j] for rows in jac for row in rows] for j in range(len(knobs))]
    basis: list[list[float]] = []
    keep, notes = [], []
    for k, col in zip(knobs, cols, strict=True):
        norm = math.sqrt(sum(x * x for x in col))
        rest = list(col)
        for b in basis:
            dot = sum(x * y for x, y in zip(rest, b, strict=True))
            rest = [x - dot * y for x, y in zip(rest, b, strict=True)]
        left = math.sqrt(sum(x * x for x in rest))
        if norm < 1e-6 or left < UNDETERMINED * norm:
            keep.append(False)
            why = ("no measured latency depends on it" if norm < 1e-6 else
                   "the constants fitted before it explain its effect on every point")
            notes.append(f"the data cannot determine {k.name} ({why}); it keeps its neutral "
                         "value")
            continue
        keep.append(True)
        basis.append([x / left for x in rest])
    return keep, notes


def _flat(rows: Sequence[Sequence[float]]) -> list[float]:
    return [x for r in rows for x in r]


def _cost(rows: Sequence[Sequence[float]], u: Sequence[float],
          priors: Sequence[float]) -> float:
    return sum(x * x for x in _flat(rows)) + sum(
        w * x * x for w, x in zip(priors, u, strict=True))


def _step(jac: Sequence[Sequence[Sequence[float]]], res: Sequence[Sequence[float]],
          u: Sequence[float], damping: float, points: Sequence[int],
          priors: Sequence[float]) -> list[float]:
    """The Levenberg-Marquardt step over ``points``: ``(JᵀJ + prior + damping·diag) δ =
    -(Jᵀr + prior·u)``."""
    k = len(u)
    a = [[0.0] * k for _ in range(k)]
    g = [w * x for w, x in zip(priors, u, strict=True)]
    for i in points:
        for row, r in zip(jac[i], res[i], strict=True):
            for p in range(k):
                g[p] += row[p] * r
                for q in range(k):
                    a[p][q] += row[p] * row[q]
    for p in range(k):
        a[p][p] += priors[p] + damping * a[p][p]
    return solve(a, [-x for x in g])


def solve(a: list[list[float]], b: list[float]) -> list[float]:
    """``a x = b`` by Gaussian elimination with partial pivoting (a small, positive
    definite system)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(m[r][c]))
        m[c], m[p] = m[p], m[c]
        if abs(m[c][c]) < 1e-300:
            continue
        for r in range(c + 1, n):
            f = m[r][c] / m[c][c]
            for q in range(c, n + 1):
                m[r][q] -= f * m[c][q]
    x = [0.0] * n
    for c in reversed(range(n)):
        if abs(m[c][c]) < 1e-300:
            continue
        x[c] = (m[c][n] - sum(m[c][q] * x[q] for q in range(c + 1, n))) / m[c][c]
    return x


def _clamp(knobs: Sequence[Knob], u: Sequence[float]) -> list[float]:
    return [min(max(x, k.bounds()[0]), k.bounds()[1]) for k, x in zip(knobs, u, strict=True)]


def _levenberg_marquardt(prob: _Problem, u: list[float], base: list[list[float]],
                         jac: list[list[list[float]]]) -> tuple[
                             list[float], list[list[float]], list[list[list[float]]]]:
    if not u:
        return u, base, jac
    everyone = range(len(prob.targets))
    priors = [k.prior for k in prob.knobs]
    damping = 1e-3
    cost = _cost(base, u, priors)
    for iteration in range(MAX_ITERATIONS):
        improved = False
        for _ in range(4):
            trial = _clamp(prob.knobs, [x + d for x, d in zip(
                u, _step(jac, base, u, damping, everyone, priors), strict=True)])
            if max(abs(x - y) for x, y in zip(trial, u, strict=True)) < 1e-3:
                break
            res = prob.all_residuals(trial, f"fitting, step {iteration + 1}")
            new = _cost(res, trial, priors)
            if new < cost:
                moved = max(abs(x - y) for x, y in zip(trial, u, strict=True))
                u, base, improved = trial, res, cost - new > 1e-5 and moved > 0.01
                cost = new
                damping = max(damping / 3.0, 1e-6)
                break
            damping *= 4.0
        if not improved:
            break
        jac = prob.jacobian(u, base)
    return u, base, jac


def _leave_one_out(prob: _Problem, u: list[float], base: list[list[float]],
                   jac: list[list[list[float]]]) -> list[Latencies | None]:
    n = len(prob.targets)
    if n < 2:
        return [None] * n
    if not u:
        return [prob.latencies(i, u) for i in range(n)]
    out: list[Latencies | None] = []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        step = _step(jac, base, u, 0.0, others, [k.prior for k in prob.knobs])
        v = _clamp(prob.knobs, [x + d for x, d in zip(u, step, strict=True)])
        out.append(prob.latencies(i, v))
        prob.tick("cross-validating", i + 1, n)
    return out
