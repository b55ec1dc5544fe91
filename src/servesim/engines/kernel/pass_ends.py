"""A worker's pass end times, with the floor below which the metrics may fold them.

Its own module: a subclass of a built-in type stays interpreted in the compiled build,
while :mod:`~servesim.engines.kernel.requests` is compiled.
"""

from __future__ import annotations

from array import array


class PassEnds(array):
    """A worker's pass end times (``array('d')``), with a *floor*: the engine promises
    that no request in flight or still to come has a token at a pass ending before it
    (the arrival of its oldest request in flight), so the metrics may fold those passes
    and drop them from the front."""

    __slots__ = ("floor",)
    floor: float

    def __new__(cls) -> PassEnds:
        ends: PassEnds = super().__new__(cls, "d")  # type: ignore[assignment]
        ends.floor = float("-inf")
        return ends
