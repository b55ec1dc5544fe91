"""The two halves of a prefill/decode handoff on top of the shared rank scheduler.

Both pools run the unmodified :class:`~servesim.engines.ranks.scheduler.RankScheduler`
pass logic; these subclasses add only what a handoff needs:

* :class:`PrefillRank` prices decode at zero (the bootstrap token comes out of the prefill
  forward) and, when a request finishes, *holds* its KV lease (and, with a state cache,
  its working state) instead of releasing them, until :meth:`PrefillRank.release_source`
  (the transfer completed);
* :class:`DecodeRank` reserves a destination lease before the KV arrives
  (:meth:`DecodeRank.reserve_destination`, reusing prompt blocks already resident on the
  rank, plus a working state for the transferred recurrent state; TensorRT-LLM takes
  fresh blocks only, once the whole sequence fits), turns it into a
  *materialized* request when the transfer completes
  (:meth:`DecodeRank.activate_destination`: prompt computed, blocks cache-visible), and
  admits materialized requests ahead of the ordinary waiting queue with no prefill work.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable
from typing import Any

import attrs

from servesim.backends import Backend
from servesim.engines.kernel.blocks import NO_BLOCKS, Lease
from servesim.engines.kernel.rank import RUNNING, WAITING
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.state import RequestState
from servesim.engines.ranks.scheduler import RankPass, RankScheduler, SeqState
from servesim.payload import RoleArgs
from servesim.timing.base import StepTimer, prefill_group_ms


@attrs.frozen(slots=True)
class _NoDecodeTimer:
    """A prefill worker's timer: its one token is produced by the prefill forward itself."""

    inner: StepTimer

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return self.inner.prefill_ms(batch, mean_isl, mean_prefix)

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        return prefill_group_ms(self.inner, batch, mean_isl, mean_prefix, group_tokens)

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        return 0.0


class PrefillRank(RankScheduler):
    """A prefill-worker rank: decode time 0, finished requests hold their KV (the source)."""

    def __init__(self, role: RoleArgs, timer: StepTimer, rank_offset: int = 0,
                 policy: Backend | None = None) -> None:
        super().__init__(role, _NoDecodeTimer(timer), rank_offset, policy)
        # Finished requests whose KV is still needed by a transfer, in finishing order.
        self.held: dict[SeqState, None] = {}

    def _finish(self, seq: SeqState, out: RankPass) -> None:
        # Let the base class do its bookkeeping on empty holdings, then keep the blocks:
        # they stay active (not evictable, still cache-visible) until release_source.
        lease, state = seq.lease, seq.state
        seq.lease = Lease()
        if state is not None:
            seq.state = RequestState()
        super()._finish(seq, out)
        seq.lease, seq.state = lease, state
        self.held[seq] = None

    def is_held(self, seq: SeqState) -> bool:
        return seq in self.held

    def release_source(self, seq: SeqState) -> bool:
        """Free a held source lease; True if it was held, False (a no-op) otherwise."""
        if seq not in self.held:
            return False
        del self.held[seq]
        self.pool.release(seq.lease)
        if self.state is not None and seq.state is not None:
            self.state.release(seq.state, done=True)
        return True


class DestinationRejected(Exception):
    """A destination can never hold this request (the request is terminal ``rejected``)."""


