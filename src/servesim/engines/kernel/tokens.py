"""Token identities without token lists.

A prompt is a tuple of :class:`Segment` runs. A *repeat* segment is ``length`` copies
of one token ``key`` (a Mooncake hash id expands to ``block_size`` copies of one
interned id). A *distinct* segment is ``length`` different tokens
``(key, offset), (key, offset + 1), ...`` (synthetic unique prompts, generated output).

Workloads use non-negative keys. Generated output of request ``r`` is the distinct
segment with key ``generated_key(r)`` (negative), so a later session turn whose prompt
contains an earlier turn's output names exactly the tokens the engine generated.

Block identity (spec §3.8): only complete blocks get an identity; identities are chained
(``h[i] = hash((h[i-1], hash(content[i])))``, cut to 61 bits) so equal hashes mean equal
prefixes. A *run* is the whole blocks of one segment: the content of its first block and
the run's length so far determine every block of it (the same key; for a distinct
segment, offsets one block apart), so inside a run the chain just counts,
``h[i] = h[i-1] + 1``, and a run of any length costs one tuple hash. This needs prompts
in canonical form (maximal segments, :func:`make_prompt`): then where a run starts
depends on the tokens alone; every :class:`RequestSpec` holds its prompt in that form
(:func:`canonical`). Python's hash of tuples of ints does not depend on
``PYTHONHASHSEED``: results are reproducible across processes.
"""

from __future__ import annotations

import operator
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from typing import Final, NamedTuple, overload


class Segment(NamedTuple):
    """One run of a prompt. A named tuple: workloads build one per new trace hash id, and
    a tuple is about twice as fast to create as a frozen attrs class."""

    key: int
    length: int
    repeat: bool = True
    offset: int = 0  # first index of a distinct segment; always 0 for repeat segments


Prompt = tuple[Segment, ...]
_SEGMENT: Final = Segment  # the compiled build reads a Final name without a dict lookup
_LENGTH = operator.attrgetter("length")
# Identities are hashes cut to 61 bits: counting up inside a run stays below 2**62, where
# the compiled build keeps ints unboxed and adds them without allocating.
_ID_MASK: Final = (1 << 61) - 1
_new_tuple: Final = tuple.__new__


def segment(key: int, length: int, repeat: bool = True, offset: int = 0) -> Segment:
    """``Segment(key, length, repeat, offset)`` for hot paths: the named tuple's own
    constructor is a Python function, which the compiled build would leave to the
    interpreter, once per segment."""
    return _new_tuple(_SEGMENT, (key, length, repeat, offset))


def generated_key(request_id: int) -> int:
    """Key of the distinct segment holding request ``request_id``'s generated tokens."""
    return -(request_id + 1)


def _continues(last: Segment, seg: Segment) -> bool:
    """Whether ``seg``'s tokens continue ``last``'s run (the same content goes on)."""
    return last.key == seg.key and last.repeat == seg.repeat and (
        seg.repeat or last.offset + last.length == seg.offset)


def make_prompt(segments: Iterable[Segment]) -> Prompt:
    """Canonical form: drop empty runs, merge runs that continue each other."""
    out: list[Segment] = []
    for seg in segments:
        if seg.length <= 0:
            continue
        if out:
            last = out[-1]
            if _continues(last, seg):
                out[-1] = last._replace(length=last.length + seg.length)
                continue
        out.append(seg)
    return tuple(out)


# The prompt :func:`extend_prompt` made last: canonical by construction, so
# :func:`canonical` (a request's converter, right after) returns it without a pass over it.
_EXTENDED: Final[list[Prompt]] = [()]


def extend_prompt(prompt: Prompt, tail: Iterable[Segment]) -> Prompt:
    """``prompt`` (in canonical form, e.g. an earlier request's) followed by ``tail``, in
    canonical form; costs the tail, not the prompt (a session turn's prompt from the
    previous turn's, whatever the conversation's length)."""
    new = make_prompt(tail)
    if not new:
        out = prompt
    elif prompt and _continues(prompt[-1], new[0]):
        # (the merged run continues whatever ``new[0]`` continued: still canonical)
        last = prompt[-1]
        out = (*prompt[:-1], last._replace(length=last.length + new[0].length), *new[1:])
    else:
        out = prompt + new
    _EXTENDED[0] = out
    return out


