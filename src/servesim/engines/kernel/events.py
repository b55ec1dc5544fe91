"""A deterministic event heap for virtual-time replays.

Entries order by ``(time, phase, key, seq)``: at one instant the phases run in a fixed
order (engine completions before arrivals, so a pass boundary is observed before the
decisions taken at it), ``key`` is a stable id (worker index, request id) and ``seq`` a
per-queue counter that makes ties impossible and the order independent of the payload.
:meth:`EventQueue.push` returns a handle that :meth:`EventQueue.cancel` takes: a cancelled
entry stays in the heap and is skipped when it reaches the top.
"""

from __future__ import annotations

import itertools
from heapq import heappop, heappush
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Phases at one timestamp, in processing order (spec: engine completion, worker ready,
# transfer completion, admission).
PHASE_ENGINE = 0
PHASE_WORKER_READY = 1
PHASE_TRANSFER = 2
PHASE_ARRIVAL = 3


# The item slot of a cancelled entry.
_CANCELLED: Any = object()
_ITEM = 4  # index of the item in an entry


class EventQueue(Generic[T]):
    __slots__ = ("_counter", "_heap")

    def __init__(self) -> None:
        # entries are [time, phase, key, seq, item]; lists, so that cancel can blank them
        self._heap: list[list[Any]] = []
        self._counter = itertools.count()

    def __len__(self) -> int:
        """Entries in the heap, cancelled ones included until they are skipped."""
        return len(self._heap)

    def push(self, time: float, phase: int, key: int, item: T) -> list[Any]:
        entry = [time, phase, key, next(self._counter), item]
        heappush(self._heap, entry)
        return entry

    @staticmethod
    def cancel(entry: list[Any]) -> None:
        """Drop the event pushed as ``entry`` (it must not have been popped yet)."""
        entry[_ITEM] = _CANCELLED

    def peek_time(self) -> float | None:
        heap = self._heap
        while heap and heap[0][_ITEM] is _CANCELLED:
            heappop(heap)
        return heap[0][0] if heap else None

    def pop(self) -> tuple[float, int, T]:
        """``(time, phase, item)`` of the first event."""
        time, phase, _, item = self.pop_keyed()
        return time, phase, item

    def pop_keyed(self) -> tuple[float, int, int, T]:
        """``(time, phase, key, item)`` of the first event."""
        heap = self._heap
        while heap[0][_ITEM] is _CANCELLED:
            heappop(heap)
        time, phase, key, _, item = heappop(heap)
        return time, phase, key, item
