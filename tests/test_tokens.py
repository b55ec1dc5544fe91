from hypothesis import given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import (
    BlockIds,
    Segment,
    block_hashes,
    block_ids,
    canonical,
    extend_prompt,
    make_prompt,
    segment,
    truncate,
)


def test_equal_prefixes_share_block_identities_and_partial_blocks_have_none() -> None:
    a = make_prompt([Segment(7, 10), Segment(8, 5)])
    b = make_prompt([Segment(7, 10), Segment(9, 5)])
    ha, hb = block_hashes(a, 4), block_hashes(b, 4)
    assert len(ha) == 3  # 15 tokens -> 3 complete blocks of 4
    assert ha[:2] == hb[:2]  # tokens 0..7 are equal
    assert ha[2] != hb[2]  # block 2 holds tokens 8..11: 7,7,8,8 vs 7,7,9,9


def test_distinct_segments_differ_by_position_and_resume_matches_full_hash() -> None:
    p = make_prompt([Segment(3, 12, repeat=False)])
    h = block_hashes(p, 4)
    assert len(set(h)) == 3
    assert block_hashes(p, 4, start=8, previous=h[1]) == h[2:]
    assert block_hashes(p, 4, limit=11) == h[:2]


def test_make_prompt_merges_continuing_runs_and_truncate_cuts() -> None:
    p = make_prompt([Segment(1, 3, False), Segment(1, 2, False, offset=3), Segment(2, 0)])
    assert p == (Segment(1, 5, False),)
    assert truncate(p, 2) == (Segment(1, 2, False),)


def test_the_fast_constructor_builds_the_same_segment() -> None:
    for args in [(3, 64), (3, 10, False, 5), (-2, 1, False)]:
        seg = segment(*args)
        assert type(seg) is Segment and seg == Segment(*args)
        assert (seg.key, seg.length) == args[:2] and seg._replace(length=1).length == 1


def test_identities_inside_runs_resume_and_depend_on_the_tokens_only() -> None:
    p = make_prompt([Segment(5, 3), Segment(6, 20), Segment(7, 9, repeat=False)])
    h = block_hashes(p, 4)
    assert len(h) == 8 and len(set(h)) == 8
    for first in range(1, 8):  # resuming anywhere, also inside a run, gives the same chain
        assert block_hashes(p, 4, start=first * 4, previous=h[first - 1]) == h[first:]
    longer = make_prompt([Segment(5, 3), Segment(6, 40)])  # the same run, going on
    assert block_hashes(longer, 4)[:5] == h[:5]
    other = make_prompt([Segment(5, 3), Segment(6, 16), Segment(8, 4)])
    assert block_hashes(other, 4)[:4] == h[:4] and block_hashes(other, 4)[4] != h[4]


def test_a_request_keeps_its_prompt_canonical_so_identities_follow_the_tokens() -> None:
    whole = make_prompt([Segment(5, 40), Segment(6, 24, repeat=False)])
    assert canonical(whole) is whole  # already canonical: no copy
    split = [Segment(5, 10), Segment(5, 30), Segment(9, 0),
             Segment(6, 8, repeat=False), Segment(6, 16, repeat=False, offset=8)]
    assert block_hashes(tuple(split), 16) != block_hashes(whole, 16)  # runs start elsewhere
    for prompt in (split, tuple(split)):
        spec = RequestSpec(request_id=0, arrival_ms=0.0, prompt=prompt, input_length=64,
                           output_length=1)
        assert spec.prompt == whole and block_hashes(spec.prompt, 16) == block_hashes(whole, 16)
    # segments that only look alike stay apart
    apart = (Segment(5, 8), Segment(5, 8, repeat=False), Segment(6, 4, repeat=False, offset=9))
    assert canonical(apart) == apart


# -- prompts and identities grown turn by turn ------------------------------------------

# segments drawn from few keys, both kinds, so that runs continue each other across turns
SEGMENTS = st.builds(
    lambda key, length, repeat, offset: Segment(key, length, repeat, 0 if repeat else offset),
    st.integers(-2, 2), st.integers(0, 9), st.booleans(), st.sampled_from([0, 3, 5, 9]))
TURNS = st.lists(st.lists(SEGMENTS, max_size=4), min_size=1, max_size=8)


def _runs(ids: BlockIds) -> tuple[list[int], list[int], list[int]]:
    return ids.bases, ids.firsts, ids.ends


@settings(max_examples=400, deadline=None)
@given(TURNS)
def test_a_prompt_extended_turn_by_turn_is_the_canonical_prompt_of_all_its_tokens(
        turns: list[list[Segment]]) -> None:
    prompt = make_prompt(turns[0])
    everything = list(turns[0])
    for tail in turns[1:]:
        prompt = extend_prompt(prompt, tail)
        everything += tail
        assert prompt == make_prompt(everything)
        assert canonical(prompt) is prompt
        assert RequestSpec(0, 0.0, prompt, 1, 1).prompt is prompt


@settings(max_examples=400, deadline=None)
@given(TURNS, st.integers(1, 7), st.data())
def test_identities_grown_from_the_previous_turns_equal_those_from_scratch(
        turns: list[list[Segment]], block_size: int, data: st.DataObject) -> None:
    """Each turn hashes only from where the identities end, resuming the walk from the
    cursor the previous walk returned while the segments before it are unchanged, and
    gets exactly the runs (bases, identities, ends) a walk from the start gets."""
    prompt: tuple[Segment, ...] = ()
    ids = BlockIds()
    cursor = (0, 0)
    for tail in turns:
        previous = prompt
        prompt = extend_prompt(prompt, tail)
        same = next((i for i, (a, b) in enumerate(zip(previous, prompt, strict=False))
                     if a != b),
                    min(len(previous), len(prompt)))
        if cursor[0] > same:
            cursor = (0, 0)  # a segment before the cursor changed (a merged run)
        total = sum(seg.length for seg in prompt)
        limit = data.draw(st.integers(len(ids) * block_size, total))
        cursor = block_ids(prompt, block_size, ids, limit, len(ids) * block_size, cursor)
        scratch = BlockIds()
        block_ids(prompt, block_size, scratch, limit)
        assert _runs(ids) == _runs(scratch)
        assert cursor[0] <= len(prompt)
        assert sum(seg.length for seg in prompt[:cursor[0]]) == cursor[1] <= len(ids) * block_size