def canonical(prompt: Sequence[Segment]) -> Prompt:
    """``prompt`` in canonical form: itself when it is a tuple already in that form (the
    usual case, checked in one pass, or none for the prompt :func:`extend_prompt` just
    made), else :func:`make_prompt` of it."""
    if prompt is _EXTENDED[0]:
        return _EXTENDED[0]
    if type(prompt) is tuple:
        segments: Prompt = prompt
        last: Segment | None = None
        seg: Segment
        for seg in segments:
            if seg.length <= 0 or (last is not None and _continues(last, seg)):
                break
            last = seg
        else:
            return segments
    return make_prompt(prompt)


def prompt_length(prompt: Sequence[Segment]) -> int:
    return sum(map(_LENGTH, prompt))


def truncate(prompt: Sequence[Segment], length: int) -> Prompt:
    """The first ``length`` tokens of ``prompt``."""
    out: list[Segment] = []
    left = length
    for seg in prompt:
        if left <= 0:
            break
        take = min(seg.length, left)
        out.append(seg._replace(length=take))
        left -= take
    return tuple(out)


class BlockIds:
    """The identities of a request's whole blocks, held as runs: run ``r`` covers block
    positions ``ends[r - 1] .. ends[r] - 1`` with identities ``firsts[r]``,
    ``firsts[r] + 1``, ... Its ``bases[r]`` is the identity the segment run began with:
    a run's identities are ``base + offset``, and the pool indexes cached blocks by base,
    so a run of any length costs a few list entries, not one per block."""

    __slots__ = ("bases", "ends", "firsts")

    def __init__(self) -> None:
        self.bases: list[int] = []
        self.firsts: list[int] = []
        self.ends: list[int] = []

    @classmethod
    def of(cls, identities: Iterable[int]) -> BlockIds:
        """Unrelated identities (a state snapshot's), each its own run."""
        ids = cls()
        for h in identities:
            ids.add(h, h, 1)
        return ids

    def __len__(self) -> int:
        ends = self.ends
        return ends[-1] if ends else 0

    @overload
    def __getitem__(self, position: int) -> int: ...
    @overload
    def __getitem__(self, position: slice) -> list[int]: ...

    def __getitem__(self, position: int | slice) -> int | list[int]:
        """The identity of block ``position`` (negative counts from the end); a slice
        gives a list."""
        if isinstance(position, slice):
            return self.as_list()[position]
        n = len(self)
        if position < 0:
            position += n
        if not 0 <= position < n:
            raise IndexError(position)
        r = bisect_right(self.ends, position)
        start = self.ends[r - 1] if r else 0
        return self.firsts[r] + position - start

    def __iter__(self) -> Iterator[int]:
        return iter(self.as_list())

    def last(self) -> int:
        """The identity of the last block (0 when there is none: the chain's start)."""
        ends = self.ends
        return self.firsts[-1] + ends[-1] - (ends[-2] if len(ends) > 1 else 0) - 1 if ends else 0

    def add(self, base: int, first: int, count: int) -> None:
        """Append ``count`` blocks with identities ``first, first + 1, ...`` of the run
        that began with ``base``; one that continues the last run extends it."""
        ends = self.ends
        end = len(self)
        if ends and self.bases[-1] == base and self.last() + 1 == first:
            ends[-1] = end + count
            return
        self.bases.append(base)
        self.firsts.append(first)
        ends.append(end + count)

    def runs(self, start: int, end: int) -> list[tuple[int, int, int, int]]:
        """Positions ``start .. end - 1`` as ``(base, first identity, lo, hi)``, first
        to last: positions ``lo .. hi - 1`` hold ``first, first + 1, ...``."""
        ends = self.ends
        out = []
        r = bisect_right(ends, start)
        lo = start
        while lo < end:
            hi = ends[r] if ends[r] < end else end
            run_start = ends[r - 1] if r else 0
            out.append((self.bases[r], self.firsts[r] + lo - run_start, lo, hi))
            lo = hi
            r += 1
        return out

    def as_list(self) -> list[int]:
        out: list[int] = []
        start = 0
        for first, end in zip(self.firsts, self.ends, strict=True):
            out += range(first, first + end - start)
            start = end
        return out


