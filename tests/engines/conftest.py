"""Helpers for engine tests: a list-backed workload and compact request/role builders."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pytest

from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Prompt, Segment, make_prompt, prompt_length
from servesim.engines.vllm import AggregatedReplay, RankScheduler, ReplayStats, SeqState
from servesim.payload import RoleArgs, TimingArgs
from servesim.timing import make_timer

P_MS = 10.0
D_MS = 1.0


@attrs.define
class ListWorkload:
    """Open-loop ``specs`` plus ``followups[id]``: requests released when ``id`` ends,
    with their ``arrival_ms`` taken as a delay after that terminal time."""

    specs: list[RequestSpec]
    followups: dict[int, list[RequestSpec]] = attrs.field(factory=dict)
    max_time_ms: float | None = None
    terminals: list[tuple[int, float]] = attrs.field(factory=list)

    def start(self) -> Iterator[RequestSpec]:
        return iter(sorted(self.specs, key=lambda s: (s.arrival_ms, s.request_id)))

    def on_terminal(self, request: RequestSpec, time_ms: float) -> list[RequestSpec]:
        self.terminals.append((request.request_id, time_ms))
        return [
            s.evolve(arrival_ms=time_ms + s.arrival_ms)
            for s in self.followups.get(request.request_id, [])
        ]


class GroupTimer:
    """Fixed halves (prefill 10 ms, decode 1 ms), but a prefill half priced together with
    the other attention-DP ranks' prompt tokens costs 10 ms plus 1 ms per group token."""

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return 10.0 if batch else 0.0

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        return 10.0 + group_tokens if batch else 0.0

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        return 1.0 if batch else 0.0


class Sim:
    """Builders shared by the engine tests (exposed through the ``sim`` fixture)."""

    P = P_MS
    D = D_MS
    ListWorkload = ListWorkload

    @staticmethod
    def role(**kw: Any) -> RoleArgs:
        timing = kw.pop("timing", TimingArgs(type="fixed", prefill_ms=P_MS, decode_ms=D_MS))
        base: dict[str, Any] = {
            "worker_type": "aggregated",
            "backend": "vllm",
            "model": "test-model",
            "hardware": "test-gpu",
            "block_size": 4,
            "num_gpu_blocks": 64,
        }
        base.update(kw)
        return RoleArgs(timing=timing, **base)

    @staticmethod
    def prompt(*parts: int | tuple[int, int]) -> Prompt:
        """``(key, n)`` = n distinct tokens of ``key``; an int ``key`` = 4 distinct tokens."""
        segs = []
        for part in parts:
            key, n = (part, 4) if isinstance(part, int) else part
            segs.append(Segment(key, n, repeat=False))
        return make_prompt(segs)

    @staticmethod
    def spec(
        rid: int, prompt: Prompt | int, out: int, arrival: float = 0.0, **kw: Any
    ) -> RequestSpec:
        if isinstance(prompt, int):  # unique prompt of that many tokens
            prompt = make_prompt([Segment(10_000 + rid, prompt, repeat=False)])
        return RequestSpec(
            request_id=rid,
            arrival_ms=arrival,
            prompt=prompt,
            input_length=prompt_length(prompt),
            output_length=out,
            **kw,
        )

    @staticmethod
    def rank(role: RoleArgs | None = None, **kw: Any) -> RankScheduler:
        """A lone rank scheduler of ``role`` (default: ``Sim.role(**kw)``)."""
        role = role if role is not None else Sim.role(**kw)
        return RankScheduler(role, make_timer(role))

    @staticmethod
    def submit(rank: RankScheduler, spec: RequestSpec) -> SeqState:
        """Queue ``spec`` on ``rank`` with a fresh record; its scheduler state."""
        record = RequestRecord(request_id=spec.request_id, arrival_ms=spec.arrival_ms,
                               input_length=spec.input_length,
                               requested_output_length=spec.output_length, status="incomplete")
        seq = rank.new_seq(spec, record)
        rank.submit(seq)
        return seq

    @staticmethod
    def run(
        role: RoleArgs,
        specs: Sequence[RequestSpec] | ListWorkload,
        *,
        check: bool = True,
    ) -> tuple[dict[int, RequestRecord], ReplayStats, AggregatedReplay]:
        workload = specs if isinstance(specs, ListWorkload) else ListWorkload(list(specs))
        records: dict[int, RequestRecord] = {}

        def sink(record: RequestRecord) -> None:
            assert record.request_id not in records, "a request reached the sink twice"
            records[record.request_id] = record

        replay = AggregatedReplay(role, make_timer(role), workload, sink, None)
        stats = replay.run()
        if check:
            for worker in replay.workers:
                for rank in worker.ranks:
                    rank.pool.check()
        return records, stats, replay


@pytest.fixture
def sim() -> type[Sim]:
    return Sim

