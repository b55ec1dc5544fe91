"""Block identities a session's next turn takes over from the turn before.

A session turn's prompt is the previous turn's prompt, its output, then new input
(:func:`~servesim.engines.kernel.tokens.extend_prompt`), so the identities of the previous
turn's complete blocks are the first identities of the next turn's prompt (they depend on
the tokens alone, spec §3.8). :class:`TurnIds` keeps, per session, those of the latest turn
that finished on one rank; the next turn starts from a copy of them and hashes only the
blocks from there on (:func:`~servesim.engines.kernel.tokens.block_ids` resumes from the
previous turn's cursor), so its cost is its new tokens, not the conversation's.

The next turn takes them over only when its prompt is checked to continue the remembered
turn's tokens: the same segments (a C-level comparison of shared objects), then that
turn's output segment, at least as long as the output its identities cover. Anything else
(another session, a turn that ran on another rank, a prompt built otherwise) hashes from
the start, as without it. The identities are pure functions of the tokens, so what the
pool has evicted or preempted since does not matter here.
"""

from __future__ import annotations

from typing import Final, NamedTuple

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


class TurnIds:
    """The identities of each session's latest finished turn on one rank."""

    __slots__ = ("_last", "limit")

    def __init__(self, limit: int = MAX_SESSIONS) -> None:
        self.limit = limit
        self._last: dict[str, _Turn] = {}

    def __len__(self) -> int:
        return len(self._last)

    def remember(self, session_id: str | None, request_id: int, prompt: Prompt,
                 generated: int, hashes: BlockIds, cursor: tuple[int, int]) -> None:
        """Request ``request_id`` of ``session_id`` finished after ``generated`` output
        tokens; ``hashes`` are the identities of its complete blocks (prompt and output),
        ``cursor`` where the walk of its prompt ended (a segment index at most
        ``len(prompt)``)."""
        if session_id is None or not hashes:
            return
        last = self._last
        last.pop(session_id, None)
        if len(last) >= self.limit:
            del last[next(iter(last))]
        last[session_id] = _Turn(request_id, prompt, generated, hashes, cursor)

    def take(self, session_id: str | None, prompt: Prompt
             ) -> tuple[BlockIds, tuple[int, int]] | None:
        """If ``prompt`` continues the tokens of ``session_id``'s remembered turn, a copy of
        that turn's identities (the first ones of ``prompt``) and the cursor to resume the
        walk from; else None. The session's entry is used up either way."""
        if session_id is None:
            return None
        turn = self._last.pop(session_id, None)
        if turn is None:
            return None
        n = len(turn.prompt)
        if len(prompt) <= n:
            return None
        output = prompt[n]
        if (output.key != generated_key(turn.request_id) or output.repeat or output.offset
                or output.length < turn.generated or prompt[:n] != turn.prompt):
            return None
        return turn.hashes.copy(), turn.cursor
