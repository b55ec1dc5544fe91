"""Mooncake JSONL traces, read lazily.

One JSON object per line (blank lines are skipped)::

    {"timestamp": 0, "input_length": 700, "output_length": 10, "hash_ids": [7, 8]}

``hash_ids`` are the prompt's blocks at the trace block size: each hash id stands for
``block_size`` tokens of its own (a distinct segment's, numbered so that hash ids first
seen one after another are consecutive tokens of one key); the prompt is truncated to
``input_length`` (default ``len(hash_ids) * block_size``). Rows with the same
``session_id`` form a session in file order; a later turn waits for the previous turn to
end, plus its delay (``delay`` / ``delay_ms``, else the timestamp difference to the
session's previous timestamp, else 0).

The reader never materialises token lists and keeps only what replay needs: the intern
table, rows read ahead of their turn, and per-session bookkeeping of sessions that still
have unread rows. Every problem is a :class:`~servesim.errors.WorkloadError` located at
``file:line``.
"""

from __future__ import annotations

import hashlib
import json
import json.scanner
import math
from collections import deque
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from servesim import codes, limits
from servesim.engines.kernel.tokens import Prompt, Segment, segment
from servesim.errors import Diagnostic, WorkloadError

# Trace times: a delay, or a timestamp after the first session's, spans at most the
# longest time a config may give (limits.SECONDS); a timestamp itself (often since the
# epoch) is at most 2**53 ms, where a float still counts every millisecond.
SPAN_MS = limits.SECONDS * 1000.0
TIMESTAMP_MS = float(limits.BIG)
# every key a row may hold (aliases included); any other key is refused, as a misspelt
# "input_len" would otherwise be replayed with the default length
ROW_KEYS = ("timestamp", "created_time", "input_length", "input_tokens", "output_length",
            "output_tokens", "output_token_ids", "hash_ids", "session_id", "delay", "delay_ms")
ROW_EXAMPLE = '{"timestamp": 0, "input_length": 700, "output_length": 10, "hash_ids": [7, 8]}'


@dataclass(slots=True, init=False)
class TraceRow:
    """One validated trace row (read-only by convention: the reader shares it with the
    workload). ``__init__`` is written out so that the compiled build runs it natively,
    not the generated (interpreted) one, once per row."""

    index: int  # 0-based among data rows: the request id
    line: int  # 1-based line number in the file
    session_id: str
    explicit_session: bool  # False: no session_id, a one-row session "request_<line>"
    turn_index: int
    prompt: Prompt  # this row's own hash-id expansion, truncated to input_length
    input_length: int
    output_length: int
    timestamp_ms: float | None
    delay_ms: float  # before this turn; 0 for a session's first turn

    def __init__(self, *, index: int, line: int, session_id: str, explicit_session: bool,
                 turn_index: int, prompt: Prompt, input_length: int, output_length: int,
                 timestamp_ms: float | None, delay_ms: float) -> None:
        self.index = index
        self.line = line
        self.session_id = session_id
        self.explicit_session = explicit_session
        self.turn_index = turn_index
        self.prompt = prompt
        self.input_length = input_length
        self.output_length = output_length
        self.timestamp_ms = timestamp_ms
        self.delay_ms = delay_ms


@dataclass(slots=True)
class _SessionState:
    turns_read: int
    last_timestamp: float | None
    remaining: int  # rows of the session not yet read


def trace_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a trace file's bytes (reproducibility provenance)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _session_key(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


MAX_LINE_BYTES = 64 * 1024 * 1024  # a row of millions of hash ids; a longer one is refused
MIXED = -1  # the count of a session_id written both as a number and as a string


def read_line(f: IO[bytes]) -> bytes | None:
    """The next line of ``f`` (``b""`` at the end), or ``None`` for a line over
    :data:`MAX_LINE_BYTES`, which is skipped to its end without being held in memory."""
    raw = f.readline(MAX_LINE_BYTES + 1)
    if len(raw) <= MAX_LINE_BYTES:
        return raw
    while raw and not raw.endswith(b"\n"):
        raw = f.readline(1 << 20)
    return None