def extend_run(out: BlockIds, content: int, count: int, continues: bool) -> None:
    """Append the identities of ``count`` consecutive whole blocks of one segment.
    ``continues``: the block before lies whole in the same segment (its run goes on),
    else the first new block starts a run and ``content`` is its content hash, chained
    after the last identity. :func:`block_ids`' own rule."""
    if continues:
        out.ends[-1] += count
        return
    base = hash((out.last(), content)) & _ID_MASK
    out.add(base, base, count)


def distinct_content(key: int, offset: int, block_size: int) -> int:
    """Content hash of a whole block of a distinct segment of ``key`` starting at token
    ``offset`` of that segment."""
    return hash(((key, offset, block_size),))


def block_hashes(
    prompt: Sequence[Segment], block_size: int, limit: int | None = None, start: int = 0,
    previous: int = 0,
) -> list[int]:
    """Chained identities of the complete blocks among the first ``limit`` tokens, as a
    list. ``limit`` is at most the prompt's length (None: all of it). ``start`` (a
    multiple of ``block_size``) skips blocks already hashed, with ``previous`` the
    identity of the block before ``start`` (0 at the beginning)."""
    out = BlockIds()
    if start:
        out.add(previous, previous, 1)  # a run of its own: what follows starts anew
    block_ids(prompt, block_size, out, limit, start)
    return out.as_list()[1 if start else 0:]


def block_ids(
    prompt: Sequence[Segment], block_size: int, out: BlockIds, limit: int | None = None,
    start: int = 0, cursor: tuple[int, int] = (0, 0),
) -> tuple[int, int]:
    """Append to ``out`` the identities of the complete blocks among the first ``limit``
    tokens (None: all), from block ``start // block_size`` on; ``out`` holds the blocks
    before it (``start`` is ``len(out) * block_size``).

    ``cursor`` ``(segment index, its first token)`` says where the walk may start looking
    for block ``start``'s first token (at or before it); returns the cursor where this walk
    ended, at or before the first token of the blocks still to hash. A cursor stays valid
    for any prompt with the same segments before its index (a longer output, a later
    session turn): a walk that resumes from it costs the blocks it hashes, not the prompt
    before them."""
    seg_i, pos = cursor  # pos: token position of segment seg_i's start
    total = prompt_length(prompt) if limit is None else limit
    n_blocks = total // block_size
    first = start // block_size
    if first >= n_blocks:
        return cursor
    # (a tuple: the compiled build indexes it directly, a Sequence through the protocol)
    segments: Prompt = prompt if isinstance(prompt, tuple) else tuple(prompt)
    block = first
    block_start = block * block_size
    # advance to the segment holding block_start
    while seg_i < len(segments) and pos + segments[seg_i].length <= block_start:
        pos += segments[seg_i].length
        seg_i += 1
    while block < n_blocks:
        lo = block * block_size
        hi = lo + block_size
        seg = segments[seg_i]
        seg_end = pos + seg.length
        if pos <= lo and seg_end >= hi:
            # A run of whole blocks inside one segment; it continues the run of the block
            # before ``lo`` if that block lies whole in the segment too.
            stop = min(n_blocks, seg_end // block_size)
            continues = pos <= lo - block_size
            content = 0
            if not continues:
                content = (hash(((seg.key, -1, block_size),)) if seg.repeat
                           else distinct_content(seg.key, seg.offset + lo - pos, block_size))
            extend_run(out, content, stop - block, continues)
            block = stop
            if seg_end == stop * block_size:
                seg_i += 1
                pos = seg_end
            continue
        parts: list[tuple[int, int, int]] = []
        i, p = seg_i, pos
        while p < hi:
            seg = segments[i]
            a = max(lo, p)
            b = min(hi, p + seg.length)
            if seg.repeat:
                parts.append((seg.key, -1, b - a))
            else:
                parts.append((seg.key, seg.offset + a - p, b - a))
            if p + seg.length <= hi:
                p += seg.length
                i += 1
            else:
                break
        h = hash((out.last(), hash(tuple(parts)))) & _ID_MASK
        out.add(h, h, 1)
        seg_i, pos = i, p
        block += 1
    return seg_i, pos
