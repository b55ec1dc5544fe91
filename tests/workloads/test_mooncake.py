from __future__ import annotations

import hashlib
import json
import os
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servesim.engines.kernel.tokens import Segment, block_hashes, generated_key, prompt_length
from servesim.errors import WorkloadError
from servesim.workloads import build_workload, iter_trace_rows, trace_sha256, validate_trace
from servesim.workloads.mooncake import MIXED, count_session_rows

Simulate = Callable[..., Any]
WriteTrace = Callable[..., Path]
REPO = Path(__file__).resolve().parents[2]


def trace_spec(load: dict[str, Any] | None = None, stop: dict[str, Any] | None = None,
               **source: Any) -> dict[str, Any]:
    src = {"type": "trace", "path": "trace.jsonl", "format": "mooncake", "block_size": 512}
    src.update(source)
    return {"source": src, "load": load or {"type": "trace_timestamps", "speedup": 1.0},
            "stop": stop or {}}


def rows_of(path: Path, block_size: int = 512) -> list[Any]:
    return list(iter_trace_rows(path, path.name, block_size))


# -- spec §9 case 52 ---------------------------------------------------------------------------


def test_case_52_hash_ids_expand_at_the_trace_block_size(write_trace: WriteTrace) -> None:
    path = write_trace([{"hash_ids": [7, 8], "input_length": 700, "output_length": 10}])
    (row,) = rows_of(path)
    assert prompt_length(row.prompt) == row.input_length == 700 and row.output_length == 10
    path = write_trace([{"hash_ids": [7, 8], "output_length": 10}])
    (row,) = rows_of(path)
    assert row.input_length == prompt_length(row.prompt) == 1024
    path = write_trace([{"hash_ids": [7, 8], "input_length": 1100, "output_length": 10}])
    with pytest.raises(WorkloadError, match="exceeds hash_ids capacity"):
        rows_of(path)


# -- parsing ---------------------------------------------------------------------------------


def test_hash_ids_are_interned_in_first_seen_order_across_rows(write_trace: WriteTrace) -> None:
    path = write_trace([
        {"hash_ids": [70, 80], "output_length": 1},
        {"hash_ids": [70, 90, 70], "input_length": 1100, "output_length": 1},
    ])
    first, second = rows_of(path)
    # new hash ids one after another are consecutive tokens of one key: one segment
    assert first.prompt == (Segment(0, 1024, False),)
    assert second.prompt == (Segment(0, 512, False), Segment(1, 512, False),
                             Segment(0, 76, False))
    assert prompt_length(second.prompt) == 1100


def engine_blocks(prompt: tuple[Segment, ...]) -> list[int]:
    return block_hashes(prompt, 64)


def shared_blocks(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))


def test_prompts_share_exactly_their_common_hash_id_prefix(write_trace: WriteTrace) -> None:
    # spec: each hash id is block_size tokens of its own, so two rows' prompts agree
    # token for token as far as their hash ids agree, and no further
    rows = [[1, 2, 3], [1, 2], [1, 2, 4], [2, 3], [1, 2, 3, 5], [4], [1, 1, 1], [1, 1],
            [3, 5], [1, 2, 3, 5, 6], [7, 7, 7], [7], [7, 7, 1], [1, 7, 7], [7, 8], [8, 7]]
    path = write_trace([{"hash_ids": ids, "output_length": 1} for ids in rows])
    parsed = rows_of(path)
    blocks = [engine_blocks(row.prompt) for row in parsed]
    for i, a in enumerate(rows):
        for j, b in enumerate(rows):
            common = shared_blocks(a, b)  # hash ids in common at the start
            assert shared_blocks(blocks[i], blocks[j]) == common * 512 // 64, (a, b)
    # a block boundary inside a hash id's tokens, and a truncated last hash id
    path = write_trace([{"hash_ids": ids, "input_length": 1000, "output_length": 1}
                        for ids in ([1, 2], [1, 3], [1, 2])])
    first, other, again = (block_hashes(row.prompt, 96) for row in rows_of(path))
    assert first == again and shared_blocks(first, other) == 512 // 96


