"""The processor-sharing link: transfer end times computed by hand.

``n`` active transfers each move at bandwidth / n, recomputed when one starts or ends. The
numbers are chosen so every time and byte count is exact in binary floating point, and
the end times are compared with ``==``.
"""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.events import EventQueue
from servesim.engines.kernel.links import SharedLink, Transfer

GB = 1_000_000_000


def drive(bandwidth: float, starts: list[tuple[float, int, int]], *,
          starts_first: bool = False) -> tuple[dict[int, float], SharedLink]:
    """Run ``starts`` ((time ms, key, bytes)) on one link: the end time of each key. A
    start at the instant of a completion event goes after it (before, ``starts_first``)."""
    events: EventQueue[Transfer] = EventQueue()
    link = SharedLink(events, bandwidth)
    ends: dict[int, float] = {}
    pending = sorted(starts)

    def done(t: Transfer) -> None:
        assert t.key not in ends and t.end_ms is not None
        ends[t.key] = t.end_ms

    while pending or events.peek_time() is not None:
        t_event = events.peek_time()
        if pending and (t_event is None or pending[0][0] < t_event
                        or (starts_first and pending[0][0] == t_event)):
            at, key, nbytes = pending.pop(0)
            link.start(at, key, nbytes, done)
        else:
            at, _, transfer = events.pop()
            link.finish(transfer, at)
    assert not link.active and link.sent == link.started
    return ends, link


def test_a_lone_transfer_takes_bytes_over_bandwidth() -> None:
    # 128e6 B at 1 GB/s = 128 ms, and again once the link has emptied.
    ends, link = drive(1.0, [(0.0, 1, 128_000_000), (500.0, 2, 128_000_000)])
    assert ends == {1: 128.0, 2: 628.0}
    assert link.peak == 1


def test_two_overlapping_transfers_finish_together() -> None:
    # 10 GB/s. A = 10 GB from 0 s: alone until 0.5 s, it moves 5 GB (5 GB left). B = 5 GB
    # joins at 0.5 s: 5 GB/s each, so B needs 1 s (to 1.5 s), and A's 5 GB take 1 s too.
    ends, link = drive(10.0, [(0.0, 1, 10 * GB), (500.0, 2, 5 * GB)])
    assert ends == {1: 1500.0, 2: 1500.0}
    assert link.peak == 2


def test_the_shorter_transfer_leaves_the_link_to_the_longer() -> None:
    # 10 GB/s. A = 10 GB from 0 s has 5 GB left at 0.5 s when B = 2 GB joins: 5 GB/s each,
    # B is done after 0.4 s (0.9 s) with A at 3 GB left; alone again, A needs 0.3 s (1.2 s).
    # 12 GB in 1.2 s: the link ran at its full 10 GB/s throughout, never faster.
    ends, _ = drive(10.0, [(0.0, 1, 10 * GB), (500.0, 2, 2 * GB)])
    assert ends == {1: 1200.0, 2: 900.0}


def test_three_transfers() -> None:
    # 1 GB/s. A = 3 GB and B = 1 GB from 0 s share it: 0.5 GB/s each, so at 1 s A has
    # 2.5 GB left and B 0.5 GB. C = 1 GB joins at 1 s: 1/3 GB/s each; B is done after 1.5 s
    # (2.5 s), A then has 2 GB left and C 0.5 GB. 0.5 GB/s each: C is done after 1 s
    # (3.5 s), A has 1.5 GB left, alone: 1.5 s more (5 s). 5 GB in 5 s.
    ends, link = drive(1.0, [(0.0, 1, 3 * GB), (0.0, 2, 1 * GB), (1000.0, 3, 1 * GB)])
    assert ends == {1: 5000.0, 2: 2500.0, 3: 3500.0}
    assert link.peak == 3


@pytest.mark.parametrize("starts_first", [False, True])
def test_a_transfer_starting_exactly_when_another_ends(starts_first: bool) -> None:
    # 1 GB/s. A = 1 GB ends at 1 s; B = 1 GB starts at 1 s, before or after A's completion
    # is processed at that instant: either way A has nothing left to share and B takes 1 s.
    ends, _ = drive(1.0, [(0.0, 1, GB), (1000.0, 2, GB)], starts_first=starts_first)
    assert ends == {1: 1000.0, 2: 2000.0}


