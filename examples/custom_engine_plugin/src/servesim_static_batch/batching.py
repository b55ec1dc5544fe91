"""Static batching, a run on servesim's replay base class (``Replay``).

The scheduler most serving stacks had before continuous batching (FasterTransformer,
early Triton): an idle worker takes up to ``max_batch_size`` waiting requests (FIFO),
reserves the KV of each request's whole sequence (prompt + output) up front, prefills
them in one pass and decodes them together until the *longest* output is done. Nothing
joins a batch in flight, so a short request waits for the long ones, and with
``pad_to_longest`` (the default) a finished request keeps its slot and is computed as
padding until the batch ends.

Per worker:

- Requests are placed round-robin on arrival and wait in FIFO order.
- An idle worker with fewer than ``max_batch_size`` waiting requests waits until the
  oldest has waited ``max_wait_ms`` (0: start at once).
- Admission stops at the first request whose blocks (``ceil((input + output) / block)``,
  minus its cached prefix) do not fit the pool; a request that can never fit (longer
  than ``max_model_len`` or the whole pool) is rejected.
- The batch's prefill pass costs ``prefill_ms(n, mean input, mean cached prefix)`` and
  emits every request's first token; decode step ``k`` costs ``decode_ms`` of the
  requests still in the batch (all ``n`` when padding) and emits token ``k + 1`` of
  each request that has one. A request is terminal at its last token.
- With prefix caching on, complete prompt blocks are published after the prefill and
  later batches reuse them (recompute cap: the last prompt token is always computed).

The base runs the clock and the event heap, builds the records, ends requests (sink,
workload follow-ups) and flushes those in flight at the cutoff; this module says what its
events do (:meth:`StaticBatchReplay._dispatch`) and when an idle worker starts a batch.
Time is float milliseconds of virtual time, as everywhere in servesim.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any

import attrs

from servesim.engines.base import Progress, Sink
from servesim.engines.kernel.blocks import BlockPool
from servesim.engines.kernel.events import PHASE_ENGINE
from servesim.engines.kernel.replay import Replay
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, Workload
from servesim.engines.kernel.tokens import block_hashes
from servesim.payload import RoleArgs
from servesim.timing import StepTimer

if TYPE_CHECKING:
    from servesim_static_batch.engine import StaticBatchOptions


@attrs.define(eq=False)
class _Member:  # a request on its worker; the event of its last token
    spec: RequestSpec
    record: RequestRecord
    lease: list[int] = attrs.field(factory=list)


@attrs.define(eq=False)
class _Worker:  # also the event ending its batch
    index: int
    pool: BlockPool
    waiting: deque[_Member] = attrs.field(factory=deque)
    batch: list[_Member] | None = None  # the batch in flight
    wake_at: float | None = None  # a wake event waits for a fuller batch until then


class StaticBatchReplay(Replay):
    """One replay; :meth:`run_loop` processes events until the workload is exhausted."""

    def __init__(self, role: RoleArgs, options: StaticBatchOptions, timer: StepTimer,
                 workload: Workload, sink: Sink, progress: Progress | None) -> None:
        super().__init__(workload, sink, progress)
        self.role, self.options, self.timer = role, options, timer
        self.limit = options.max_batch_size or role.max_sequences
        self.workers = [_Worker(w, BlockPool(role.num_gpu_blocks, role.block_size))
                        for w in range(role.replicas)]
        self.dirty: list[_Worker] = []  # workers to start, if idle, once the instant settles
        self.next_worker = self.batches = self.batched = 0

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, _Member):  # its last token
            self._terminal(item.spec, "completed", self.now)
            return
        if isinstance(item, _Worker):  # its batch ended
            for member in item.batch or ():
                item.pool.release(member.lease)
            item.batch = None
        elif isinstance(item, tuple):  # ("wake", worker)
            item = item[1]
            item.wake_at = None
        else:  # an arrival, placed round-robin
            spec, item = item, self.workers[self.next_worker]
            self.next_worker = (self.next_worker + 1) % len(self.workers)
            item.waiting.append(_Member(spec, self._open(spec, decode_worker=item.index)))
        self.dirty.append(item)

    def _settle(self) -> None:
        dirty, self.dirty = self.dirty, []
        for worker in dirty:
            if worker.batch is None:
                self._start_batch(worker)

    def _start_batch(self, worker: _Worker) -> None:
        waiting, role, bs = worker.waiting, self.role, self.role.block_size
        if waiting and len(waiting) < self.limit and self.options.max_wait_ms > 0:
            due = waiting[0].spec.arrival_ms + self.options.max_wait_ms
            if self.now < due:
                if worker.wake_at != due:
                    worker.wake_at = due
                    self.events.push(due, PHASE_ENGINE, worker.index, ("wake", worker))
                return
        batch: list[_Member] = []
        cached: list[int] = []
        while waiting and len(batch) < self.limit:
            member, spec = waiting[0], waiting[0].spec
            total = spec.input_length + spec.output_length
            blocks = -(-total // bs)
            too_long = role.max_model_len is not None and total > role.max_model_len
            if too_long or blocks > worker.pool.num_blocks:
                waiting.popleft()
                self._terminal(spec, "rejected", self.now)
                continue
            reuse: list[int] = []
            if role.prefix_caching and spec.input_length > 1:
                hashes = block_hashes(spec.prompt, bs, limit=spec.input_length - 1)
                reuse = worker.pool.lookup(hashes, len(hashes))
            if not worker.pool.allocate(member.lease, blocks, reuse):
                break
            batch.append(waiting.popleft())
            cached.append(len(reuse) * bs)
        if batch:
            self._run_batch(worker, batch, cached)

    def _run_batch(self, worker: _Worker, batch: list[_Member], cached: list[int]) -> None:
        """Price the batch's passes, stamp its tokens and queue its ends (all known now)."""
        now, n, timer, role = self.now, len(batch), self.timer, self.role
        isl_sum = sum(m.spec.input_length for m in batch)
        t = prefilled = now + timer.prefill_ms(n, isl_sum / n, sum(cached) / n)
        for member, hit in zip(batch, cached, strict=True):
            rec, spec = member.record, member.spec
            rec.first_admit_ms = now
            rec.reused_input_tokens = rec.first_admission_reused_tokens = hit
            if spec.output_length > 0:
                rec.token_times.append(t)
            if role.prefix_caching:  # publish the complete prompt blocks
                hashes = block_hashes(spec.prompt, role.block_size, limit=spec.input_length)
                worker.pool.publish(member.lease, hashes, 0, spec.input_length // role.block_size)
        by_length = sorted(batch, key=lambda m: m.spec.output_length)
        longest, pad, first = by_length[-1].spec.output_length, self.options.pad_to_longest, 0
        for k in range(1, longest):  # decode step k: token k + 1 of each request that has one
            while by_length[first].spec.output_length <= k:
                first += 1
            alive = by_length[first:]
            size = n if pad else len(alive)
            kv = (isl_sum if pad else sum(m.spec.input_length for m in alive)) + size * k
            t += timer.decode_ms(size, kv, kv / size, role.num_gpu_blocks * role.block_size)
            for member in alive:
                member.record.token_times.append(t)
        for member in batch:
            times = member.record.token_times
            self.events.push(times[-1] if times else prefilled, PHASE_ENGINE,
                             member.spec.request_id, member)
        # the batch ends after its completions at the same instant (a key above every id)
        self.events.push(t, PHASE_ENGINE, 2**62 + worker.index, worker)
        worker.batch = batch
        self.passes += max(longest, 1)  # the prefill and the decode steps
        self.batches, self.batched = self.batches + 1, self.batched + n