def test_a_byte_order_mark_is_dropped_and_bad_utf8_is_named(tmp_path: Path) -> None:
    row = {"hash_ids": [1], "input_length": 10, "output_length": 3, "session_id": "s"}
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n"
                     + b"\xef\xbb\xbf" + json.dumps(row).encode() + b"\n")
    first, second = rows_of(path)
    assert (first.input_length, second.session_id) == (10, "s")
    path.write_bytes(json.dumps(row).encode() + b"\n\xef\xbb\n")
    with pytest.raises(WorkloadError, match=r"bom.jsonl:2: the line is not valid UTF-8"):
        rows_of(path)


def test_aliases_and_blank_lines(write_trace: WriteTrace) -> None:
    path = write_trace([
        {"hash_ids": [1], "input_tokens": 10, "output_tokens": 3, "created_time": 5},
        "",
        "   ",
        {"hash_ids": [2], "input_length": 4, "output_length": 2, "timestamp": 9,
         "output_token_ids": [11, 12]},
    ])
    a, b = rows_of(path)
    assert (a.input_length, a.output_length, a.timestamp_ms, a.line) == (10, 3, 5.0, 1)
    assert (b.input_length, b.output_length, b.timestamp_ms, b.line) == (4, 2, 9.0, 4)
    assert (a.index, b.index) == (0, 1)
    assert (a.session_id, b.session_id) == ("request_1", "request_4")


def test_timestamps_are_normalised_to_zero_and_divided_by_speedup(
        write_trace: WriteTrace, tmp_path: Path) -> None:
    write_trace([{"timestamp": 1000, "hash_ids": [1], "output_length": 1},
                 {"timestamp": 1500, "hash_ids": [2], "output_length": 1},
                 {"timestamp": 3000, "hash_ids": [3], "output_length": 1}])
    w = build_workload(trace_spec(), base_dir=tmp_path)
    assert [s.arrival_ms for s in w.start()] == [0.0, 500.0, 2000.0]
    w = build_workload(trace_spec({"type": "trace_timestamps", "speedup": 4.0}),
                       base_dir=tmp_path)
    specs = list(w.start())
    assert [s.arrival_ms for s in specs] == [0.0, 125.0, 500.0]
    assert [s.request_id for s in specs] == [0, 1, 2]
    assert [s.session_id for s in specs] == ["request_1", "request_2", "request_3"]
    assert w.on_terminal(specs[0], 50.0) == []


def session_rows() -> list[dict[str, Any]]:
    return [
        {"session_id": "a", "timestamp": 100, "hash_ids": [1], "input_length": 8,
         "output_length": 2},
        {"session_id": "b", "timestamp": 110, "hash_ids": [2], "input_length": 8,
         "output_length": 2},
        {"session_id": "a", "timestamp": 160, "hash_ids": [1, 3], "input_length": 520,
         "output_length": 2},  # inferred delay 60
        {"session_id": "b", "delay": 7, "timestamp": 999, "hash_ids": [2, 4],
         "input_length": 600, "output_length": 2},  # explicit delay wins
        {"session_id": "a", "hash_ids": [1, 3, 5], "input_length": 1030,
         "output_length": 2},  # no timing: delay 0
        {"session_id": 7, "timestamp": 200, "hash_ids": [9], "output_length": 1},
    ]