def count_session_rows(path: Path) -> dict[str, int]:
    """Rows per explicit ``session_id`` (one streaming pass; malformed lines are skipped);
    :data:`MIXED` for an id written both as a number and as a string (``1`` and ``"1"``),
    which the reader refuses rather than merge two sessions."""
    counts: dict[str, int] = {}
    if not _mentions(path, (b"session_id", b"\\u")):
        return counts  # the usual trace: one request a row, found in one search of its bytes
    numbers: set[str] = set()  # ids written as numbers (rarely mixed with strings)
    strings: set[str] = set()
    with open(path, "rb") as f:
        while (raw := read_line(f)) != b"":
            if raw is None or (b"session_id" not in raw and b"\\u" not in raw):
                continue
            try:
                obj = json.loads(_text(raw))
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict) and "session_id" in obj:
                key = _session_key(obj["session_id"])
                if key is not None:
                    counts[key] = counts.get(key, 0) + 1
                    (strings if isinstance(obj["session_id"], str) else numbers).add(key)
    for key in numbers & strings:
        counts[key] = MIXED
    return counts


def _mentions(path: Path, needles: tuple[bytes, ...]) -> bool:
    """Whether the file holds any of ``needles`` (searched a megabyte at a time, each block
    with the end of the one before, so a needle across two blocks is found)."""
    keep = max(len(needle) for needle in needles) - 1
    with open(path, "rb") as f:
        tail = b""
        while chunk := f.read(1 << 20):
            block = tail + chunk
            for needle in needles:
                if needle in block:
                    return True
            tail = block[-keep:] if keep else b""
    return False


# The C scanner behind ``json.loads``, called directly: loads' wrappers (three Python
# frames and two regular-expression matches per line) cost a third as much as the scan.
_scan_once = json.scanner.make_scanner(cast(Any, json.JSONDecoder()))


def _text(raw: bytes) -> str:
    """``raw.decode("utf-8-sig")`` (a leading BOM dropped, as in configs), without the
    codec's Python-level function: a trace decodes every line."""
    return (raw[3:] if raw.startswith(b"\xef\xbb\xbf") else raw).decode("utf-8")


def _loads(text: str) -> Any:
    """``json.loads(text)`` for ``text`` without surrounding whitespace."""
    try:
        obj, end = _scan_once(text, 0)
    except StopIteration:  # no value at the start
        end = -1
    if end != len(text):
        return json.loads(text)  # raises, worded by json
    return obj


