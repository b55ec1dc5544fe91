"""Static batching, a run on servesim's replay base class (semantics: ``README.md``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from servesim.engines.base import Progress, Sink
from servesim.engines.kernel.events import PHASE_ENGINE
from servesim.engines.kernel.placement import Placement
from servesim.engines.kernel.prompt_cache import PromptCache
from servesim.engines.kernel.replay import Replay
from servesim.engines.kernel.requests import Workload
from servesim.engines.kernel.static_batch import BatchMember, BatchWorker
from servesim.payload import RoleArgs
from servesim.timing import StepTimer

if TYPE_CHECKING:
    from servesim_static_batch.engine import StaticBatchOptions


class StaticBatchReplay(Replay):
    """One replay; :meth:`run_loop` processes events until the workload is exhausted."""

    def __init__(self, role: RoleArgs, options: StaticBatchOptions, timer: StepTimer,
                 workload: Workload, sink: Sink, progress: Progress | None) -> None:
        super().__init__(workload, sink, progress)
        self.options, self.timer = options, timer
        self.limit = options.max_batch_size or role.max_sequences
        self.placement = Placement([BatchWorker(w, PromptCache.of(role))
                                    for w in range(role.replicas)])
        self.dirty: list[BatchWorker] = []  # workers to start, if idle, once the instant settles
        self.batches = self.batched = 0

    def _dispatch(self, item: Any) -> None:
        if isinstance(item, BatchMember):  # its last token
            self._terminal(item.spec, "completed", self.now)
            return
        if isinstance(item, BatchWorker):  # its batch ended
            item.finish()
        elif isinstance(item, tuple):  # ("wake", worker)
            item = item[1]
            item.wake_at = None
        else:  # an arrival, placed round-robin
            spec, item = item, self.placement.pick()
            item.waiting.append(BatchMember(spec, self._open(spec, decode_worker=item.index)))
        self.dirty.append(item)

    def _settle(self) -> None:
        dirty, self.dirty = self.dirty, []
        for worker in dirty:
            if worker.batch is None:
                self._start_batch(worker)

    def _start_batch(self, worker: BatchWorker) -> None:
        waiting = worker.waiting
        due = waiting[0].spec.arrival_ms + self.options.max_wait_ms if waiting else self.now
        if len(waiting) < self.limit and self.now < due:  # wait for a fuller batch
            if worker.wake_at != due:
                worker.wake_at = due
                self.events.push(due, PHASE_ENGINE, worker.index, ("wake", worker))
            return
        batch: list[BatchMember] = []
        while waiting and len(batch) < self.limit:
            head = waiting[0]
            tokens = head.spec.input_length + head.spec.output_length  # the whole sequence
            if not worker.kv.can_ever_hold(tokens):
                self._terminal(waiting.popleft().spec, "rejected", self.now)
                continue
            cached = worker.kv.reserve(head.spec, tokens, head.lease)
            if cached is None:
                break  # FIFO: nothing behind the head is admitted
            head.cached = cached
            batch.append(waiting.popleft())
        if batch:
            self._run_batch(worker, batch)

    def _run_batch(self, worker: BatchWorker, batch: list[BatchMember]) -> None:
        end, passes = worker.start(batch, self.now, self.timer, pad=self.options.pad_to_longest)
        for member in batch:
            self.events.push(member.done_ms, PHASE_ENGINE, member.spec.request_id, member)
        # the batch ends after its completions at the same instant (a key above every id)
        self.events.push(end, PHASE_ENGINE, 2**62 + worker.index, worker)
        self.passes += passes
        self.batches, self.batched = self.batches + 1, self.batched + len(batch)