def test_sessions_group_rows_in_file_order_with_delays(
        write_trace: WriteTrace, tmp_path: Path, simulate: Simulate) -> None:
    write_trace(session_rows())
    w = build_workload(trace_spec(), base_dir=tmp_path)
    served = simulate(w, service_ms=10.0)
    got = [(s.request_id, s.session_id, s.turn_index, s.arrival_ms) for s, _ in served]
    assert got == [
        (0, "a", 0, 0.0),  # normalised: 100 -> 0
        (1, "b", 0, 10.0),
        (3, "b", 1, 20.0 + 7.0),  # turn 0 ends at 20, + explicit delay (timestamp ignored)
        (2, "a", 1, 10.0 + 60.0),  # turn 0 ends at 10, + timestamp difference 160 - 100
        (4, "a", 2, 80.0),  # no delay, no timestamp: right after turn 1 ends
        (5, "7", 0, 100.0),  # integer session id, timestamp 200
    ]
    by_id = {s.request_id: s for s, _ in served}
    # full prompt per row; the session's new hash ids continue its tokens
    assert by_id[2].prompt == (Segment(0, 520, False),)
    assert by_id[4].prompt == (Segment(0, 1030, False),)
    assert by_id[5].session_id == "7"


def test_sessions_and_speedup(write_trace: WriteTrace, tmp_path: Path,
                              simulate: Simulate) -> None:
    write_trace(session_rows())
    w = build_workload(trace_spec({"type": "trace_timestamps", "speedup": 2.0}),
                       base_dir=tmp_path)
    served = {s.request_id: (s, end) for s, end in simulate(w, service_ms=10.0)}
    assert served[1][0].arrival_ms == 5.0
    assert served[2][0].arrival_ms == 10.0 + 30.0
    assert served[3][0].arrival_ms == 15.0 + 3.5
    assert served[5][0].arrival_ms == 50.0


def test_concurrency_replays_rows_in_file_order_closed_loop(
        write_trace: WriteTrace, tmp_path: Path, simulate: Simulate) -> None:
    write_trace([{"timestamp": 50 * i, "hash_ids": [i], "output_length": 1} for i in range(5)])
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 2}), base_dir=tmp_path)
    served = simulate(w, service_ms=lambda s: 10.0 + s.request_id)
    assert [(s.request_id, s.arrival_ms) for s, _ in served] == [
        (0, 0.0), (1, 0.0), (2, 10.0), (3, 11.0), (4, 22.0)]


def test_concurrency_with_sessions_releases_the_next_session_when_one_ends(
        write_trace: WriteTrace, tmp_path: Path, simulate: Simulate) -> None:
    write_trace(session_rows())
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 1}), base_dir=tmp_path)
    served = simulate(w, service_ms=10.0)
    got = [(s.session_id, s.turn_index, s.arrival_ms) for s, _ in served]
    assert got == [
        ("a", 0, 0.0), ("a", 1, 70.0), ("a", 2, 80.0),  # delays still apply
        ("b", 0, 90.0), ("b", 1, 107.0),
        ("7", 0, 117.0),
    ]


def test_request_stop_and_max_virtual_time(write_trace: WriteTrace, tmp_path: Path,
                                          simulate: Simulate) -> None:
    write_trace([{"timestamp": 100 * i, "hash_ids": [i], "output_length": 1}
                 for i in range(10)])
    with build_workload(trace_spec(stop={"max_virtual_time_seconds": 0.35}),
                        base_dir=tmp_path) as w:
        assert w.max_time_ms == 350.0
        assert [s.arrival_ms for s in w.start()] == [0.0, 100.0, 200.0, 300.0]
    with build_workload(trace_spec(stop={"max_virtual_time_seconds": 0.3}),
                        base_dir=tmp_path) as w:
        assert [s.arrival_ms for s in w.start()] == [0.0, 100.0, 200.0, 300.0]  # inclusive
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 2},
                                  stop={"requests": 3}), base_dir=tmp_path)
    assert [s.request_id for s, _ in simulate(w)] == [0, 1, 2]


