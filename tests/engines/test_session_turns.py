"""A session's next turn takes over the previous turn's block identities
(:mod:`servesim.engines.kernel.turns`): replays with and without it are identical, also
when the previous turn's blocks were evicted or its prompt is not what the next turn
continues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.blocks import Lease
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import (
    BlockIds,
    Segment,
    block_ids,
    extend_prompt,
    generated_key,
    make_prompt,
    prompt_length,
)
from servesim.engines.kernel.turns import TurnIds
from servesim.engines.vllm import AggregatedReplay
from servesim.payload import RoleArgs, StateCacheArgs, TimingArgs
from servesim.timing import make_timer

from .conftest import ListWorkload
from .strategies import Sink, check_drained, fresh, kv_transfers, replayed, roles, speculations

PARTS = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5), st.booleans()),
                 min_size=1, max_size=3)


def _segments(parts: list[tuple[int, int, bool]]) -> list[Segment]:
    return [Segment(key, length, repeat) for key, length, repeat in parts]


@st.composite
def sessions(draw: st.DrawFn) -> ListWorkload:
    """Up to three sessions of two to five turns, each turn's prompt the previous one's,
    its output and new input; now and then a turn that does not continue the previous
    one (same session, a prompt of its own)."""
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    for s in range(draw(st.integers(1, 3))):
        rid = 10 * s
        prompt = make_prompt(_segments(draw(PARTS)))
        output = draw(st.integers(0, 4))
        spec = RequestSpec(rid, draw(st.sampled_from([0.0, 1.0, 4.0])), prompt,
                           prompt_length(prompt), output, session_id=f"s{s}")
        specs.append(spec)
        for turn in range(1, draw(st.integers(2, 5))):
            new = _segments(draw(PARTS))
            kind = draw(st.integers(0, 5))
            if kind == 0:
                prompt = make_prompt(new)  # not a continuation
            else:
                if kind == 1:  # the previous output after other tokens: not one either
                    prompt = make_prompt([Segment(9, prompt[0].length), *prompt[1:]])
                prompt = extend_prompt(prompt, [
                    Segment(generated_key(rid), output, repeat=False), *new])
            output = draw(st.integers(0, 4))
            follow = RequestSpec(rid + 1, draw(st.sampled_from([0.0, 0.5, 6.0])), prompt,
                                 prompt_length(prompt), output, session_id=f"s{s}",
                                 turn_index=turn)
            followups[rid] = [follow]
            rid += 1
    return ListWorkload(specs, followups=followups)


def _longest(workload: ListWorkload) -> int:
    turns = [*workload.specs, *(f for fs in workload.followups.values() for f in fs)]
    return max(s.input_length for s in turns) + 8


def _without_turns(replay: Any) -> Any:
    for worker in replay.workers:
        for rank in worker.ranks:
            rank.turns = None
    return replay


def _replay(role: RoleArgs, workload: ListWorkload, *, memo: bool
            ) -> Callable[[Sink], AggregatedReplay]:
    def make(sink: Sink) -> AggregatedReplay:
        replay = AggregatedReplay(role, make_timer(role), fresh(workload), sink, None)
        return replay if memo else _without_turns(replay)

    return make


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RoleArgs, ListWorkload]:
    workload = draw(sessions())
    return draw(roles("aggregated", _longest(workload), prefix_caching=True)), workload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_turns_taking_over_identities_replay_exactly_like_turns_hashing_from_scratch(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    role, workload = case
    taken, replay = replayed(_replay(role, workload, memo=True))
    scratch, _ = replayed(_replay(role, workload, memo=False))
    assert taken == scratch
    check_drained(replay)


@st.composite
def disagg_scenarios(draw: st.DrawFn) -> tuple[RoleArgs, RoleArgs, Any, ListWorkload]:
    """P/D: both pools cache prefixes; a state cache on both or neither, speculation or
    not (deployment-wide)."""
    workload = draw(sessions())
    state = draw(st.booleans())
    speculation = draw(st.one_of(st.none(), speculations()))

    def role(worker_type: str) -> RoleArgs:
        blocks = draw(st.integers(1, 2)) if state else 0
        cache = StateCacheArgs(bytes_per_request=1, state_blocks=blocks,
                               allocated_bytes_per_request=1) if state else None
        return draw(roles(worker_type, _longest(workload), prefix_caching=True,
                          num_gpu_blocks=st.integers(blocks + 1, 16), state_cache=cache,
                          speculation=speculation, backend="vllm" if state else "sglang"
                          if draw(st.booleans()) else "vllm"))

    return role("prefill"), role("decode"), draw(kv_transfers()), workload


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disagg_scenarios())
def test_pd_session_turns_replay_exactly_like_turns_hashing_from_scratch(
        case: tuple[RoleArgs, RoleArgs, Any, ListWorkload]) -> None:
    prefill, decode, kv, workload = case

    def make(memo: bool) -> Callable[[Sink], DisaggReplay]:
        def build(sink: Sink) -> DisaggReplay:
            replay = DisaggReplay(prefill, decode, kv, fresh(workload), sink)
            return replay if memo else _without_turns(replay)
        return build

    assert replayed(make(True))[0] == replayed(make(False))[0]


ROLE = RoleArgs(worker_type="aggregated", backend="vllm", model="m", hardware="h",
                block_size=4, num_gpu_blocks=8, max_batched_tokens=64, max_sequences=4,
                prefix_caching=True, timing=TimingArgs(type="fixed", prefill_ms=1.0,
                                                       decode_ms=1.0))


def _two_turns(evictor: bool) -> ListWorkload:
    """Turns 1 and 2 of session ``s`` (its turn 0 is left out): 14 prompt tokens and 3
    output tokens, then a turn adding 5; with ``evictor``, a 32-token request in between
    takes the whole pool."""
    first = make_prompt([Segment(1, 14, repeat=False)])
    second = extend_prompt(first, [Segment(generated_key(0), 3, repeat=False),
                                   Segment(2, 5, repeat=False)])
    specs = [RequestSpec(0, 0.0, first, 14, 3, session_id="s", turn_index=1)]
    turn = RequestSpec(1, 10.0 if evictor else 0.0, second, 22, 2, session_id="s",
                       turn_index=2)
    if evictor:
        specs.append(RequestSpec(2, 6.0, make_prompt([Segment(3, 32, repeat=False)]), 32, 1))
    return ListWorkload(specs, followups={0: [turn]})


@pytest.mark.parametrize("evictor", [False, True])
def test_a_turn_takes_over_its_identities_and_finds_what_is_still_cached(
        evictor: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    takes: list[Any] = []
    take = TurnIds.take

    def counting(self: TurnIds, session_id: str | None, prompt: Any, extends: int) -> Any:
        taken = take(self, session_id, prompt, extends)
        takes.append(None if taken is None else (taken[0].as_list(), taken[1]))
        return taken

    monkeypatch.setattr(TurnIds, "take", counting)
    workload = _two_turns(evictor)
    with_memo, replay = replayed(_replay(ROLE, workload, memo=True))
    assert with_memo == replayed(_replay(ROLE, workload, memo=False))[0]
    check_drained(replay)
    # the second turn took the first's 4 identities (its 17 tokens' complete blocks) ...
    taken = [t for t in takes if t is not None]
    assert len(taken) == 1
    ids, _ = taken[0]
    second = workload.followups[0][0]
    scratch = BlockIds()
    block_ids(second.prompt, 4, scratch, 16)
    assert ids == scratch.as_list()
    # ... and reused the 4 cached blocks, or none once the evictor took the pool
    records = {key[0]: key for key in with_memo[0]}
    assert records[1][5] == (0 if evictor else 16)


def _turn(prompt: tuple[Segment, ...], request_id: int = 7, session_id: str | None = "s",
          turn_index: int = 1) -> RequestSpec:
    return RequestSpec(request_id, 0.0, prompt, prompt_length(prompt), 3,
                       session_id=session_id, turn_index=turn_index)


def test_turn_ids_are_taken_only_by_a_prompt_that_continues_the_turn() -> None:
    first = make_prompt([Segment(1, 9, repeat=False)])
    ids = BlockIds()
    cursor = block_ids(first, 4, ids, 9)
    output = Segment(generated_key(7), 3, repeat=False)
    follow = extend_prompt(first, [output, Segment(2, 4, repeat=False)])
    others = [
        extend_prompt(first, [Segment(generated_key(6), 3, repeat=False)]),  # another output
        extend_prompt(first, [Segment(generated_key(7), 1, repeat=False)]),  # shorter output
        make_prompt([Segment(1, 8, repeat=False), Segment(5, 1), output]),  # other tokens
        make_prompt([Segment(4, 9, repeat=False), output]),  # the output after other tokens
        first,  # no output at all
    ]
    for prompt in others:
        memo = TurnIds()
        memo.remember(_turn(first), 2, ids, cursor)
        assert memo.take("s", prompt) is None
        # the session is marked: its turns are not kept any more
        memo.remember(_turn(first), 2, ids, cursor)
        assert memo.take("s", follow) is None
    memo = TurnIds()
    memo.remember(_turn(first), 2, ids, cursor)
    assert memo.take("other", follow) is None and memo.take(None, follow) is None
    taken = memo.take("s", follow)
    assert taken is not None and taken[1] == cursor
    assert taken[0].as_list() == ids.as_list() and taken[0] is ids  # handed over, not copied
    assert memo.take("s", follow) is None  # used up
    # when the workload says it built the prompt from the turn's, only the last segment
    # before the output is checked, by identity: a prompt holding the turn's last segment
    # object after other tokens is trusted; one built from other objects is compared
    two = make_prompt([Segment(1, 9, repeat=False), Segment(3, 2, repeat=False)])
    other_start = (Segment(4, 9, repeat=False), two[1], output)
    for prompt, extends, expected in ((other_start, 7, True), (other_start, 6, False),
                                      (other_start, -1, False), (others[3], 7, False)):
        memo = TurnIds()
        turn = first if prompt is others[3] else two
        memo.remember(_turn(turn), 2, ids, cursor)
        assert (memo.take("s", prompt, extends) is not None) is expected
    memo = TurnIds()
    memo.remember(_turn(first), 2, ids, cursor)
    assert memo.take("s", others[1], 7) is None  # the output is shorter than the turn's


def test_turn_ids_keep_later_turns_and_forget_the_oldest_beyond_their_limit() -> None:
    ids = BlockIds.of([5])
    prompt = make_prompt([Segment(1, 4, repeat=False)])
    follow = extend_prompt(prompt, [Segment(generated_key(7), 1, repeat=False)])
    memo = TurnIds(limit=2)
    for sid in ("a", "b", "a", "c"):  # "a" again: the most recent, "b" goes
        memo.remember(_turn(prompt, session_id=sid), 1, ids, (0, 0))
    assert len(memo) == 2
    assert memo.take("b", follow) is None
    assert memo.take("a", follow) is not None and memo.take("c", follow) is not None
    memo.remember(_turn(prompt, turn_index=0), 1, ids, (0, 0))  # a first (or only) turn
    memo.remember(_turn(prompt, session_id=None), 1, ids, (0, 0))  # not a session
    assert len(memo) == 0
    memo.remember(_turn(prompt, turn_index=5), 1, BlockIds(), (0, 0))  # no blocks yet: kept
    taken = memo.take("s", follow)
    assert taken is not None and len(taken[0]) == 0


class _Unknowing(TurnIds):
    """Hands over identities but not the blocks known to answer them: every lookup walks
    the identities from the first."""

    __slots__ = ()

    def take(self, session_id: str | None, prompt: Any, extends: int = -1) -> Any:
        taken = super().take(session_id, prompt, extends)
        return None if taken is None else (taken[0], taken[1], None)


def _variant(role: RoleArgs, workload: ListWorkload, variant: str
             ) -> Callable[[Sink], AggregatedReplay]:
    def make(sink: Sink) -> AggregatedReplay:
        replay = AggregatedReplay(role, make_timer(role), fresh(workload), sink, None)
        for worker in replay.workers:
            for rank in worker.ranks:
                if variant == "unknowing":
                    rank.turns = _Unknowing()
                elif variant == "listened":
                    # a listener keeps every block id in its extent (no regrowing)
                    rank.pool.on_evict = lambda base, lo, hi: None
        return replay

    return make


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_lookups_resuming_after_known_blocks_and_regrown_extents_change_nothing(
        case: tuple[RoleArgs, ListWorkload]) -> None:
    """The two shortcuts of a session's next turn, each turned off: identical replays
    (small pools: turns evict each other's blocks between turns)."""
    role, workload = case
    default, replay = replayed(_variant(role, workload, "default"))
    assert default == replayed(_variant(role, workload, "unknowing"))[0]
    assert default == replayed(_variant(role, workload, "listened"))[0]
    check_drained(replay)


class _Watching(TurnIds):
    """Records, per remembered turn, the runs and size of the blocks known to answer."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[int, int]] = []

    def remember(self, spec: RequestSpec, generated: int, hashes: BlockIds,
                 cursor: tuple[int, int], known: Lease | None = None) -> None:
        assert known is not None
        self.seen.append((len(known.runs), len(known)))
        super().remember(spec, generated, hashes, cursor, known)


def test_a_long_session_keeps_its_blocks_in_one_run() -> None:
    """40 turns of 3 new tokens and 2 output tokens on 4-token blocks: each turn
    recomputes the previous one's partial last block, in the extent that holds the
    conversation, so what a turn hands over stays one run however long it gets."""
    specs, followups = [], {}
    prompt = make_prompt([Segment(1, 6, repeat=False)])
    for rid in range(40):
        spec = RequestSpec(rid, 0.0, prompt, prompt_length(prompt), 2, session_id="s",
                           turn_index=rid + 1)
        if rid:
            followups[rid - 1] = [spec]
        else:
            specs.append(spec)
        prompt = extend_prompt(prompt, [Segment(generated_key(rid), 2, repeat=False),
                                        Segment(100 + rid, 3, repeat=False)])
    workload = ListWorkload(specs, followups=followups)
    role = attrs.evolve(ROLE, num_gpu_blocks=64)
    watching = _Watching()

    def make(sink: Sink) -> AggregatedReplay:
        replay = AggregatedReplay(role, make_timer(role), fresh(workload), sink, None)
        replay.workers[0].ranks[0].turns = watching
        return replay

    records, replay = replayed(make)
    assert records == replayed(_variant(role, workload, "listened"))[0]
    check_drained(replay)
    assert len(watching.seen) == 40
    assert all(runs == 1 for runs, _ in watching.seen)
    # every turn's complete blocks but its last output token's answer at its end
    assert [size for _, size in watching.seen] == [(6 + 5 * t + 1) // 4 for t in range(40)]