def _plain_ids(hash_ids: list[Any]) -> bool:
    """Whether ``hash_ids`` is a non-empty list of plain ints >= 0 (no bools)."""
    for h in hash_ids:
        if type(h) is not int or h < 0:
            return False
    return bool(hash_ids)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class MooncakeReader:
    """Streams a Mooncake trace in file order and hands out session starts and later turns.

    ``next_start()`` returns the next row that starts a session; ``next_row_of(sid)`` the
    next row of an already started session (``None`` once the session has no more rows).
    Both read the file only as far as needed. ``max_rows`` stops reading after that many
    data rows (a request-count stop).
    """

    def __init__(
        self,
        path: Path,
        display: str,
        block_size: int,
        *,
        require_timestamps: bool = False,
        max_rows: int | None = None,
        session_rows: Mapping[str, int] | None = None,
        keep_rows: bool = True,
    ) -> None:
        self._path = path
        self._display = display
        self._block_size = block_size
        self._require_timestamps = require_timestamps
        self._max_rows = max_rows
        self._session_rows: Mapping[str, int] = session_rows or {}
        self._keep_rows = keep_rows
        self._file: IO[bytes] | None = None
        self._eof = False
        self._line = 0
        self._rows = 0  # valid data rows returned
        self._data_lines = 0  # non-blank lines seen
        # hash id -> its tokens' place (key, offset of its first token); a key's tokens
        # end at _key_ends[key]
        self._units: dict[Any, tuple[int, int]] = {}
        self._key_ends: list[int] = []
        self._sessions: dict[str, _SessionState] = {}
        self._starts: deque[TraceRow] = deque()
        self._pending: dict[str, deque[TraceRow]] = {}
        self._last_start_ts: float | None = None
        self.origin_ms: float | None = None  # timestamp of the first session start

    # -- public -------------------------------------------------------------------------

    @property
    def display(self) -> str:
        return self._display

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._eof = True

    def next_start(self) -> TraceRow | None:
        while not self._starts:
            if not self._read_one():
                return None
        return self._starts.popleft()

    def next_row_of(self, session_id: str) -> TraceRow | None:
        while True:
            queue = self._pending.get(session_id)
            if queue:
                row = queue.popleft()
                if not queue:
                    del self._pending[session_id]
                return row
            if session_id not in self._sessions:
                return None  # every row of the session has been read
            if not self._read_one():
                return None

    def parse_next(self) -> TraceRow | None:
        """Read and validate the next data row (``None`` at the end of the file)."""
        while True:
            raw = self._next_line()
            if raw is None:
                return None
            if raw.strip():
                self._data_lines += 1
                return self._parse(raw)

    # -- reading ------------------------------------------------------------------------

    def _read_one(self) -> bool:
        try:
            row = self.parse_next()
        except WorkloadError:
            self.close()  # a replay stops at its first bad row
            raise
        if row is None:
            return False
        if self._keep_rows:
            if row.turn_index == 0:
                self._starts.append(row)
            else:
                self._pending.setdefault(row.session_id, deque()).append(row)
        return True

    def _next_line(self) -> bytes | None:
        if self._eof:
            return None
        if self._max_rows is not None and self._rows >= self._max_rows:
            self.close()
            return None
        if self._file is None:
            try:
                self._file = open(self._path, "rb")  # noqa: SIM115 - closed at EOF / close()
            except OSError as exc:
                raise WorkloadError([Diagnostic(
                    code=codes.TRACE_UNREADABLE, message=f"cannot read trace: {exc.strerror}",
                    location=self._display, hint=TRACE_HINT)]) from exc
        raw = read_line(self._file)
        if raw is None:
            self._line += 1
            raise self._error(codes.TRACE_BAD_ROW, f"the line is over {MAX_LINE_BYTES} bytes",
                              "split the row, or use a larger traffic.source.block_size (fewer "
                              "hash ids)")
        if not raw:
            empty = self._data_lines == 0
            line = max(self._line, 1)
            self.close()
            if empty:
                raise self._error(codes.TRACE_EMPTY, "the trace has no rows",
                                  f"add one JSON object per line, e.g. {ROW_EXAMPLE}", line)
            return None
        self._line += 1
        return raw

    def _error(self, code: str, message: str, hint: str | None = None,
               line: int | None = None) -> WorkloadError:
        where = f"{self._display}:{self._line if line is None else line}"
        return WorkloadError([Diagnostic(code=code, message=message, location=where, hint=hint)])

    # -- validation ---------------------------------------------------------------------

    def _parse(self, raw: bytes) -> TraceRow:
        try:
            obj = _loads(_text(raw.strip()))
        except UnicodeDecodeError as exc:
            if self._line == 1 and raw.startswith(b"\x1f\x8b"):
                raise self._error(codes.TRACE_BAD_JSON, "the file is gzip-compressed",
                                  "decompress it (gunzip) and name the .jsonl file") from exc
            raise self._error(codes.TRACE_BAD_JSON, "the line is not valid UTF-8",
                              "save the trace as UTF-8 text") from exc
        except json.JSONDecodeError as exc:
            raise self._error(codes.TRACE_BAD_JSON, f"invalid JSON: {exc.msg} (column {exc.colno})",
                              f"each line must be one JSON object, e.g. {ROW_EXAMPLE}") from exc
        except (ValueError, RecursionError) as exc:
            raise self._error(codes.TRACE_BAD_JSON, "invalid JSON",
                              f"each line must be one JSON object, e.g. {ROW_EXAMPLE}") from exc
        if not isinstance(obj, dict):
            raise self._error(codes.TRACE_BAD_ROW,
                              f"expected a JSON object, got {type(obj).__name__}",
                              f"each line must be one JSON object, e.g. {ROW_EXAMPLE}")
        row = self._validate(obj)
        self._rows += 1
        return row

    def _alias(self, obj: dict[str, Any], names: tuple[str, str]) -> tuple[str, Any] | None:
        first, second = names
        a = obj.get(first)
        b = obj.get(second)
        if b is None:
            return None if a is None else (first, a)
        if a is None:
            return (second, b)
        if a != b:
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"'{first}' ({_short(a)}) and '{second}' "
                              f"({_short(b)}) disagree",
                              f"keep only '{first}'")
        return (first, a)

    def _count(self, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"'{name}' must be a non-negative integer, got {_short(value)}",
                              f"set '{name}' to a whole number of tokens >= 0")
        return value

    def _millis(self, name: str, value: Any, hi: float) -> float:
        # (a tuple, not ``int | float``: the union would be built anew on every call)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        # (compared as given: an integer past a float's range is no error of ours)
        if ok and not (0 <= value <= hi and math.isfinite(value)):
            ok = False
        if not ok:
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"'{name}' must be a number of milliseconds from 0 to {hi:g}, "
                              f"got {_short(value)}",
                              f"set '{name}' to a number of milliseconds in that range")
        return float(value)

    def _validate(self, obj: dict[str, Any]) -> TraceRow:
        bs = self._block_size
        for key in obj:
            if key not in ROW_KEYS:
                self._unknown_key(key)
        # hash_ids
        hash_ids = obj.get("hash_ids")
        if hash_ids is None:
            raise self._error(codes.TRACE_MISSING_FIELD, "missing required field 'hash_ids'",
                              f"add \"hash_ids\": [...], the prompt's hash blocks at block "
                              f"size {bs}")
        if not isinstance(hash_ids, list):
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"'hash_ids' must be a list of non-negative integers, "
                              f"got {_short(hash_ids)}",
                              "write hash_ids as a JSON array of integers")
        if not _plain_ids(hash_ids):
            self._check_hash_ids(hash_ids)
        # output
        out_field = self._alias(obj, ("output_length", "output_tokens"))
        if out_field is None:
            raise self._error(codes.TRACE_MISSING_FIELD, "missing required field 'output_length'",
                              'add "output_length": <tokens to generate> (alias "output_tokens")')
        output_length = self._count(out_field[0], out_field[1])
        token_ids = obj.get("output_token_ids")
        if token_ids is not None:
            if not isinstance(token_ids, list):
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"'output_token_ids' must be a list, got {_short(token_ids)}",
                                  "write output_token_ids as a JSON array")
            if len(token_ids) != output_length:
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"'output_token_ids' has {len(token_ids)} entries but "
                                  f"output_length is {output_length}",
                                  "make output_length the number of output_token_ids")
        # input
        capacity = len(hash_ids) * bs
        in_field = self._alias(obj, ("input_length", "input_tokens"))
        input_length = capacity if in_field is None else self._count(in_field[0], in_field[1])
        if input_length > capacity:
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"input_length {input_length} exceeds hash_ids capacity "
                              f"{capacity} ({len(hash_ids)} hash_ids x block_size {bs})",
                              "lower input_length, add hash ids, or set "
                              "traffic.source.block_size to the trace's block size")
        if input_length == 0:
            raise self._error(codes.TRACE_BAD_FIELD, "the prompt is empty (input_length 0)",
                              "give the row at least one hash id and a positive input_length")
        needed = -(-input_length // bs)
        if len(hash_ids) > needed:  # a block size larger than the trace's merges prompts
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"{len(hash_ids)} hash_ids, but input_length {input_length} "
                              f"fills {needed} block(s) of block_size {bs}",
                              "set traffic.source.block_size to the tokens each hash id "
                              "stands for in this trace, or drop the extra hash ids")
        # timing
        ts_field = self._alias(obj, ("timestamp", "created_time"))
        timestamp = None if ts_field is None else self._millis(ts_field[0], ts_field[1],
                                                                  TIMESTAMP_MS)
        if timestamp is not None and self.origin_ms is not None \
                and timestamp - self.origin_ms > SPAN_MS:
            raise self._error(codes.TRACE_BAD_FIELD,
                              f"timestamp {timestamp:g} is more than {SPAN_MS:g} ms after the "
                              f"first session's start {self.origin_ms:g}",
                              "check the timestamps' unit (milliseconds)")
        delay_field = self._alias(obj, ("delay", "delay_ms"))
        delay = None if delay_field is None else self._millis(delay_field[0], delay_field[1],
                                                                  SPAN_MS)
        # session
        explicit = "session_id" in obj
        if explicit:
            sid = _session_key(obj["session_id"])
            if sid is None:
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"'session_id' must be a string or an integer, "
                                  f"got {_short(obj['session_id'])}",
                                  'write session_id as a string, e.g. "session_1"')
            if self._session_rows.get(sid) == MIXED:
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"session_id {sid} is written both as a number and as the "
                                  f"string \"{sid}\": two sessions, or one?",
                                  "write every session_id of a session the same way")
        else:
            sid = f"request_{self._line}"
            if sid in self._session_rows:
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"this row has no session_id, so its request is named "
                                  f"'{sid}', which another row gives as its session_id",
                                  "give this row a session_id of its own, or rename that "
                                  "session")
        state = self._sessions.get(sid) if explicit else None
        if state is None:
            turn = 0
            delay_ms = self._first_turn_timing(sid, timestamp, delay)
        else:
            turn = state.turns_read
            delay_ms = self._later_turn_delay(sid, state, timestamp, delay)
        # commit: interning and session bookkeeping happen only for valid rows
        prompt = self._prompt(hash_ids, input_length)
        if explicit:
            if state is None:
                state = _SessionState(0, None, self._session_rows.get(sid, 1))
                self._sessions[sid] = state
            state.turns_read += 1
            if timestamp is not None:
                state.last_timestamp = timestamp
            state.remaining -= 1
            if state.remaining <= 0:
                del self._sessions[sid]
        if turn == 0 and timestamp is not None:
            self._last_start_ts = timestamp
            if self.origin_ms is None:
                self.origin_ms = timestamp
        return TraceRow(index=self._rows, line=self._line, session_id=sid,
                        explicit_session=explicit, turn_index=turn,
                        prompt=prompt, input_length=input_length, output_length=output_length,
                        timestamp_ms=timestamp, delay_ms=delay_ms)

    def _unknown_key(self, key: str) -> None:
        import difflib  # (on first use: only a misspelt key needs it)

        close = difflib.get_close_matches(key, ROW_KEYS, n=1)
        known = f"a row holds only {', '.join(ROW_KEYS)}"
        raise self._error(codes.TRACE_UNKNOWN_KEY, f"unknown key {_short(key)}",
                          f"did you mean '{close[0]}'? ({known})" if close else known)

    def _check_hash_ids(self, hash_ids: list[Any]) -> None:
        for i, h in enumerate(hash_ids):
            if isinstance(h, bool) or not isinstance(h, int) or h < 0:
                raise self._error(codes.TRACE_BAD_FIELD,
                                  f"'hash_ids' must be a list of non-negative integers; "
                                  f"element {i} is {_short(h)}",
                                  "write hash_ids as a JSON array of integers >= 0")

    def _first_turn_timing(self, sid: str, timestamp: float | None,
                           delay: float | None) -> float:
        if delay:
            raise self._error(codes.TRACE_BAD_DELAY,
                              f"'delay' is {delay:g} on the first turn of session '{sid}'; a "
                              f"session's first turn starts at its timestamp",
                              "remove 'delay' from the session's first row (or set it to 0)")
        if timestamp is None:
            if self._require_timestamps:
                raise self._error(codes.TRACE_MISSING_FIELD,
                                  f"missing 'timestamp' on the first turn of session '{sid}'; "
                                  f"trace_timestamps load needs one",
                                  'add "timestamp": <ms>, or replay with concurrency load')
        elif self._last_start_ts is not None and timestamp < self._last_start_ts:
            raise self._error(codes.TRACE_UNSORTED,
                              f"timestamp {timestamp:g} is earlier than the previous session "
                              f"start {self._last_start_ts:g}",
                              "sort the trace rows by timestamp")
        return 0.0

    def _later_turn_delay(self, sid: str, state: _SessionState, timestamp: float | None,
                          delay: float | None) -> float:
        if delay is not None:
            return delay
        if timestamp is None:
            return 0.0
        if state.last_timestamp is None:
            raise self._error(codes.TRACE_BAD_DELAY,
                              f"cannot infer the delay of turn {state.turns_read + 1} of session "
                              f"'{sid}': it has a timestamp but no earlier turn has one",
                              "set 'delay' (ms) on this row, or give the earlier turns "
                              "timestamps")
        inferred = timestamp - state.last_timestamp
        if inferred < 0:
            raise self._error(codes.TRACE_BAD_DELAY,
                              f"timestamp {timestamp:g} is earlier than the previous timestamp "
                              f"{state.last_timestamp:g} of session '{sid}'",
                              "sort the session's rows by time, or set 'delay' (ms)")
        return inferred

    def _prompt(self, hash_ids: list[Any], input_length: int) -> Prompt:
        """The row's prompt, ``input_length`` tokens: each hash id stands for ``block_size``
        tokens of its own, numbered when the id is first seen. One first seen right after
        the last of a key's tokens continues that key, so a run of new hash ids (a new
        prompt, a session's next turn) is one distinct segment, which the engine's block
        bookkeeping handles as one run instead of one per hash id; one first seen twice
        in a row is ``block_size`` copies of one token, so its repeats merge into one
        segment. Equal hash-id prefixes give equal tokens and unequal ones unequal
        tokens, as the spec's synthesis (each interned id repeated ``block_size`` times)
        does: every prefix match is the same."""
        bs = self._block_size
        units = self._units
        ends = self._key_ends
        segments: list[Segment] = []
        key = -1  # the open segment: key's tokens start..end, or a repeat (start -1)
        start = end = 0
        left = input_length
        last = len(hash_ids) - 1
        for i in range(last + 1):
            h = hash_ids[i]  # (Any: the parsed ints are looked up as they are, not re-boxed)
            unit = units.get(h)
            if unit is None:
                if i < last and hash_ids[i + 1] == h:
                    unit = (len(ends), -1)
                    ends.append(-1)  # no id continues a repeat's key
                elif key >= 0 and ends[key] == end:
                    unit = (key, end)
                    ends[key] = end + bs
                else:
                    unit = (len(ends), 0)
                    ends.append(bs)
                units[h] = unit
            unit_key, offset = unit
            size = bs if left >= bs else left
            if unit_key == key and (offset == end or offset < 0):
                end += size
            else:
                if key >= 0:
                    segments.append(_segment_of(key, start, end))
                key, start, end = unit_key, offset, max(offset, 0) + size
            left -= bs
        segments.append(_segment_of(key, start, end))
        return tuple(segments)


