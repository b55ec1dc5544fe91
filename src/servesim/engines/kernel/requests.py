"""What a workload hands an engine, and what an engine hands the metrics collector.

Time is a float number of milliseconds of virtual time everywhere in servesim
(arrival, token and terminal times). Fixed and polynomial step times are exact
float expressions, so the same inputs always give the same floats.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, Protocol

from servesim.engines.kernel.tokens import Prompt, Segment, canonical

TerminalStatus = Literal["completed", "rejected", "incomplete"]


class RequestSpec:
    """One request as the workload defines it. The prompt is kept in canonical form (runs
    that continue each other are merged), so a request's cache identities depend on its
    tokens only, however the workload split them. Equal by value; not changed once made
    (its fields are ``Final``).

    A plain class, not an attrs one: the compiled build makes it native, so the replay
    reads its fields from the object's struct, not through attribute lookups."""

    __slots__ = ("arrival_ms", "extends", "input_length", "output_length", "prompt",
                 "request_id", "session_id", "turn_index")

    def __init__(self, request_id: int, arrival_ms: float, prompt: Sequence[Segment],
                 input_length: int, output_length: int, session_id: str | None = None,
                 turn_index: int = 0, extends: int = -1) -> None:
        self.request_id: Final = request_id  # dense, unique within a run
        self.arrival_ms: Final = arrival_ms
        self.prompt: Final[Prompt] = canonical(prompt)
        self.input_length: Final = input_length
        self.output_length: Final = output_length
        self.session_id: Final = session_id
        self.turn_index: Final = turn_index
        # A session turn whose workload built its prompt as request ``extends``'s prompt,
        # then its output (:func:`~servesim.engines.kernel.tokens.extend_prompt`); else -1.
        self.extends: Final = extends

    def _fields(self) -> tuple[object, ...]:
        return (self.request_id, self.arrival_ms, self.prompt, self.input_length,
                self.output_length, self.session_id, self.turn_index, self.extends)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestSpec):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return _repr(self, SPEC_FIELDS)

    def evolve(self, *, arrival_ms: float | None = None,
               output_length: int | None = None) -> RequestSpec:
        """A copy with another arrival or output length."""
        return RequestSpec(
            self.request_id, self.arrival_ms if arrival_ms is None else arrival_ms,
            self.prompt, self.input_length,
            self.output_length if output_length is None else output_length,
            self.session_id, self.turn_index, self.extends)


SPEC_FIELDS: tuple[str, ...] = ("request_id", "arrival_ms", "prompt", "input_length",
                                "output_length", "session_id", "turn_index", "extends")


def _repr(obj: object, fields: tuple[str, ...]) -> str:
    inner = ", ".join(f"{name}={getattr(obj, name)!r}" for name in fields)
    return f"{type(obj).__name__}({inner})"


class RequestRecord:
    """One request's outcome, produced by an engine once the request is terminal. Equal
    only to itself. (A plain class, native when compiled: see :class:`RequestSpec`.)"""

    __slots__ = (
        "arrival_ms",
        "decode_admit_ms",
        "decode_worker",
        "first_admission_reused_tokens",
        "first_admit_ms",
        "input_length",
        "kv_transfer_end_ms",
        "kv_transfer_start_ms",
        "num_preemptions",
        "pass_ends",
        "prefill_end_ms",
        "prefill_worker",
        "request_id",
        "requested_output_length",
        "reused_input_tokens",
        "session_id",
        "status",
        "terminal_ms",
        "token_times",
        "turn_index",
    )

    def __init__(self, request_id: int, arrival_ms: float, input_length: int,
                 requested_output_length: int, status: TerminalStatus,
                 token_times: array | None = None, session_id: str | None = None,
                 turn_index: int = 0, first_admit_ms: float | None = None,
                 terminal_ms: float | None = None, reused_input_tokens: int = 0,
                 first_admission_reused_tokens: int = 0, num_preemptions: int = 0,
                 prefill_worker: int | None = None, decode_worker: int | None = None,
                 pass_ends: array | None = None, prefill_end_ms: float | None = None,
                 kv_transfer_start_ms: float | None = None,
                 kv_transfer_end_ms: float | None = None,
                 decode_admit_ms: float | None = None) -> None:
        self.request_id = request_id
        self.arrival_ms = arrival_ms
        self.input_length = input_length
        self.requested_output_length = requested_output_length
        self.status: TerminalStatus = status
        # one entry per output token
        self.token_times: array = array("d") if token_times is None else token_times
        self.session_id = session_id
        self.turn_index = turn_index
        self.first_admit_ms = first_admit_ms
        self.terminal_ms = terminal_ms
        self.reused_input_tokens = reused_input_tokens  # max over admissions
        self.first_admission_reused_tokens = first_admission_reused_tokens
        self.num_preemptions = num_preemptions
        self.prefill_worker = prefill_worker
        self.decode_worker = decode_worker  # the aggregated worker in aggregated mode
        # The end times of every pass of the worker that stamped the tokens, shared by its
        # requests and growing (set by the built-in engines, None otherwise): when the
        # tokens are a run of consecutive passes, metrics count their gaps per pass, not
        # per token.
        self.pass_ends = pass_ends
        # Disaggregated handoff (set by the P/D engine, None otherwise): the end of the
        # prefill pass that completed the prompt, when its KV transfer started and ended on
        # the link, and the start of the decode pass that admitted it. With
        # ``first_admit_ms`` (the start of its first prefill pass) they split its TTFT
        # (``metrics.ttft_parts``).
        self.prefill_end_ms = prefill_end_ms
        self.kv_transfer_start_ms = kv_transfer_start_ms
        self.kv_transfer_end_ms = kv_transfer_end_ms
        self.decode_admit_ms = decode_admit_ms

    def __repr__(self) -> str:
        return _repr(self, RECORD_FIELDS)

    def evolve(self, **changes: Any) -> RequestRecord:
        """A copy with ``changes`` (field name -> value)."""
        fields: dict[str, Any] = {name: getattr(self, name) for name in RECORD_INIT}
        fields.update(changes)
        return RequestRecord(**fields)

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



RECORD_INIT: tuple[str, ...] = (
    "request_id", "arrival_ms", "input_length", "requested_output_length", "status",
    "token_times", "session_id", "turn_index", "first_admit_ms", "terminal_ms",
    "reused_input_tokens", "first_admission_reused_tokens", "num_preemptions",
    "prefill_worker", "decode_worker", "pass_ends", "prefill_end_ms",
    "kv_transfer_start_ms", "kv_transfer_end_ms", "decode_admit_ms")
# the fields a record's repr shows (its worker's pass ends are long and shared)
RECORD_FIELDS: tuple[str, ...] = tuple(name for name in RECORD_INIT if name != "pass_ends")

class Workload(Protocol):
    """A source of requests, possibly reacting to completions (closed loop, sessions)."""

    @property
    def max_time_ms(self) -> float | None:
        """Soft cutoff: events after it are not processed (trace ``max_virtual_time_seconds``)."""

    def start(self) -> Iterator[RequestSpec]:
        """Open-loop requests, lazily, in nondecreasing ``arrival_ms`` order."""

    def on_terminal(self, request: RequestSpec, time_ms: float) -> list[RequestSpec]:
        """Requests released because ``request`` ended at ``time_ms`` (arrival >= time_ms)."""