def test_mooncake_delta_appends_previous_output_and_the_new_rows(
        write_trace: WriteTrace, tmp_path: Path, simulate: Simulate) -> None:
    write_trace([
        {"session_id": "s", "timestamp": 0, "hash_ids": [1], "input_length": 100,
         "output_length": 5},
        {"session_id": "s", "delay": 1, "hash_ids": [2], "input_length": 20,
         "output_length": 5},
    ])
    w = build_workload(trace_spec(format="mooncake-delta"), base_dir=tmp_path)
    (t0, _), (t1, _) = simulate(w)
    assert t0.input_length == 100 and t0.prompt == (Segment(0, 100, False),)
    assert t1.input_length == 100 + 5 + 20
    assert t1.prompt == (Segment(0, 100, False), Segment(generated_key(0), 5, repeat=False),
                         Segment(1, 20, False))
    assert (t0.extends, t1.extends) == (-1, 0)


def test_rows_are_read_lazily_and_errors_surface_mid_replay_with_location(
        write_trace: WriteTrace, tmp_path: Path) -> None:
    write_trace([{"timestamp": i, "hash_ids": [i], "output_length": 1} for i in range(3)]
                + ["{oops"])
    it = build_workload(trace_spec(), base_dir=tmp_path).start()
    assert [next(it).request_id for _ in range(3)] == [0, 1, 2]
    with pytest.raises(WorkloadError) as info:
        next(it)
    assert info.value.diagnostics[0].location == "trace.jsonl:4"
    assert str(info.value).startswith("trace.jsonl:4: invalid JSON")


def test_error_reached_while_looking_for_a_later_turn_carries_its_location(
        write_trace: WriteTrace, tmp_path: Path) -> None:
    write_trace([{"session_id": "s", "timestamp": 0, "hash_ids": [1], "output_length": 1},
                 {"session_id": "t", "timestamp": 1, "hash_ids": [1], "output_length": -1},
                 {"session_id": "s", "hash_ids": [1], "output_length": 1}])
    w = build_workload(trace_spec(), base_dir=tmp_path)
    first = next(iter(w.start()))
    with pytest.raises(WorkloadError) as info:
        w.on_terminal(first, 5.0)
    assert info.value.diagnostics[0].location == "trace.jsonl:2"


def test_large_trace_is_streamed() -> None:
    path = REPO / "bench" / "traces" / "mooncake_conversation.jsonl"
    w = build_workload(trace_spec(path=str(path.relative_to(REPO))), base_dir=REPO)
    it = w.start()
    first = [next(it) for _ in range(5)]
    assert first[0].input_length == 6758 and first[0].output_length == 500
    assert first[0].prompt == (Segment(0, 6758, False),)  # 14 new hash ids: one segment
    w.close()


def test_whole_conversation_trace_replays_in_bounded_memory() -> None:
    # 12,031 rows, prompts up to 126k tokens: as token lists this would take gigabytes
    path = REPO / "bench" / "traces" / "mooncake_conversation.jsonl"
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 64},
                                  path=str(path.relative_to(REPO))), base_dir=REPO)
    tracemalloc.start()
    try:
        count = 0
        pending = list(w.start())  # the 64 initial requests
        while pending:
            done = pending.pop()
            count += 1
            pending.extend(w.on_terminal(done, done.arrival_ms + 1.0))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert count == 12031
    assert peak < 100 * 2**20


# -- errors ------------------------------------------------------------------------------------

