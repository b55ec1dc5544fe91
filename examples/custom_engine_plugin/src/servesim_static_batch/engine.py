"""Static batching on servesim's shared kernel.

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

Time is float milliseconds of virtual time, as everywhere in servesim.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import attrs

from servesim.engines.base import Engine, Progress, ReplayResult, Sink, option
from servesim.engines.kernel.blocks import BlockPool
from servesim.engines.kernel.events import PHASE_ARRIVAL, PHASE_ENGINE, EventQueue
from servesim.engines.kernel.requests import (
    RequestRecord,
    RequestSpec,
    TerminalStatus,
    Workload,
)
from servesim.engines.kernel.tokens import block_hashes
from servesim.errors import Diagnostic, ReplayError
from servesim.payload import Payload, RoleArgs
from servesim.timing import StepTimer, make_timer

_PROGRESS_EVERY = 4096
_AFTER_REQUESTS = 2**62  # event key of a batch end: after every request id


@attrs.frozen
class StaticBatchOptions:
    """Options of the static-batch engine (``[engine.options]``)."""

    max_batch_size: int | None = option(
        None, lo=1, hi=2**20,
        help="requests per batch (default: the role's scheduler.max_sequences)")
    max_wait_ms: float = option(
        0.0, lo=0.0, hi=1e9,
        help="an idle worker waits up to this long for a full batch (0: start at once)")
    pad_to_longest: bool = option(
        True, help="finished requests stay in the batch as padding until it ends")


class StaticBatchEngine(Engine):
    """Static batching: fixed batches, whole-sequence KV reservation, no joins in flight."""

    NAME = "static-batch"
    MODES = ("aggregated",)
    DESCRIPTION = "static batching: a batch runs to its longest output before the next starts"
    Options = StaticBatchOptions

    def validate_payload(self, payload: Payload) -> list[Diagnostic]:
        out = super().validate_payload(payload)
        for name, role in payload.roles.items():
            path = ("engine", "workers", name)
            if role.attention_data != 1:
                out.append(Diagnostic(
                    code="static-batch-attention-dp", path=(*path, "parallelism",
                                                            "attention_data"),
                    message=f"static-batch runs one scheduler per worker; attention_data must "
                    f"be 1, got {role.attention_data}"))
            if role.speculation is not None or role.state_cache is not None:
                what = "speculative decoding" if role.speculation else "a state cache"
                out.append(Diagnostic(code="static-batch-feature", path=path,
                                      message=f"static-batch does not model {what}"))
        return out

    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        role = payload.roles["aggregated"]
        options: StaticBatchOptions = self.options(payload)
        run = StaticBatchReplay(role, options, make_timer(role), workload, sink, progress)
        run.run()
        seconds = run.now / 1000.0
        return ReplayResult(
            end_ms=run.now, gpu_seconds={"aggregated": seconds * role.gpus}, passes=run.passes,
            extra={"static_batch": {"batches": run.batches,
                                    "mean_batch_size": run.batched / run.batches
                                    if run.batches else 0.0}})


@attrs.define(eq=False)
class _Member:
    spec: RequestSpec
    record: RequestRecord
    lease: list[int] = attrs.field(factory=list)


@attrs.define(eq=False)
class _Worker:
    index: int
    pool: BlockPool
    waiting: deque[tuple[float, RequestSpec, RequestRecord]] = attrs.field(factory=deque)
    busy: bool = False
    wake_at: float | None = None
    batch: list[_Member] = attrs.field(factory=list)


@attrs.frozen
class _Done:
    member: _Member


@attrs.frozen
class _BatchEnd:
    worker: _Worker


@attrs.frozen
class _Wake:
    worker: _Worker


class StaticBatchReplay:
    """One replay; :meth:`run` processes events until the workload is exhausted."""

    def __init__(self, role: RoleArgs, options: StaticBatchOptions, timer: StepTimer,
                 workload: Workload, sink: Sink, progress: Callable[[float], None] | None
                 ) -> None:
        self.role, self.options, self.timer = role, options, timer
        self.workload, self.sink, self.progress = workload, sink, progress
        self.limit = options.max_batch_size or role.max_sequences
        self.workers = [_Worker(w, BlockPool(role.num_gpu_blocks, role.block_size))
                        for w in range(role.replicas)]
        self.events: EventQueue[_Done | _BatchEnd | _Wake | RequestSpec] = EventQueue()
        self.live: dict[int, RequestRecord] = {}
        self.dirty: list[_Worker] = []
        self.now = 0.0
        self.next_worker = 0
        self.passes = self.batches = self.batched = 0

    def run(self) -> None:
        cutoff = self.workload.max_time_ms
        arrivals: Iterator[RequestSpec] = iter(self.workload.start())
        lookahead = next(arrivals, None)
        iterations = 0
        while True:
            t = self.events.peek_time()
            if lookahead is not None and (t is None or lookahead.arrival_ms < t):
                t = lookahead.arrival_ms
            if t is None or (cutoff is not None and t > cutoff):
                break
            self.now = t
            while lookahead is not None and lookahead.arrival_ms <= t:
                self.events.push(lookahead.arrival_ms, PHASE_ARRIVAL, lookahead.request_id,
                                 lookahead)
                lookahead = next(arrivals, None)
            while (peek := self.events.peek_time()) is not None and peek <= t:
                _, _, item = self.events.pop()
                if isinstance(item, _Done):
                    self._complete(item.member)
                elif isinstance(item, _BatchEnd):
                    self._end_batch(item.worker)
                elif isinstance(item, _Wake):
                    item.worker.wake_at = None
                    self.dirty.append(item.worker)
                else:
                    self._arrive(item)
            dirty, self.dirty = self.dirty, []
            for worker in dirty:
                if not worker.busy:
                    self._start_batch(worker)
            iterations += 1
            if self.progress is not None and iterations % _PROGRESS_EVERY == 0:
                self.progress(self.now)
        self._flush_incomplete()
        if self.progress is not None:
            self.progress(self.now)

    # -- events -------------------------------------------------------------------------

    def _arrive(self, spec: RequestSpec) -> None:
        if spec.request_id in self.live:
            raise ReplayError([Diagnostic(
                code="workload-duplicate-id",
                message=f"request id {spec.request_id} arrived twice while in flight")])
        worker = self.workers[self.next_worker]
        self.next_worker = (self.next_worker + 1) % len(self.workers)
        record = RequestRecord(request_id=spec.request_id, arrival_ms=spec.arrival_ms,
                               input_length=spec.input_length,
                               requested_output_length=spec.output_length,
                               status="incomplete", session_id=spec.session_id,
                               turn_index=spec.turn_index, decode_worker=worker.index)
        self.live[spec.request_id] = record
        worker.waiting.append((self.now, spec, record))
        self.dirty.append(worker)

    def _start_batch(self, worker: _Worker) -> None:
        waiting, pool, role = worker.waiting, worker.pool, self.role
        if not waiting:
            return
        if len(waiting) < self.limit and self.options.max_wait_ms > 0:
            due = waiting[0][0] + self.options.max_wait_ms
            if self.now < due:
                if worker.wake_at != due:
                    worker.wake_at = due
                    self.events.push(due, PHASE_ENGINE, worker.index, _Wake(worker))
                return
        bs = role.block_size
        batch: list[_Member] = []
        cached: list[int] = []
        while waiting and len(batch) < self.limit:
            _, spec, record = waiting[0]
            total = spec.input_length + spec.output_length
            blocks = -(-total // bs)
            too_long = role.max_model_len is not None and total > role.max_model_len
            if too_long or blocks > pool.num_blocks:
                waiting.popleft()
                self._terminal(spec, record, "rejected", self.now)
                continue
            reuse: list[int] = []
            if role.prefix_caching and spec.input_length > 1:
                hashes = block_hashes(spec.prompt, bs, limit=spec.input_length - 1)
                reuse = pool.lookup(hashes, len(hashes))
            member = _Member(spec, record)
            if not pool.allocate(member.lease, blocks, reuse):
                break
            waiting.popleft()
            batch.append(member)
            cached.append(len(reuse) * bs)
        if not batch:
            return
        self._run_batch(worker, batch, cached)

    def _run_batch(self, worker: _Worker, batch: list[_Member], cached: list[int]) -> None:
        now, n, timer, role = self.now, len(batch), self.timer, self.role
        isl_sum = sum(m.spec.input_length for m in batch)
        t = prefilled = now + timer.prefill_ms(n, isl_sum / n, sum(cached) / n)
        self.passes += 1
        for member, hit in zip(batch, cached, strict=True):
            rec = member.record
            rec.first_admit_ms = now
            rec.reused_input_tokens = rec.first_admission_reused_tokens = hit
            if member.spec.output_length > 0:
                rec.token_times.append(t)
            if role.prefix_caching:
                full = member.spec.input_length // role.block_size
                hashes = block_hashes(member.spec.prompt, role.block_size,
                                      limit=member.spec.input_length)
                worker.pool.publish(member.lease, hashes, 0, full)
        # decode: step k emits token k + 1 of every request with more than k outputs
        by_length = sorted(batch, key=lambda m: m.spec.output_length)
        longest = by_length[-1].spec.output_length
        total_kv = role.num_gpu_blocks * role.block_size
        pad = self.options.pad_to_longest
        alive, alive_isl, first = n, isl_sum, 0  # requests still generating, from by_length[first]
        for k in range(1, longest):
            while by_length[first].spec.output_length <= k:
                alive_isl -= by_length[first].spec.input_length
                alive -= 1
                first += 1
            size, kv = (n, isl_sum + n * k) if pad else (alive, alive_isl + alive * k)
            t += timer.decode_ms(size, kv, kv / size, total_kv)
            self.passes += 1
            for member in by_length[first:]:
                member.record.token_times.append(t)
        for member in batch:
            times = member.record.token_times
            self.events.push(times[-1] if times else prefilled, PHASE_ENGINE,
                             member.spec.request_id, _Done(member))
        worker.busy = True
        worker.batch = batch
        # after the batch's completions at the same instant (keys order ties)
        self.events.push(t, PHASE_ENGINE, _AFTER_REQUESTS + worker.index, _BatchEnd(worker))
        self.batches += 1
        self.batched += n

    def _complete(self, member: _Member) -> None:
        self._terminal(member.spec, member.record, "completed", self.now)

    def _end_batch(self, worker: _Worker) -> None:
        for member in worker.batch:
            worker.pool.release(member.lease)
        worker.batch = []
        worker.busy = False
        self.dirty.append(worker)

    def _terminal(self, spec: RequestSpec, record: RequestRecord, status: TerminalStatus,
                  time_ms: float) -> None:
        record.status = status
        record.terminal_ms = time_ms
        del self.live[spec.request_id]
        self.sink(record)
        for follow in self.workload.on_terminal(spec, time_ms):
            self.events.push(follow.arrival_ms, PHASE_ARRIVAL, follow.request_id, follow)

    def _flush_incomplete(self) -> None:
        # tokens after the cutoff were never visible: drop them
        for request_id in sorted(self.live):
            record = self.live[request_id]
            times = record.token_times
            while times and times[-1] > self.now:
                times.pop()
            self.sink(record)
        self.live.clear()