def test_a_zero_byte_transfer_finishes_at_its_start_and_takes_no_share() -> None:
    # 1 GB/s: A = 1 GB from 0 s, an empty transfer at 0.25 s, alone A still ends at 1 s.
    ends, link = drive(1.0, [(0.0, 1, GB), (250.0, 2, 0)])
    assert ends == {1: 1000.0, 2: 250.0}
    assert link.peak == 1
    events: EventQueue[Transfer] = EventQueue()
    empty = SharedLink(events, 1.0)
    done: list[Transfer] = []
    transfer = empty.start(3.0, 7, 0, done.append)
    assert done == [transfer] and transfer.end_ms == 3.0  # inline, no event
    assert len(events) == 0 and not empty.active


def test_progress_is_exact_and_reads_only() -> None:
    # 10 GB/s = 1e7 B/ms. A = 10 GB from 0, B = 5 GB from 500 ms (see above).
    events: EventQueue[Transfer] = EventQueue()
    link = SharedLink(events, 10.0)
    a = link.start(0.0, 1, 10 * GB, lambda t: None)
    assert link.remaining(a, 250.0) == 7.5 * GB  # alone: 2.5 GB in 250 ms
    b = link.start(500.0, 2, 5 * GB, lambda t: None)
    # 500-1000 ms: 5 GB/s each, 2.5 GB more each
    assert (link.remaining(a, 1000.0), link.remaining(b, 1000.0)) == (2.5 * GB, 2.5 * GB)
    assert link.moved(1000.0) == 10 * GB  # 1 s at 10 GB/s
    assert link.remaining(a, 1000.0) == 2.5 * GB  # reading changed nothing
    assert (a.uncontended_ms, b.uncontended_ms) == (1000.0, 500.0)


def test_a_link_needs_a_positive_bandwidth() -> None:
    with pytest.raises(ValueError, match="positive bandwidth"):
        SharedLink(EventQueue(), 0.0)


def reference_ends(bandwidth: int, starts: list[tuple[int, int, int]]) -> dict[int, Fraction]:
    """Processor sharing in exact rationals: step from event to event, every active
    transfer moving bandwidth / n (bytes per ns = GB/s, so times here are in ns)."""
    pending = sorted(starts)
    active: dict[int, Fraction] = {}
    ends: dict[int, Fraction] = {}
    now = Fraction(0)
    while pending or active:
        n = len(active)
        done_at = now + min(active.values()) * n / bandwidth if active else None
        if pending and (done_at is None or pending[0][0] * 1_000_000 < done_at):
            at = Fraction(pending[0][0] * 1_000_000)
        else:
            assert done_at is not None
            at = done_at
        for key in active:
            active[key] -= (at - now) * bandwidth / n
        now = at
        for key in [k for k, left in active.items() if left == 0]:
            ends[key] = now
            del active[key]
        while pending and pending[0][0] * 1_000_000 == now:
            _, key, nbytes = pending.pop(0)
            if nbytes:
                active[key] = Fraction(nbytes)
            else:
                ends[key] = now
    return ends


@settings(max_examples=300, deadline=None)
@given(bandwidth=st.sampled_from([1, 3, 10, 25]),
       starts=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 7_000_000)),
                       min_size=1, max_size=9))
def test_the_link_matches_exact_processor_sharing(bandwidth: int,
                                                  starts: list[tuple[int, int]]) -> None:
    """Any starts and sizes: the end times are those of exact processor sharing (to float
    rounding), none ends before it would alone, and every byte is sent."""
    keyed = [(at, key, nbytes) for key, (at, nbytes) in enumerate(starts)]
    ends, link = drive(float(bandwidth), [(float(a), k, b) for a, k, b in keyed])
    exact = reference_ends(bandwidth, keyed)
    for at, key, nbytes in keyed:
        assert ends[key] == pytest.approx(float(exact[key] / 1_000_000), rel=1e-12, abs=1e-9)
        assert ends[key] >= at + link.alone_ms(nbytes) * (1 - 1e-12)
    assert link.sent == sum(b for _, _, b in keyed)
