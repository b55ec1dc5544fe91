"""SLA targets: their vocabulary and rules, shared by the compiler and the engines.

``[evaluation.sla]`` names each bound for what it checks: ``ttft_ms`` (time to first
token), ``tpot_ms`` (each request's mean gap ``(e2e - ttft) / (n - 1)``), ``itl_ms``
(the gaps between a request's emissions; a speculative burst is one emission) and
``e2e_ms``. A number is a per-request bound (a request is good when every per-request
bound holds; goodput counts good requests); a table holds targets on the run's
distribution (``ttft_ms = { p99 = 1000 }``) and may hold a per-request bound as
``per_request``.

Migration of ``itl_ms``: before these names, ``itl_ms = N`` bounded each request's mean
gap, which is TPOT. A number under ``itl_ms`` is still read that way, with a
``deprecated`` warning asking to rename it to ``tpot_ms``; the payload keeps it in its
first field ``SlaArgs.itl_ms``. To bound every inter-token gap of a request now, write
``itl_ms = { per_request = N }``. In the next release a number under ``itl_ms`` will mean
that, and ``SlaArgs.itl_ms`` will be refused.
"""

from __future__ import annotations

import attrs

from servesim import codes
from servesim.converter import check_limits, closest
from servesim.errors import Diagnostic, Path, format_path
from servesim.payload import SlaArgs, SlaMetric, SlaTarget

METRICS: tuple[SlaMetric, ...] = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
PER_REQUEST = "per_request"
# statistics of the run's distribution a target may bound -> the report's prefix
RUN_STATS: dict[str, str] = {
    "mean": "mean", "median": "median", "p50": "median", "p75": "p75", "p90": "p90",
    "p95": "p95", "p99": "p99", "p99.9": "p99.9", "min": "min", "max": "max",
}
STATS: tuple[str, ...] = (PER_REQUEST, *RUN_STATS)
ROOT: Path = ("evaluation", "sla")


def targets_of(sla: SlaArgs | None) -> tuple[SlaTarget, ...]:
    """Every bound of ``sla``: its first fields read as before (``itl_ms`` bounds the mean
    gap: a per-request ``tpot_ms`` bound), then ``targets``."""
    if sla is None:
        return ()
    first: list[SlaTarget] = []
    for metric, bound in (("ttft_ms", sla.ttft_ms), ("tpot_ms", sla.itl_ms),
                          ("e2e_ms", sla.e2e_ms)):
        if bound is not None:
            first.append(SlaTarget(metric, PER_REQUEST, bound))  # type: ignore[arg-type]
    return (*first, *sla.targets)


def target_path(target: SlaTarget) -> Path:
    """Where ``target`` is written in the config."""
    if target.stat == PER_REQUEST:
        return (*ROOT, target.metric)
    return (*ROOT, target.metric, target.stat)


def check_sla(sla: SlaArgs | None) -> list[Diagnostic]:
    """Errors of an SLA: unknown statistics, bounds out of range, a bound set twice."""
    if sla is None:
        return []
    out: list[Diagnostic] = []
    seen: dict[tuple[str, str], str] = {}
    firsts = len(targets_of(sla)) - len(sla.targets)
    for i, target in enumerate(targets_of(sla)):
        first = i < firsts
        path = (*ROOT, _first_name(target)) if first else target_path(target)
        if target.stat not in STATS:
            guess = closest(target.stat, list(STATS))
            out.append(Diagnostic(
                code=codes.SLA_UNKNOWN_STAT, path=path,
                message=f"unknown target {target.stat!r} (allowed: {', '.join(STATS)})",
                hint=f"did you mean {guess!r}?" if guess else
                "write a statistic of the run, such as { p99 = 1000 }"))
            continue
        out += [attrs.evolve(d, path=path) for d in check_limits(target)]
        key = (target.metric, RUN_STATS.get(target.stat, target.stat))
        spelled = format_path(path[len(ROOT):])
        if first and target.metric == "tpot_ms":
            spelled = "itl_ms (a number: each request's mean gap, as tpot_ms)"
        if key in seen:
            out.append(Diagnostic(code=codes.SLA_DUPLICATE, path=path,
                                  message=f"{seen[key]} and {spelled} bound the same thing",
                                  hint="keep one of them"))
        seen[key] = spelled
    return out


def _first_name(target: SlaTarget) -> str:
    """The first field a target read from it was written in."""
    return "itl_ms" if target.metric == "tpot_ms" else target.metric


def sla_deprecations(sla: SlaArgs | None) -> list[Diagnostic]:
    """Warnings: ``itl_ms = N`` read with its old meaning."""
    if sla is None or sla.itl_ms is None:
        return []
    n = f"{sla.itl_ms:g}"
    return [Diagnostic(
        code=codes.DEPRECATED_KEY, severity="warning", path=(*ROOT, "itl_ms"),
        message=f"itl_ms = {n} bounds each request's mean token gap, which is TPOT; it is "
        "checked that way in this release and will bound every inter-token gap in the next",
        hint=f"rename it to tpot_ms = {n}; to bound every gap between a request's tokens "
        f"now, write itl_ms = {{ per_request = {n} }}")]