ERRORS: list[tuple[list[Any], int, str]] = [
    (["not json"], 1, "invalid JSON: Expecting value (column 1)"),
    ([{"hash_ids": [1], "output_length": 1}, '{"hash_ids": [1'], 2,
     "invalid JSON: Expecting ',' delimiter (column 16)"),
    (['{"hash_ids": [1], "output_length": 1} 7'], 1, "invalid JSON: Extra data (column 39)"),
    (["[1, 2]"], 1, "expected a JSON object, got list"),
    ([{"output_length": 1}], 1, "missing required field 'hash_ids'"),
    ([{"hash_ids": [1]}], 1, "missing required field 'output_length'"),
    ([{"hash_ids": "abc", "output_length": 1}], 1,
     "'hash_ids' must be a list of non-negative integers, got 'abc'"),
    ([{"hash_ids": [1, "x"], "output_length": 1}], 1,
     "'hash_ids' must be a list of non-negative integers; element 1 is 'x'"),
    ([{"hash_ids": [1, -3], "output_length": 1}], 1,
     "'hash_ids' must be a list of non-negative integers; element 1 is -3"),
    ([{"hash_ids": [1], "output_length": -1}], 1,
     "'output_length' must be a non-negative integer, got -1"),
    ([{"hash_ids": [1], "output_tokens": True}], 1,
     "'output_tokens' must be a non-negative integer, got True"),
    ([{"hash_ids": [1], "output_length": 1, "input_length": 7.5}], 1,
     "'input_length' must be a non-negative integer, got 7.5"),
    ([{"hash_ids": [1], "output_length": 1, "input_length": -5}], 1,
     "'input_length' must be a non-negative integer, got -5"),
    # numbers past what a float holds, or a replay could take
    ([{"hash_ids": [1], "output_length": 1, "input_length": 10**309}], 1,
     "input_length " + "1" + "0" * 309 + " exceeds hash_ids capacity 512 (1 hash_ids x "
     "block_size 512)"),
    ([{"hash_ids": [1], "output_length": 1, "timestamp": 10**309}], 1,
     "'timestamp' must be a number of milliseconds from 0 to 9.0072e+15, got "
     + "1" + "0" * 56 + "..."),
    ([{"hash_ids": [1], "output_length": 1, "session_id": "s", "timestamp": 0},
      {"hash_ids": [1], "output_length": 1, "session_id": "s", "delay": 10**309}], 2,
     "'delay' must be a number of milliseconds from 0 to 1e+12, got "
     + "1" + "0" * 56 + "..."),
    ([{"hash_ids": [7, 8], "output_length": 1, "input_length": 1100}], 1,
     "input_length 1100 exceeds hash_ids capacity 1024 (2 hash_ids x block_size 512)"),
    ([{"hash_ids": [], "output_length": 1}], 1, "the prompt is empty (input_length 0)"),
    # a traffic.source.block_size larger than the trace's: each id would cover whole prompts
    ([{"hash_ids": [7, 8, 9], "output_length": 1, "input_length": 1000}], 1,
     "3 hash_ids, but input_length 1000 fills 2 block(s) of block_size 512"),
    ([{"hash_ids": [1], "output_length": 2, "output_token_ids": [5]}], 1,
     "'output_token_ids' has 1 entries but output_length is 2"),
    ([{"hash_ids": [1], "output_length": 2, "output_tokens": 3}], 1,
     "'output_length' (2) and 'output_tokens' (3) disagree"),
    ([{"hash_ids": [1], "output_length": 1, "session_id": [1]}], 1,
     "'session_id' must be a string or an integer, got [1]"),
    ([{"hash_ids": [1], "output_length": 1, "timestamp": -1}], 1,
     "'timestamp' must be a number of milliseconds from 0 to 9.0072e+15, got -1"),
    ([{"hash_ids": [1], "output_length": 1, "timestamp": "soon"}], 1,
     "'timestamp' must be a number of milliseconds from 0 to 9.0072e+15, got 'soon'"),
    ([{"timestamp": 10, "hash_ids": [1], "output_length": 1},
      {"timestamp": 5, "hash_ids": [1], "output_length": 1}], 2,
     "timestamp 5 is earlier than the previous session start 10"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": "s"},
      {"delay": -1, "hash_ids": [1], "output_length": 1, "session_id": "s"}], 2,
     "'delay' must be a number of milliseconds from 0 to 1e+12, got -1"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": "s"},
      '{"delay_ms": NaN, "hash_ids": [1], "output_length": 1, "session_id": "s"}'], 2,
     "'delay_ms' must be a number of milliseconds from 0 to 1e+12, got nan"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": "s"},
      '{"delay": Infinity, "hash_ids": [1], "output_length": 1, "session_id": "s"}'], 2,
     "'delay' must be a number of milliseconds from 0 to 1e+12, got inf"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": "s"},
      {"delay": 1e308, "hash_ids": [1], "output_length": 1, "session_id": "s"}], 2,
     "'delay' must be a number of milliseconds from 0 to 1e+12, got 1e+308"),
    ([{"hash_ids": [1], "output_length": 1, "timestamp": 2.0**60}], 1,
     "'timestamp' must be a number of milliseconds from 0 to 9.0072e+15, got "
     "1.152921504606847e+18"),
    ([{"timestamp": 1.7e12, "hash_ids": [1], "output_length": 1},
      {"timestamp": 1.7e12 + 2e12, "hash_ids": [1], "output_length": 1}], 2,
     "timestamp 3.7e+12 is more than 1e+12 ms after the first session's start 1.7e+12"),
    ([{"timestamp": 0, "delay": 5, "hash_ids": [1], "output_length": 1, "session_id": "s1"}],
     1, "'delay' is 5 on the first turn of session 's1'; a session's first turn starts at "
        "its timestamp"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1, "session_id": "s"},
      {"timestamp": 9, "hash_ids": [1], "output_length": 1, "session_id": "u"},
      {"timestamp": 3, "hash_ids": [1], "output_length": 1, "session_id": "u"}], 3,
     "timestamp 3 is earlier than the previous timestamp 9 of session 'u'"),
    ([{"timestamp": 0, "hash_ids": [1], "output_length": 1},
      {"hash_ids": [1], "output_length": 1, "session_id": "s"},
      {"timestamp": 3, "hash_ids": [1], "output_length": 1, "session_id": "s"}], 3,
     "cannot infer the delay of turn 2 of session 's': it has a timestamp but no earlier "
     "turn has one"),
    ([], 1, "the trace has no rows"),
    (["", "  "], 2, "the trace has no rows"),
]