def _segment_of(key: int, start: int, end: int) -> Segment:
    """Tokens ``start..end`` of ``key``, or (``start`` -1) ``end`` copies of token ``key``."""
    if start < 0:
        return segment(key, end)
    return segment(key, end - start, False, start)


def iter_trace_rows(path: Path, display: str, block_size: int, *,
                    require_timestamps: bool = False) -> Generator[TraceRow, None, None]:
    """All rows of a trace in file order (validated; raises on the first bad line)."""
    reader = MooncakeReader(path, display, block_size, require_timestamps=require_timestamps,
                            session_rows=count_session_rows(path), keep_rows=False)
    try:
        while (row := reader.parse_next()) is not None:
            yield row
    finally:
        reader.close()


TRACE_HINT = "check traffic.source.paths (a relative path is relative to the config file)"


def unreadable_trace(path: Path, shown: str) -> Diagnostic | None:
    """Why ``path`` (named ``shown``) cannot be read as a trace file, or ``None``."""
    try:
        if path.is_file():
            return None
        if path.is_dir():
            problem = "is a folder, expected a trace file"
        else:
            problem = "not a regular file" if path.exists() else "trace file not found"
    except OSError as exc:  # a name too long for a path, say
        problem = f"cannot read trace: {exc.strerror or exc}"
    return Diagnostic(code=codes.TRACE_UNREADABLE, message=problem, location=shown, hint=TRACE_HINT)


