"""Trace sessions: the units of a Mooncake trace replay."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import Segment, extend_prompt, generated_key
from servesim.workloads.mooncake import MooncakeReader, TraceRow


@dataclass(slots=True, init=False)
class TraceSession:
    """A trace session; its later rows are read from the shared reader on demand.

    ``speedup`` divides timestamps (relative to the reader's origin) and delays. With
    ``delta`` (``mooncake-delta``) a later row holds only the new input: the prompt is the
    previous prompt, the previous output, then the row's tokens. ``__init__`` is written
    out so that the compiled build runs it natively (one per trace row).
    """

    first: TraceRow
    reader: MooncakeReader
    speedup: float
    delta: bool

    def __init__(self, first: TraceRow, reader: MooncakeReader, speedup: float = 1.0,
                 delta: bool = False) -> None:
        self.first = first
        self.reader = reader
        self.speedup = speedup
        self.delta = delta

    def _spec(self, row: TraceRow, arrival_ms: float,
              previous: RequestSpec | None) -> RequestSpec:
        prompt, length, extends = row.prompt, row.input_length, -1
        if self.delta and previous is not None:
            extends = previous.request_id
            prompt = extend_prompt(previous.prompt, (
                Segment(generated_key(previous.request_id), previous.output_length,
                        repeat=False),
                *row.prompt,
            ))
            length = previous.input_length + previous.output_length + row.input_length
        return RequestSpec(request_id=row.index, arrival_ms=arrival_ms, prompt=prompt,
                           input_length=length, output_length=row.output_length,
                           session_id=row.session_id, turn_index=row.turn_index,
                           extends=extends)

    def first_turn(self, arrival_ms: float | None) -> RequestSpec:
        if arrival_ms is None:
            origin = self.reader.origin_ms or 0.0
            ts = self.first.timestamp_ms
            arrival_ms = 0.0 if ts is None else (ts - origin) / self.speedup
        return self._spec(self.first, arrival_ms, None)

    def next_turn(self, previous: RequestSpec, end_ms: float) -> RequestSpec | None:
        if not self.first.explicit_session:
            return None
        row = self.reader.next_row_of(self.first.session_id)
        if row is None:
            return None
        return self._spec(row, end_ms + row.delay_ms / self.speedup, previous)


def trace_sessions(reader: MooncakeReader, *, speedup: float = 1.0,
                   delta: bool = False) -> Iterator[TraceSession]:
    """Sessions in the file order of their first rows."""
    while (row := reader.next_start()) is not None:
        yield TraceSession(row, reader, speedup, delta)