@pytest.mark.parametrize(("rows", "line", "message"), ERRORS)
def test_trace_errors_are_located_and_explained(
        rows: list[Any], line: int, message: str, write_trace: WriteTrace,
        tmp_path: Path, simulate: Simulate) -> None:
    write_trace(rows)
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 2}), base_dir=tmp_path)
    with pytest.raises(WorkloadError) as info:
        simulate(w)
    (diag,) = info.value.diagnostics
    assert diag.message == message
    assert diag.location == f"trace.jsonl:{line}"
    assert diag.hint  # every trace error says what to change
    # the upfront check reports the same problem
    found = validate_trace(tmp_path / "trace.jsonl", "mooncake", 512, display="trace.jsonl")
    assert diag in found


def test_trace_timestamps_load_needs_a_timestamp_on_each_session_start(
        write_trace: WriteTrace, tmp_path: Path, simulate: Simulate) -> None:
    write_trace([{"timestamp": 0, "hash_ids": [1], "output_length": 1},
                 {"hash_ids": [1], "output_length": 1}])
    w = build_workload(trace_spec(), base_dir=tmp_path)
    with pytest.raises(WorkloadError) as info:
        simulate(w)
    (diag,) = info.value.diagnostics
    assert diag.location == "trace.jsonl:2"
    assert diag.message == ("missing 'timestamp' on the first turn of session 'request_2'; "
                            "trace_timestamps load needs one")


def test_concurrency_load_does_not_need_timestamps(write_trace: WriteTrace, tmp_path: Path,
                                                   simulate: Simulate) -> None:
    write_trace([{"hash_ids": [1], "output_length": 1}, {"hash_ids": [2], "output_length": 1}])
    w = build_workload(trace_spec({"type": "concurrency", "concurrency": 1}), base_dir=tmp_path)
    assert len(simulate(w)) == 2


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError) as info:
        build_workload(trace_spec(path="nope/missing.jsonl"), base_dir=tmp_path)
    (diag,) = info.value.diagnostics
    assert (diag.location, diag.message) == ("nope/missing.jsonl", "trace file not found")
    assert validate_trace(tmp_path / "missing.jsonl", display="m.jsonl")[0].message == (
        "trace file not found")


