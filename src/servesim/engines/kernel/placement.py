"""Placement of new requests over the targets that serve them (workers, or a worker's ranks).

:class:`Placement` is round-robin, or least-loaded when it is given the load of a target:
the rules the built-in engines place arrivals with (``attention_dp_placement``), for an
engine of a plugin to reuse.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Placement(Generic[T]):
    """Picks the target of each new request among ``targets``, in one of two ways:

    * round-robin (``load`` is None): the targets in turn, starting with the first;
    * least-loaded: the target with the smallest ``load(target)``, the first of them on a
      tie (the load is read at every pick, so it counts what the target holds now).
    """

    def __init__(self, targets: Sequence[T], load: Callable[[T], int] | None = None) -> None:
        if not targets:
            raise ValueError("a placement needs at least one target")
        self.targets = list(targets)
        self.load = load
        self._next = 0

    def pick(self) -> T:
        """The target of the next request."""
        if self.load is not None:
            return min(self.targets, key=self.load)  # min keeps the first of equal loads
        target = self.targets[self._next]
        self._next = (self._next + 1) % len(self.targets)
        return target
