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
from collections.abc import Iterable, Sequence
from typing import Final, NamedTuple


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


def canonical(prompt: Sequence[Segment]) -> Prompt:
    """``prompt`` in canonical form: itself when it is a tuple already in that form (the
    usual case, checked in one pass), else :func:`make_prompt` of it."""
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


def extend_run(out: list[int], previous: int, content: int, count: int,
               continues: bool) -> int:
    """Append the identities of ``count`` consecutive whole blocks of one segment, chained
    after the block with identity ``previous``; the last identity. ``continues``: that
    block lies whole in the same segment (the run goes on), else the first new block
    starts a run and ``content`` is its content hash. :func:`block_hashes`' own rule."""
    h = previous if continues else (hash((previous, content)) & _ID_MASK) - 1
    # Runs are short (a trace hash id): no range object to build. (``_i``, not ``_``: the
    # compiled build keeps ``_`` as an object and would box every count.)
    for _i in range(count):
        h += 1
        out.append(h)
    return h


def distinct_content(key: int, offset: int, block_size: int) -> int:
    """Content hash of a whole block of a distinct segment of ``key`` starting at token
    ``offset`` of that segment."""
    return hash(((key, offset, block_size),))


def block_hashes(
    prompt: Sequence[Segment], block_size: int, limit: int | None = None, start: int = 0,
    previous: int = 0,
) -> list[int]:
    """Chained identities of the complete blocks among the first ``limit`` tokens.

    ``limit`` is at most the prompt's length (None: all of it). ``start`` (a multiple of
    ``block_size``) skips blocks already hashed, with ``previous`` the identity of the
    block before ``start`` (0 at the beginning).
    """
    total = prompt_length(prompt) if limit is None else limit
    n_blocks = total // block_size
    first = start // block_size
    if first >= n_blocks:
        return []
    # (a tuple: the compiled build indexes it directly, a Sequence through the protocol)
    segments: Prompt = prompt if isinstance(prompt, tuple) else tuple(prompt)
    out: list[int] = []
    h = previous
    pos = 0  # token position of the current segment's start
    seg_i = 0
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
            h = extend_run(out, h, content, stop - block, continues)
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
        h = hash((h, hash(tuple(parts)))) & _ID_MASK
        out.append(h)
        seg_i, pos = i, p
        block += 1
    return out