@pytest.mark.parametrize(("path", "message"), [
    (".", "is a folder, expected a trace file"),
    (os.devnull, "not a regular file"),
    ("x" * 300 + ".jsonl", "cannot read trace: File name too long"),
])
def test_a_trace_path_that_is_not_a_file_says_what_it_is(tmp_path: Path, path: str,
                                                         message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        build_workload(trace_spec(path=path), base_dir=tmp_path)
    (diag,) = info.value.diagnostics
    assert (diag.location, diag.message) == (path, message)
    assert diag.hint is not None and "traffic.source.paths" in diag.hint
    assert validate_trace(tmp_path / path)[0].message == message


def test_validate_trace_reports_every_bad_line(write_trace: WriteTrace) -> None:
    path = write_trace([{"hash_ids": [1], "output_length": 1}, "{", {"hash_ids": [1]},
                        {"hash_ids": [1], "output_length": 1}, "[]"])
    found = validate_trace(path, display="t.jsonl")
    assert [d.location for d in found] == ["t.jsonl:2", "t.jsonl:3", "t.jsonl:5"]
    assert validate_trace(path, display="t.jsonl", max_diagnostics=1) == found[:1]


@pytest.mark.parametrize("name", ["poisson_1k.jsonl", "mooncake_conversation.jsonl",
                                  "mooncake_synthetic.jsonl"])
def test_shipped_traces_are_valid(name: str) -> None:
    path = REPO / "bench" / "traces" / name
    assert validate_trace(path, "mooncake", 512, require_timestamps=True, display=name) == []


def test_example_trace_is_valid_and_matches_the_full_trace_head() -> None:
    small = REPO / "examples" / "traces" / "mooncake_small.jsonl"
    full = REPO / "bench" / "traces" / "mooncake_conversation.jsonl"
    assert validate_trace(small, require_timestamps=True, display="small") == []
    lines = small.read_text().splitlines()
    assert 40 <= len(lines) <= 60
    with open(full) as f:
        assert [next(f).rstrip("\n") for _ in lines] == lines


def test_trace_sha256(write_trace: WriteTrace) -> None:
    path = write_trace([{"hash_ids": [1], "output_length": 1}])
    assert trace_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# -- property: the loader only ever gives requests or WorkloadError ------------------------------

KEYS = ["hash_ids", "input_length", "input_tokens", "output_length", "output_tokens",
        "timestamp", "created_time", "delay", "delay_ms", "session_id", "output_token_ids",
        "request_id"]
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3000), st.integers(),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4),
)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)
plausible = st.fixed_dictionaries(
    {"hash_ids": st.lists(st.integers(0, 20), max_size=4),
     "output_length": st.integers(0, 5)},
    optional={k: st.one_of(values, st.integers(0, 2000), st.sampled_from(["a", "b", 1]))
              for k in KEYS if k not in ("hash_ids", "output_length")},
)
sensible = st.fixed_dictionaries(
    {"hash_ids": st.lists(st.integers(0, 20), min_size=1, max_size=4),
     "output_length": st.integers(0, 5)},
    optional={"session_id": st.sampled_from(["a", "b", 3]),
              "timestamp": st.integers(0, 50),
              "delay": st.one_of(st.integers(0, 5), values),
              "input_length": st.integers(0, 40)},
)
lines = st.one_of(
    plausible.map(json.dumps),
    st.dictionaries(st.sampled_from(KEYS), values, max_size=6).map(json.dumps),
    values.map(json.dumps),
    st.text(max_size=20).filter(lambda s: "\n" not in s and "\r" not in s),
    st.binary(max_size=12).map(lambda b: b.decode("latin-1")).filter(
        lambda s: "\n" not in s and "\r" not in s),
)


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rows=st.one_of(st.lists(lines, max_size=8),
                     st.lists(sensible.map(json.dumps), min_size=1, max_size=8)),
       load=st.sampled_from([{"type": "trace_timestamps", "speedup": 2.0},
                             {"type": "concurrency", "concurrency": 2}]),
       fmt=st.sampled_from(["mooncake", "mooncake-delta"]),
       block=st.sampled_from([1, 4, 512]))
