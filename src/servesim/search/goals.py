"""What a search optimises and what a point must meet.

An objective is a metric of a result row (``goodput_rps_per_gpu``, ``ttft_ms.p99``),
maximised unless it is a latency (``..._ms``) or a cost (``usd_...``), or written
``minimize NAME`` / ``maximize NAME``. A constraint is ``METRIC <= BOUND`` (or ``<``,
``>=``, ``>``): ``ttft_ms.p99 <= 1000``. A load search finds, for each deployment, the
largest value of a load key (``traffic.load.requests_per_second``) whose replay meets the
constraints, by bisection.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs

from servesim.sweep.metrics import column_name, finite

Direction = Literal["maximize", "minimize"]
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|<|>)\s*([-+0-9.eE]+|inf)\s*$")


@attrs.frozen
class Objective:
    metric: str  # as the user wrote it
    direction: Direction

    @property
    def column(self) -> str:
        return column_name(self.metric)

    def value(self, row: Mapping[str, Any]) -> float | None:
        return finite(row.get(self.column))


def parse_objective(text: str) -> Objective:
    word, _, rest = text.strip().partition(" ")
    if word in ("maximize", "minimize") and rest.strip():
        return Objective(rest.strip(), word)  # type: ignore[arg-type]
    metric = text.strip()
    name = column_name(metric)
    lower = name.endswith("_ms") or name.startswith("usd_")
    return Objective(metric, "minimize" if lower else "maximize")


@attrs.frozen
class Constraint:
    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.bound:g}"

    def violation(self, row: Mapping[str, Any]) -> float:
        """How far the row is from meeting it: <= 0 met, > 0 not (a missing metric: inf)."""
        value = finite(row.get(column_name(self.metric)))
        if value is None:
            return math.inf
        gap = value - self.bound if self.op in ("<=", "<") else self.bound - value
        return gap if self.op in ("<=", ">=") or gap != 0 else 1e-12


def parse_constraint(text: str) -> Constraint | None:
    """The constraint ``text`` states, or None when it is not one."""
    m = _CONSTRAINT.match(text)
    if not m:
        return None
    try:
        bound = float(m.group(3))
    except ValueError:
        return None
    return Constraint(m.group(1), m.group(2), bound) if math.isfinite(bound) else None


def meets(row: Mapping[str, Any], constraints: tuple[Constraint, ...]) -> bool:
    return row.get("status") == "ok" and all(c.violation(row) <= 0 for c in constraints)


@attrs.frozen
class LoadSearch:
    """Bisection of one load key between ``low`` and ``high``, to a relative tolerance."""

    key: tuple[str, ...]
    low: float
    high: float
    tolerance: float = 0.05
    integer: bool = False

    def best(self, replay_at: Callable[[float], dict[str, Any]],
             constraints: tuple[Constraint, ...]) -> dict[str, Any]:
        """The row at the largest load meeting ``constraints`` (``max_load`` set), else the
        row at ``low`` (``max_load`` None)."""
        top = replay_at(self.high)
        if top.get("status") != "ok" or meets(top, constraints):
            return {**top, "max_load": self.high if meets(top, constraints) else None}
        low_row = replay_at(self.low)
        if not meets(low_row, constraints):
            return {**low_row, "max_load": None}
        good, good_row, bad = self.low, low_row, self.high
        while bad / good > 1 + self.tolerance:
            mid = math.sqrt(good * bad)
            if self.integer:
                mid = float(round(mid))
                if mid in (good, bad):
                    break
            row = replay_at(mid)
            if meets(row, constraints):
                good, good_row = mid, row
            else:
                bad = mid
        return {**good_row, "max_load": good}
