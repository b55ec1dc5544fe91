"""A link whose bandwidth the transfers on it share by processor sharing.

A :class:`SharedLink` of ``bandwidth`` decimal GB/s (bytes / bandwidth is nanoseconds)
moves its ``n`` active transfers at ``bandwidth / n`` each, the share recomputed whenever
a transfer starts or ends. A lone transfer of ``b`` bytes takes ``b / bandwidth``; two
that overlap finish later than either would alone, and the link never moves more than
``bandwidth`` in total.

Bookkeeping is by *level*: the bytes each active transfer has been sent since the link was
last idle, which grows at ``bandwidth / n``. A transfer of ``b`` bytes starting at level
``L`` is done when the level reaches its *tag* ``L + b``: its remaining bytes are
``tag - level`` at any instant, transfers finish in tag order, and only their times move
when ``n`` changes (``now + (tag - level) * n / bandwidth``). The level snaps to a
finishing transfer's tag, so every transfer is sent exactly its bytes and equal tags finish
at one instant, and it restarts at zero when the link empties, so a lone transfer takes
exactly ``b / bandwidth``. A start or an end costs O(active transfers).

Each active transfer has one completion event in the replay's heap (phase
:data:`~servesim.engines.kernel.events.PHASE_TRANSFER`, its ``key``), cancelled and pushed
again when its time changes; the event's item is the :class:`Transfer`, which the replay's
dispatch hands back to :meth:`SharedLink.finish`. A zero-byte transfer finishes inline at
its start and never takes a share. A fixed delay (a time to first byte) is not the link's:
the caller starts the transfer after it, so it occupies no bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servesim.engines.kernel.events import PHASE_TRANSFER, EventQueue


@dataclass(slots=True, eq=False)
class Transfer:
    """One transfer on a link; the item of its completion event."""

    link: SharedLink
    key: int  # orders completions at one instant (a request id)
    nbytes: int
    on_done: Callable[[Transfer], None]
    start_ms: float
    tag: float = 0.0  # the link level at which it is done
    entry: list[Any] | None = None  # its completion event in the heap
    end_ms: float | None = None
    shared: bool = False  # another transfer was active at some point of its life

    @property
    def uncontended_ms(self) -> float:
        """How long it would take alone on the link."""
        return self.link.alone_ms(self.nbytes)

    @property
    def duration_ms(self) -> float:
        """How long it took: exactly :attr:`uncontended_ms` if it was never shared (the
        end time carries the clock's rounding), else from its start to its end."""
        assert self.end_ms is not None, "the transfer has not ended"
        return self.end_ms - self.start_ms if self.shared else self.uncontended_ms


class SharedLink:
    """A processor-sharing link (see the module docstring)."""

    __slots__ = ("active", "bandwidth", "events", "level", "peak", "sent", "since",
                 "started")

    def __init__(self, events: EventQueue[Any], bandwidth_gb_per_second: float) -> None:
        if not bandwidth_gb_per_second > 0:
            raise ValueError(f"a link needs a positive bandwidth, got {bandwidth_gb_per_second}")
        self.events = events
        self.bandwidth = bandwidth_gb_per_second
        self.active: list[Transfer] = []
        self.level = 0.0  # bytes sent to each active transfer since the link was idle
        self.since = 0.0  # when ``level`` was last brought up to date
        self.started = 0  # bytes of every transfer started
        self.sent = 0  # bytes of every transfer finished
        self.peak = 0  # most transfers active at once

    def alone_ms(self, nbytes: float) -> float:
        """Milliseconds ``nbytes`` take with the whole bandwidth (the order of operations
        keeps round inputs exact: 128e6 B at 1 GB/s is 128.0 ms)."""
        return nbytes / self.bandwidth / 1e6

    def start(self, now: float, key: int, nbytes: int,
              on_done: Callable[[Transfer], None]) -> Transfer:
        """Start sending ``nbytes`` at ``now``; ``on_done(transfer)`` runs when the last
        byte arrives (inline, for zero bytes)."""
        transfer = Transfer(self, key, nbytes, on_done, now)
        self.started += nbytes
        if nbytes <= 0:
            transfer.end_ms = now
            on_done(transfer)
            return transfer
        self._advance(now)
        transfer.tag = self.level + nbytes
        self.active.append(transfer)
        self.peak = max(self.peak, len(self.active))
        self._schedule(now)
        return transfer

    def finish(self, transfer: Transfer, now: float) -> None:
        """The completion event of ``transfer`` fired at ``now``."""
        self._advance(now)
        self.level = max(self.level, transfer.tag)
        self.active.remove(transfer)
        transfer.entry = None
        transfer.end_ms = now
        self.sent += transfer.nbytes
        if self.active:
            self._schedule(now)
        else:
            self.level = 0.0
        transfer.on_done(transfer)

    # -- progress (reads only) -------------------------------------------------------------

    def level_at(self, now: float) -> float:
        """The level at ``now`` (no later than the next completion)."""
        active = self.active
        if not active or now <= self.since:
            return self.level
        grown = self.level + (now - self.since) * self.bandwidth * 1e6 / len(active)
        return min(grown, min(t.tag for t in active))

    def remaining(self, transfer: Transfer, now: float) -> float:
        """Bytes ``transfer`` still has to receive at ``now`` (between 0 and all of them,
        whatever the rounding)."""
        if transfer.end_ms is not None:
            return 0.0
        return min(max(transfer.tag - self.level_at(now), 0.0), transfer.nbytes)

    def moved(self, now: float) -> float:
        """Bytes the link has moved by ``now``: the finished transfers' and the part of
        the active ones already sent."""
        level = self.level_at(now)
        return self.sent + sum(t.nbytes - min(max(t.tag - level, 0.0), t.nbytes)
                               for t in self.active)

    # -- internals -------------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        self.level = self.level_at(now)
        self.since = now

    def _schedule(self, now: float) -> None:
        """(Re)schedule every active transfer's completion at the current share."""
        n = len(self.active)
        level, bandwidth, events = self.level, self.bandwidth, self.events
        for t in self.active:
            if n > 1:
                t.shared = True
            at = now + max(t.tag - level, 0.0) * n / bandwidth / 1e6
            entry = t.entry
            if entry is not None:
                if entry[0] == at:
                    continue
                events.cancel(entry)
            t.entry = events.push(at, PHASE_TRANSFER, t.key, t)