def test_random_lines_give_requests_or_workload_error(
        rows: list[str], load: dict[str, Any], fmt: str, block: int,
        simulate: Simulate) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        (base / "trace.jsonl").write_bytes(
            "".join(r + "\n" for r in rows).encode("utf-8", "surrogatepass"))
        try:
            w = build_workload(trace_spec(load, format=fmt, block_size=block), base_dir=base)
            served = simulate(w, service_ms=1.0)
        except WorkloadError as exc:
            assert exc.diagnostics and all(
                d.location and d.location.startswith("trace.jsonl") for d in exc.diagnostics)
            return
        assert served  # an accepted trace has at least one row
        for spec, _ in served:
            assert spec.input_length > 0
            assert prompt_length(spec.prompt) == spec.input_length
            assert spec.output_length >= 0
            assert spec.arrival_ms >= 0


def test_a_gzip_compressed_trace_is_named_as_such(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "trace.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"hash_ids": [1], "output_length": 1}\n' * 50))
    with pytest.raises(WorkloadError) as info:
        rows_of(path)
    (d,) = info.value.diagnostics
    assert (d.location, d.message) == ("trace.jsonl.gz:1", "the file is gzip-compressed")
    assert d.hint == "decompress it (gunzip) and name the .jsonl file"


def test_a_line_past_the_limit_is_refused_without_being_held(tmp_path: Path) -> None:
    from servesim.workloads.mooncake import MAX_LINE_BYTES, validate_trace

    path = tmp_path / "t.jsonl"
    row = b'{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [1]}\n'
    with open(path, "wb") as f:
        f.write(row)
        f.write(b" " * (MAX_LINE_BYTES + 10) + b"\n")
        f.write(row.replace(b'"timestamp": 0', b'"timestamp": "x"'))
    assert [d.render() for d in validate_trace(path, block_size=512, display="t.jsonl")] == [
        f"t.jsonl:2: the line is over {MAX_LINE_BYTES} bytes [trace-bad-row]\n  hint: split "
        "the row, or use a larger traffic.source.block_size (fewer hash ids)",
        "t.jsonl:3: 'timestamp' must be a number of milliseconds from 0 to 9.0072e+15, got "
        "'x' [trace-bad-field]\n  hint: set 'timestamp' to a number of milliseconds in that "
        "range"]


def _row(session: str | None = None) -> str:
    row: dict[str, object] = {"timestamp": 0, "input_length": 4, "output_length": 1,
                              "hash_ids": [1]}
    if session is not None:
        row["session_id"] = session
    return json.dumps(row) + "\n"


def test_session_rows_are_counted_across_the_search_blocks(tmp_path: Path) -> None:
    plain, with_session = _row(), _row("s")
    # the file's first session_id starts 4 bytes before its first megabyte ends
    target = (1 << 20) - 4
    at = with_session.index("session_id")
    rows = (target - at) // len(plain)
    content = plain * rows + " " * (target - at - rows * len(plain)) + with_session + plain
    assert content.count("session_id") == 1
    assert content.index("session_id") == target
    path = tmp_path / "t.jsonl"
    path.write_text(content, encoding="utf-8")
    assert count_session_rows(path) == {"s": 1}
    path.write_text(plain * 3, encoding="utf-8")
    assert count_session_rows(path) == {}
    path.write_text(plain + _row("7") + json.dumps({"session_id": 7}) + "\n",
                    encoding="utf-8")
    assert count_session_rows(path) == {"7": MIXED}