def validate_trace(
    path: str | Path,
    fmt: str = "mooncake",
    block_size: int = 512,
    *,
    require_timestamps: bool = False,
    display: str | None = None,
    max_diagnostics: int = 100,
) -> list[Diagnostic]:
    """Check every row of a trace upfront; return the problems (empty list = valid).

    Unlike a replay, which stops at the first bad row, this reports up to
    ``max_diagnostics`` problems, each located at ``file:line``.
    """
    shown = str(path) if display is None else display
    if fmt not in ("mooncake", "mooncake-delta"):
        return [Diagnostic(code=codes.BAD_WORKLOAD,
                           message=f"trace format {fmt!r} is not supported",
                           location=shown, hint="use 'mooncake' or 'mooncake-delta'")]
    file = Path(path)
    unreadable = unreadable_trace(file, shown)
    if unreadable:
        return [unreadable]
    reader = MooncakeReader(file, shown, block_size, require_timestamps=require_timestamps,
                            session_rows=count_session_rows(file), keep_rows=False)
    out: list[Diagnostic] = []
    try:
        while len(out) < max_diagnostics:
            try:
                if reader.parse_next() is None:
                    break
            except WorkloadError as exc:
                out.extend(exc.diagnostics)
    finally:
        reader.close()
    return out[:max_diagnostics]
