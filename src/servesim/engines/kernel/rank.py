"""What the pass-worker layer and the invariant auditor need from a rank scheduler.

A worker of the built-in engines is ``attention_data`` rank schedulers running passes in
lockstep (:mod:`servesim.engines.kernel.passes`). The kernel drives a rank only through
:class:`Rank`; :class:`servesim.engines.ranks.scheduler.RankScheduler` is the one every
built-in engine runs, and a plugin may bring its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Sized
from typing import Final, Protocol

from servesim.engines.kernel.blocks import BlockPool
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.timing.base import StepTimer

# A sequence's status on its rank (``Seq.status``).
WAITING: Final = 0
RUNNING: Final = 1
FINISHED: Final = 2


class Seq(Protocol):
    """One request on one rank."""

    @property
    def spec(self) -> RequestSpec: ...

    @property
    def record(self) -> RequestRecord: ...

    @property
    def num_computed(self) -> int:
        """Tokens whose KV is computed."""

    @property
    def generated(self) -> int:
        """Output tokens emitted so far."""

    @property
    def lease(self) -> Sized:
        """The KV blocks it holds (a :class:`~servesim.engines.kernel.blocks.Lease`)."""


class RankResult(Protocol):
    """What one rank did in one pass; the worker stamps its tokens when the pass ends."""

    prefill_ms: float  # re-priced by the worker when several ranks prefill together
    # (batch, mean input, mean prefix) the prefill half was priced from, and its tokens
    prefill_args: tuple[int, int, int] | None
    prefill_tokens: int

    @property
    def duration_ms(self) -> float: ...

    @property
    def progressed(self) -> bool: ...

    @property
    def emitted(self) -> Sequence[Seq]:
        """One entry per token emitted (a speculative burst lists its request per token)."""

    @property
    def finished(self) -> Sequence[Seq]:
        """Completed at the end of the pass."""

    @property
    def rejected(self) -> Sequence[Seq]:
        """Terminal at the start of the pass."""


class Rank(Protocol):
    """A rank scheduler as a worker runs it: one pass at a time, or a steady segment."""

    @property
    def timer(self) -> StepTimer: ...

    @property
    def pool(self) -> BlockPool: ...

    @property
    def block_size(self) -> int: ...

    @property
    def total_kv_tokens(self) -> int: ...

    @property
    def max_sequences(self) -> int: ...

    @property
    def prefill_interval(self) -> int:
        """New prompt work is admitted every this many passes of an attention-DP group."""

    @property
    def least_loaded(self) -> bool:
        """New requests go to the worker's rank with the fewest (else round-robin)."""

    @property
    def balance(self) -> tuple[int, int] | None:
        """TensorRT-LLM's attention-DP balance: (timeout_iters, batching_wait_iters)."""

    @property
    def has_work(self) -> bool: ...

    @property
    def load(self) -> int:
        """The requests this rank has taken on, as least-loaded placement counts them."""

    @property
    def waiting(self) -> Sequence[Seq]: ...

    @property
    def running(self) -> Iterable[Seq]: ...

    def execute_pass(self, now: float, wave_step: int, dp_size: int,
                     hold: bool) -> RankResult:
        """Schedule one pass starting at ``now`` (``hold``: no new prompt work)."""

    def balance_load(self) -> tuple[bool, int]:
        """(whether the rank has prompt work and a free slot, its decoding requests)."""

    def steady_plan(self) -> tuple[int, int, int] | None:
        """(steady decode passes ahead, batch, active KV tokens), or None if the next
        pass is not a steady decode step."""

    def steady_block_limit(self, steps: int) -> int:
        """How many of ``steps`` steady passes the rank's block crossings allow."""

    def advance_steady(self, steps: int, wave_step: int, dp_size: int,
                       waiting: bool) -> RankResult | None:
        """Apply ``steps`` steady passes at once; the last one's result if it finished
        requests."""
