"""A deterministic event heap for virtual-time replays.

Entries order by ``(time, phase, key, seq)``: at one instant the phases run in a fixed
order (engine completions before arrivals, so a pass boundary is observed before the
decisions taken at it), ``key`` is a stable id (worker index, request id) and ``seq`` a
per-queue counter that makes ties impossible and the order independent of the payload.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Generic, TypeVar

T = TypeVar("T")

# Phases at one timestamp, in processing order (spec: engine completion, worker ready,
# transfer completion, admission).
PHASE_ENGINE = 0
PHASE_WORKER_READY = 1
PHASE_TRANSFER = 2
PHASE_ARRIVAL = 3


class EventQueue(Generic[T]):
    __slots__ = ("_counter", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, int, int, T]] = []
        self._counter = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, time: float, phase: int, key: int, item: T) -> None:
        heapq.heappush(self._heap, (time, phase, key, next(self._counter), item))

    def peek_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def pop(self) -> tuple[float, int, T]:
        time, phase, _, _, item = heapq.heappop(self._heap)
        return time, phase, item
