"""Block identities a session's next turn takes over from the turn before.

A session turn's prompt is the previous turn's prompt, its output, then new input
(:func:`~servesim.engines.kernel.tokens.extend_prompt`), so the identities of the previous
turn's complete blocks are the first identities of the next turn's prompt (they depend on
the tokens alone, spec §3.8). :class:`TurnIds` keeps, per session, those of the latest turn
that finished on one rank; the next turn starts from them (handed over) and hashes only the
blocks from there on (:func:`~servesim.engines.kernel.tokens.block_ids` resumes from the
previous turn's cursor), so its cost is its new tokens, not the conversation's.

The next turn takes them over only when its prompt is checked to continue the remembered
turn's tokens: the same segments (a C-level comparison of shared objects; only the last,
by identity, when the workload says it built the prompt from that turn's,
``RequestSpec.extends``), then that
turn's output segment, at least as long as the output its identities cover. Anything else
(another session, a turn that ran on another rank, a prompt built otherwise) hashes from
the start, as without it. The identities are pure functions of the tokens, so what the
pool has evicted or preempted since does not matter here.

Kept are the later turns (``turn_index`` at least 1: one-turn requests and a session's
first, short, turn are not), of sessions whose turns have continued each other so far: a
session whose next turn did not (a Mooncake trace's rows list every hash id) is marked, and
its turns are not kept after that.
"""

from __future__ import annotations

from typing import Final, NamedTuple

from servesim.engines.kernel.blocks import Lease
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import BlockIds, Prompt, generated_key

# Sessions remembered at most (the oldest forgotten first): each holds its last prompt and
# identities until its next turn arrives, and a session that ended never asks again.
MAX_SESSIONS: Final = 4096


class _Turn(NamedTuple):
    request_id: int
    prompt: Prompt
    generated: int  # output tokens the identities may cover
    hashes: BlockIds
    cursor: tuple[int, int]  # where the turn's last walk of its prompt ended
    known: Lease | None  # blocks that answered the first identities (BlockPool.answering)


class TurnIds:
    """The identities of each session's latest finished turn on one rank."""

    __slots__ = ("_last", "limit")

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        # session -> its latest turn; None: its turns do not continue each other
        self._last: dict[str, _Turn | None] = {}

    def __len__(self) -> int:
        return len(self._last)

    def _keep(self, session_id: str, turn: _Turn | None) -> None:
        last = self._last
        last.pop(session_id, None)
        if len(last) >= self.limit:
            del last[next(iter(last))]
        last[session_id] = turn

    def keeps(self, spec: RequestSpec) -> bool:
        """Whether :meth:`remember` keeps ``spec``: a later turn of a session whose turns
        have continued each other so far."""
        session_id = spec.session_id
        return session_id is not None and spec.turn_index != 0 and not (
            session_id in self._last and self._last[session_id] is None)

    def remember(self, spec: RequestSpec, generated: int, hashes: BlockIds,
                 cursor: tuple[int, int], known: Lease | None = None) -> None:
        """``spec`` finished after ``generated`` output tokens; ``hashes`` are the
        identities of its complete blocks (prompt and output), handed over (:meth:`take`
        gives them to the next turn, which extends them), ``cursor`` where the walk of
        its prompt ended (a segment index at most ``len(spec.prompt)``), ``known`` the
        blocks that answered the first of them as it finished (for the next turn's
        lookup to resume after them, :meth:`BlockPool.lookup`)."""
        session_id = spec.session_id
        if session_id is None or not self.keeps(spec):
            return
        self._keep(session_id, _Turn(spec.request_id, spec.prompt, generated, hashes, cursor,
                                     known))

    def take(self, session_id: str | None, prompt: Prompt, extends: int = -1
             ) -> tuple[BlockIds, tuple[int, int], Lease | None] | None:
        """If ``prompt`` continues the tokens of ``session_id``'s remembered turn, that
        turn's identities (the first ones of ``prompt``), the cursor to resume the
        walk from and the blocks known to answer the first identities; else None. The
        remembered turn is used up either way; one that ``prompt`` does not continue marks
        the session. ``extends`` (:attr:`RequestSpec.extends`) naming the remembered turn
        says its segments begin ``prompt``: then only the last of them is checked to be the
        very object ``prompt`` holds there (as :func:`extend_prompt` leaves it), not every
        one compared (a long conversation's are many)."""
        if session_id is None:
            return None
        turn = self._last.get(session_id)
        if turn is None:
            return None
        del self._last[session_id]
        n = len(turn.prompt)
        output = prompt[n] if len(prompt) > n else None
        built_from = (n > 0 and extends == turn.request_id
                      and prompt[n - 1] is turn.prompt[n - 1])
        if (output is None or output.key != generated_key(turn.request_id) or output.repeat
                or output.offset or output.length < turn.generated
                or not (built_from or prompt[:n] == turn.prompt)):
            self._keep(session_id, None)
            return None
        return turn.hashes, turn.cursor, turn.known
