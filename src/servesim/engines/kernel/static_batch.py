"""Static batches: a prefill pass of all their requests, then decode steps of them together
until the longest output is done, nothing joining in flight.

:func:`run_static_batch` prices those passes with a step timer and stamps every token of
the batch when the batch starts: a static batch's passes depend on nothing that happens
while it runs, so the whole schedule is known then. An engine queues one event at each
request's :attr:`BatchMember.done_ms` (its last token) and one at the batch's end.
:class:`BatchWorker` is a worker running one such batch at a time, its KV in a
:class:`~servesim.engines.kernel.prompt_cache.PromptCache`.

The batch starting at ``now`` with ``n`` requests:

* its prefill pass costs ``prefill_ms(n, mean input length, mean cached prefix)`` and
  emits every request's first token at its end;
* decode step ``k`` (``k = 1 .. longest output - 1``) emits token ``k + 1`` of each request
  that has one; it costs ``decode_ms(size, kv, kv / size, capacity)`` where ``size`` is the
  number of requests still decoding and ``kv`` their prompts plus ``k`` tokens each.
  With ``pad`` a finished request stays in the batch as padding until the batch ends:
  ``size`` is ``n`` at every step and ``kv`` counts every prompt.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import attrs

from servesim.engines.kernel.blocks import Lease
from servesim.engines.kernel.prompt_cache import PromptCache
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.timing.base import StepTimer


@attrs.define(eq=False)
class BatchMember:
    """A request of a static batch: its spec, its live record, the KV blocks it holds and
    the prompt tokens it found cached when admitted (``PromptCache.reserve``)."""

    spec: RequestSpec
    record: RequestRecord
    lease: Lease = attrs.field(factory=Lease)
    cached: int = 0
    done_ms: float = 0.0  # when its last token is visible (its prefill's end without any)


def run_static_batch(batch: Sequence[BatchMember], now: float, timer: StepTimer, *,
                     pad: bool, capacity: int) -> tuple[float, int]:
    """Start ``batch`` (nonempty) at ``now``: stamp its admission and its tokens on the
    records, set each member's ``done_ms``; the batch's end time and its number of passes
    (the prefill and the decode steps). ``capacity`` is the KV tokens of the worker's pool
    (the timer's ``total_kv_tokens``)."""
    n = len(batch)
    isl_sum = sum(m.spec.input_length for m in batch)
    t = prefilled = now + timer.prefill_ms(n, isl_sum / n, sum(m.cached for m in batch) / n)
    for member in batch:
        member.record.admitted(now, member.cached)
        if member.spec.output_length > 0:
            member.record.token_times.append(t)
    by_length = sorted(batch, key=lambda m: m.spec.output_length)
    longest, first = by_length[-1].spec.output_length, 0
    for k in range(1, longest):  # decode step k: token k + 1 of each request that has one
        while by_length[first].spec.output_length <= k:
            first += 1
        alive = by_length[first:]
        size = n if pad else len(alive)
        kv = (isl_sum if pad else sum(m.spec.input_length for m in alive)) + size * k
        t += timer.decode_ms(size, kv, kv / size, capacity)
        for member in alive:
            member.record.token_times.append(t)
    for member in batch:
        times = member.record.token_times
        member.done_ms = times[-1] if times else prefilled
    return t, max(longest, 1)


@attrs.define(eq=False)
class BatchWorker:
    """A worker running one static batch at a time: its requests waiting in arrival order,
    its KV pool and the batch in flight. An engine may queue the worker itself as the event
    of its batch's end."""

    index: int
    kv: PromptCache
    waiting: deque[BatchMember] = attrs.field(factory=deque)
    batch: list[BatchMember] | None = None  # the batch in flight
    wake_at: float | None = None  # when a wake-up the engine queued for it is due

    def start(self, batch: list[BatchMember], now: float, timer: StepTimer, *,
              pad: bool) -> tuple[float, int]:
        """Run ``batch`` (admitted: its members hold their KV) from ``now``: its tokens are
        stamped (:func:`run_static_batch`) and its prompts' blocks published; the batch's
        end time and number of passes."""
        end, passes = run_static_batch(batch, now, timer, pad=pad,
                                       capacity=self.kv.capacity_tokens)
        for member in batch:
            self.kv.publish(member.spec, member.lease)
        self.batch = batch
        return end, passes

    def finish(self) -> None:
        """The batch in flight ended: its members' blocks return to the pool."""
        for member in self.batch or ():
            self.kv.release(member.lease)
        self.batch = None