class DecodeRank(RankScheduler):
    """A decode-worker rank: destinations are reserved, activated, then admitted."""

    def __init__(self, role: RoleArgs, timer: StepTimer, rank_offset: int = 0,
                 policy: Backend | None = None) -> None:
        super().__init__(role, timer, rank_offset, policy)
        self.reserved: dict[SeqState, None] = {}  # blocks reserved, KV in transfer
        # the engine's requests handed to this rank, queued in order to reserve a destination
        self.handoffs: list[Any] = []
        self.materialized: deque[SeqState] = deque()  # KV arrived, waiting for admission

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.materialized)

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.materialized)

    @property
    def load(self) -> int:
        return self.num_requests + len(self.reserved) + len(self.handoffs)

    @property
    def num_destinations(self) -> int:
        """Requests this rank has committed a sequence slot to."""
        return len(self.running) + len(self.materialized) + len(self.reserved)

    def check_destination(self, spec: RequestSpec) -> None:
        """Raise :class:`DestinationRejected` if no reservation can ever succeed."""
        if self.max_model_len is not None and spec.input_length >= self.max_model_len:
            raise DestinationRejected(
                f"request {spec.request_id}: prompt of {spec.input_length} tokens reaches the "
                f"decode max_model_len {self.max_model_len}")
        blocks = -(-spec.input_length // self.block_size) + self.state_blocks
        if blocks > self.pool.num_blocks:
            raise DestinationRejected(
                f"request {spec.request_id}: prompt needs {blocks} blocks, the decode pool "
                f"has {self.pool.num_blocks}")

    def reserve_destination(self, spec: RequestSpec, record: RequestRecord) -> SeqState | None:
        """Reserve the prompt's blocks, reusing resident prefix blocks.

        Returns the reserved sequence (``resident_tokens(seq)`` of its prompt are already
        on this rank), or None when the rank cannot take it now (retry when capacity
        changes). Raises :class:`DestinationRejected` before reserving anything when it
        never can (prompt >= max_model_len, or more blocks than the pool).
        """
        self.check_destination(spec)
        if self.num_destinations >= self.max_sequences:
            return None
        seq = self.new_seq(spec, record)
        bs = self.block_size
        blocks = -(-seq.prompt_len // bs)
        pool = self.pool
        hits = NO_BLOCKS
        if self.no_evict:
            # TensorRT-LLM (FreshOnly): fresh blocks for the whole prompt, once the whole
            # sequence fits beside what the admitted and reserved requests may still take.
            if -(-seq.stop_len // bs) > pool.num_available - self._promised():
                return None
        elif self.caching:
            full = seq.prompt_len // bs
            self._ensure_hashes(seq, full)
            hits = pool.lookup(seq.hashes, full)
        # Token blocks and the working state for the transferred state, all or nothing.
        if not pool.fits(blocks - len(hits) + self.state_blocks, hits):
            return None
        ok = pool.allocate(seq.lease, blocks, hits)
        if seq.state is not None:
            ok = ok and pool.allocate(seq.state.working, self.state_blocks)
        assert ok, "a reservation that fits failed"
        self._write_back()  # what the reservation evicted
        seq.num_published = len(hits)
        self.reserved[seq] = None
        return seq

    def resident_tokens(self, seq: SeqState) -> int:
        """Prompt tokens a reserved destination found on this rank (not transferred)."""
        return min(seq.num_published * self.block_size, seq.prompt_len)

    def activate_destination(self, seq: SeqState) -> None:
        """The transfer completed: the prompt's KV is present; queue for admission."""
        del self.reserved[seq]
        seq.num_computed = seq.prompt_len
        if self.caching:
            self._publish(seq, seq.prompt_len // self.block_size)
        seq.status = WAITING
        self.materialized.append(seq)

    def cancel_destination(self, seq: SeqState) -> None:
        """Drop a reservation whose transfer will never complete."""
        del self.reserved[seq]
        self.pool.release(seq.lease)
        if self.state is not None and seq.state is not None:
            self.state.release(seq.state, done=True)
        seq.num_published = 0

    def _admitted(self) -> Iterable[SeqState]:
        return itertools.chain(self.running, self.reserved, self.materialized)

    def _intake_blocked(self) -> bool:
        if self.materialized and len(self.running) < self.max_sequences:
            return False
        return self._waiting_blocked()

    def _admit_waiting(
        self, scheduled: list[SeqState], out: RankPass, now: float, defer: bool,
        prompts: bool = True,
    ) -> None:
        # Materialized requests hold their blocks and need no prefill work: admitted first,
        # with cached = prompt, even on a deferred (off-cadence) pass or a decode pass.
        materialized, running = self.materialized, self.running
        while materialized and len(running) < self.max_sequences:
            seq = materialized.popleft()
            seq.status = RUNNING
            running[seq] = None
            seq.pass_id = self._pass_id
            seq.pass_tokens = 0
            seq.pass_isl = -1
            if not seq.admitted:
                seq.admitted = True
                seq.record.first_admit_ms = now
                seq.record.first_admission_reused_tokens = seq.prompt_len
            seq.record.reused_input_tokens = seq.prompt_len
            scheduled.append(seq)
        super()._admit_waiting(scheduled, out, now, defer, prompts)
