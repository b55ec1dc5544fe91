"""What a workload hands an engine, and what an engine hands the metrics collector.

Time is a float number of milliseconds of virtual time everywhere in servesim
(arrival, token and terminal times). Fixed and polynomial step times are exact
float expressions, so the same inputs always give the same floats.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from typing import Literal, Protocol

import attrs

from servesim.engines.kernel.tokens import Prompt, canonical

TerminalStatus = Literal["completed", "rejected", "incomplete"]


@attrs.frozen(slots=True)
class RequestSpec:
    """One request as the workload defines it. The prompt is kept in canonical form (runs
    that continue each other are merged), so a request's cache identities depend on its
    tokens only, however the workload split them."""

    request_id: int  # dense, unique within a run
    arrival_ms: float
    prompt: Prompt = attrs.field(converter=canonical)
    input_length: int
    output_length: int
    session_id: str | None = None
    turn_index: int = 0
    # A session turn whose workload built its prompt as request ``extends``'s prompt, then
    # its output (:func:`~servesim.engines.kernel.tokens.extend_prompt`); else -1.
    extends: int = -1


class PassEnds(array):
    """A worker's pass end times (``array('d')``), with a *floor*: the engine promises
    that no request in flight or still to come has a token at a pass ending before it
    (the arrival of its oldest request in flight), so the metrics may fold those passes
    and drop them from the front."""

    __slots__ = ("floor",)
    floor: float

    def __new__(cls) -> PassEnds:
        ends: PassEnds = super().__new__(cls, "d")  # type: ignore[assignment]
        ends.floor = float("-inf")
        return ends


@attrs.define(slots=True, eq=False)
class RequestRecord:
    """One request's outcome, produced by an engine once the request is terminal."""

    request_id: int
    arrival_ms: float
    input_length: int
    requested_output_length: int
    status: TerminalStatus
    token_times: array = attrs.field(factory=lambda: array("d"))  # one entry per output token
    session_id: str | None = None
    turn_index: int = 0
    first_admit_ms: float | None = None
    terminal_ms: float | None = None
    reused_input_tokens: int = 0  # max over admissions
    first_admission_reused_tokens: int = 0
    num_preemptions: int = 0
    prefill_worker: int | None = None
    decode_worker: int | None = None  # the aggregated worker in aggregated mode
    # The end times of every pass of the worker that stamped the tokens, shared by its
    # requests and growing (set by the built-in engines, None otherwise): when the tokens
    # are a run of consecutive passes, metrics count their gaps per pass, not per token.
    pass_ends: array | None = attrs.field(default=None, repr=False)
    # Disaggregated handoff (set by the P/D engine, None otherwise): the end of the prefill
    # pass that completed the prompt, when its KV transfer started and ended on the link,
    # and the start of the decode pass that admitted it. With ``first_admit_ms`` (the
    # start of its first prefill pass) they split its TTFT (``metrics.ttft_parts``).
    prefill_end_ms: float | None = None
    kv_transfer_start_ms: float | None = None
    kv_transfer_end_ms: float | None = None
    decode_admit_ms: float | None = None

    @property
    def output_length(self) -> int:
        return len(self.token_times)

    def admitted(self, time_ms: float, reused_tokens: int) -> None:
        """A scheduler admitted the request at ``time_ms`` with ``reused_tokens`` prompt
        tokens served from the prefix cache: the first admission sets ``first_admit_ms``
        and ``first_admission_reused_tokens``; ``reused_input_tokens`` keeps the most."""
        if self.first_admit_ms is None:
            self.first_admit_ms = time_ms
            self.first_admission_reused_tokens = reused_tokens
        if reused_tokens > self.reused_input_tokens:
            self.reused_input_tokens = reused_tokens


class Workload(Protocol):
    """A source of requests, possibly reacting to completions (closed loop, sessions)."""

    @property
    def max_time_ms(self) -> float | None:
        """Soft cutoff: events after it are not processed (trace ``max_virtual_time_seconds``)."""

    def start(self) -> Iterator[RequestSpec]:
        """Open-loop requests, lazily, in nondecreasing ``arrival_ms`` order."""

    def on_terminal(self, request: RequestSpec, time_ms: float) -> list[RequestSpec]:
        """Requests released because ``request`` ended at ``time_ms`` (arrival >= time_ms)."""
