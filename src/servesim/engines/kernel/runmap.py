"""A value per offset ``0 .. size - 1``, held as maximal runs of equal values.

Run ``i`` covers offsets ``starts[i] .. starts[i + 1] - 1`` (the last run ends at
``size``) and holds ``values[i]``; neighbouring runs hold values that differ (``!=``), so
the runs are the maximal stretches of one value. Setting, shifting, counting or listing
the values of a range costs a bisection plus the runs it touches, whatever its length:
the block pool keeps its per-block state in these (see
:mod:`servesim.engines.kernel.blocks`).

Ranges are half-open, ``lo .. hi - 1``; an empty range (``lo >= hi``) changes nothing
and holds nothing. Offsets past ``size`` hold nothing: reads clip to ``size``, writes
(:meth:`RunMap.assign`, :meth:`Counts.shift`) need ``hi <= size``.
"""

from __future__ import annotations

from typing import Generic, TypeVar

V = TypeVar("V")


def _after(starts: list[int], offset: int, hi: int) -> int:
    """How many of ``starts[:hi]`` (increasing) are at most ``offset`` (a bisection, as
    :func:`bisect.bisect_right`; compiled, it compares machine integers)."""
    lo = 0
    while lo < hi:
        mid = (lo + hi) // 2
        if offset < starts[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


class RunMap(Generic[V]):
    """Values over offsets ``0 .. size - 1``, as runs ``starts``/``values``."""

    __slots__ = ("size", "starts", "values")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.values: list[V] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def _find(self, offset: int) -> int:
        """The index of the run holding ``offset`` (``0 <= offset < size``); the last run
        is tried first (a lease grows at the end of its blocks)."""
        starts = self.starts
        last = len(starts) - 1
        if starts[last] <= offset:
            return last
        return _after(starts, offset, last) - 1

    def get(self, offset: int) -> V:
        """The value at ``offset`` (``0 <= offset < size``)."""
        return self.values[self._find(offset)]

    def last(self) -> V:
        """The value at ``size - 1`` (the map is not empty)."""
        return self.values[-1]

    def append(self, count: int, value: V) -> None:
        """Grow the map by ``count`` offsets holding ``value``."""
        if count <= 0:
            return
        if not self.values or self.values[-1] != value:
            self.starts.append(self.size)
            self.values.append(value)
        self.size += count

    def truncate(self, end: int) -> None:
        """Drop offsets ``end ..``."""
        if end >= self.size:
            return
        starts, values = self.starts, self.values
        cut = _after(starts, end - 1, len(starts))  # those starting at ``end`` on go
        while len(starts) > cut:  # (pop: compiled, a native call, where del is generic)
            starts.pop()
            values.pop()
        self.size = end

    def clear(self) -> None:
        self.truncate(0)

    def runs(self, lo: int, hi: int) -> list[tuple[int, int, V]]:
        """The runs meeting ``lo .. hi - 1``, cut to it, as ``(lo, hi, value)``, first to
        last."""
        out: list[tuple[int, int, V]] = []
        size = self.size
        if hi > size:
            hi = size
        if lo < 0:
            lo = 0
        if lo >= hi:
            return out
        starts, values = self.starts, self.values
        n = len(starts)
        i = self._find(lo)
        a = lo
        while a < hi:
            nxt = i + 1
            end = starts[nxt] if nxt < n else size
            if end > hi:
                end = hi
            out.append((a, end, values[i]))
            a = end
            i = nxt
        return out

    def count(self, lo: int, hi: int, value: V) -> int:
        """How many offsets of ``lo .. hi - 1`` hold ``value``."""
        total = 0
        for a, b, v in self.runs(lo, hi):
            if v == value:
                total += b - a
        return total

    def first_not(self, lo: int, hi: int, value: V) -> int:
        """The first offset of ``lo .. hi - 1`` not holding ``value``, or ``hi`` if they
        all do."""
        if lo >= hi or lo >= self.size:
            return hi
        starts, values = self.starts, self.values
        i = self._find(lo)
        if values[i] != value:
            return lo
        for k in range(i + 1, len(starts)):  # the runs above, while they start below hi
            if starts[k] >= hi:
                break
            if values[k] != value:
                return starts[k]
        return hi

    def all(self, lo: int, hi: int, value: V) -> bool:
        """Whether every offset of ``lo .. hi - 1`` holds ``value``."""
        return self.first_not(lo, hi, value) >= hi

    def expand(self) -> list[V]:
        """The value of every offset, in order (for invariant checks; O(size))."""
        out: list[V] = []
        for a, b, v in self.runs(0, self.size):
            out += [v] * (b - a)
        return out

    def assign(self, lo: int, hi: int, value: V) -> None:
        """Offsets ``lo .. hi - 1`` (``hi <= size``) hold ``value``."""
        if lo >= hi:
            return
        starts, values = self.starts, self.values
        n = len(starts)
        i = self._find(lo)
        nxt = i + 1
        end = starts[nxt] if nxt < n else self.size
        if hi > end:  # over several runs
            i = self._boundary(lo)
            j = self._boundary(hi)
            starts[i:j] = [lo]
            values[i:j] = [value]
            self._join(i + 1)
            self._join(i)
            return
        old = values[i]  # inside run i: a boundary moves, or a run or two appear
        if old == value:
            return
        if lo == starts[i]:
            if hi == end:  # the whole run
                values[i] = value
                self._join(nxt)
                self._join(i)
            elif i and values[i - 1] == value:
                starts[i] = hi  # run i - 1 grows over the range
            else:
                starts.insert(nxt, hi)
                values.insert(nxt, old)
                values[i] = value
        elif hi == end:
            if nxt < n and values[nxt] == value:
                starts[nxt] = lo  # run i + 1 grows down over the range
            else:
                starts.insert(nxt, lo)
                values.insert(nxt, value)
        else:  # from the middle of run i
            starts[nxt:nxt] = [lo, hi]
            values[nxt:nxt] = [value, old]

    def _boundary(self, offset: int) -> int:
        """Start a run at ``offset`` (``0 <= offset <= size``; the run holding it is cut
        in two); returns that run's index (``len(starts)`` for ``size``)."""
        starts = self.starts
        i = _after(starts, offset, len(starts))
        if i and starts[i - 1] == offset:
            return i - 1
        if offset >= self.size:
            return len(starts)
        starts.insert(i, offset)
        self.values.insert(i, self.values[i - 1])
        return i

    def _join(self, i: int) -> None:
        """Merge run ``i`` into run ``i - 1`` if they hold the same value."""
        values = self.values
        if 0 < i < len(values) and values[i - 1] == values[i]:
            self.starts.pop(i)
            values.pop(i)

    def is_canonical(self) -> bool:
        """Whether the runs are well formed: starting at 0, increasing, inside ``size``,
        neighbours unequal (for invariant checks)."""
        starts, values = self.starts, self.values
        if len(starts) != len(values) or bool(starts) != (self.size > 0):
            return False
        if starts and (starts[0] != 0 or starts[-1] >= self.size):
            return False
        return all(starts[k] < starts[k + 1] and values[k] != values[k + 1]
                   for k in range(len(starts) - 1))


class Counts(RunMap[int]):
    """A run map of integers that can add to a range (reference counts)."""

    __slots__ = ()

    def shift(self, lo: int, hi: int, delta: int) -> None:
        """Add ``delta`` to the values of ``lo .. hi - 1`` (``hi <= size``)."""
        if lo >= hi or not delta:
            return
        i = self._boundary(lo)
        j = self._boundary(hi)
        values = self.values
        for k in range(i, j):
            values[k] += delta
        self._join(j)  # neighbours inside the range stay unequal
        self._join(i)
