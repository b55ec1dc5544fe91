from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from typing import Any

import pytest

from servesim.engines.kernel.tokens import (
    Segment,
    block_hashes,
    generated_key,
    prompt_length,
)
from servesim.errors import CompileError, WorkloadError, format_path
from servesim.workloads import build_workload, constant_arrivals, poisson_arrivals
from servesim.workloads.spec import SessionSource, Stop
from servesim.workloads.synthetic import shared_prefix_tokens, spread_length

Simulate = Callable[..., Any]

SYN = {"type": "synthetic", "input_tokens": 100, "output_tokens": 8, "cached_prefix_tokens": 0}


def session_source(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "type": "synthetic-session", "new_input_tokens_per_turn": 64,
        "output_tokens_per_turn": 16, "turns": 3, "shared_prefix_ratio": 0.0,
        "prefix_groups": 0, "inter_turn_delay_ms": 5.0,
    }
    base.update(kw)
    return base


# -- synthetic requests ------------------------------------------------------------------


def test_synthetic_requests_have_fixed_lengths_and_unique_tokens() -> None:
    w = build_workload({"source": SYN, "load": {"type": "constant_rate",
                                                "requests_per_second": 10.0},
                        "stop": {"requests": 5}})
    specs = list(w.start())
    assert [s.request_id for s in specs] == [0, 1, 2, 3, 4]
    assert all(s.input_length == 100 and s.output_length == 8 for s in specs)
    assert all(prompt_length(s.prompt) == 100 for s in specs)
    assert all(s.session_id is None and s.turn_index == 0 for s in specs)
    hashes = [set(block_hashes(s.prompt, 4)) for s in specs]
    for a, b in itertools.combinations(hashes, 2):
        assert not a & b  # no block shared between two requests
    assert w.on_terminal(specs[0], 3.0) == []
    assert w.max_time_ms is None


def test_cached_prefix_is_shared_by_every_request_and_the_rest_is_unique() -> None:
    src = dict(SYN, cached_prefix_tokens=40)
    w = build_workload({"source": src, "load": {"type": "concurrency", "concurrency": 3},
                        "stop": {"requests": 3}})
    specs = list(w.start())
    assert all(s.prompt[0] == Segment(0, 40, repeat=False) for s in specs)
    hashes = [block_hashes(s.prompt, 8) for s in specs]
    assert hashes[0][:5] == hashes[1][:5] == hashes[2][:5]  # 40 tokens = 5 blocks of 8
    assert len({h[5] for h in hashes}) == 3


def test_cached_prefix_larger_than_the_prompt_is_rejected() -> None:
    with pytest.raises(WorkloadError, match=r"must be <= input_tokens \(100\), got 101"):
        build_workload({"source": dict(SYN, cached_prefix_tokens=101),
                        "load": {"type": "concurrency", "concurrency": 1},
                        "stop": {"requests": 1}})


def test_output_range_ratio_spreads_lengths_evenly_around_the_mean() -> None:
    src = dict(SYN, output_tokens=100, output_range_ratio=0.2)
    w = build_workload({"source": src, "load": {"type": "concurrency", "concurrency": 1000},
                        "stop": {"requests": 1000}})
    lengths = [s.output_length for s in w.start()]
    assert min(lengths) == 80 and max(lengths) == 120
    assert sum(lengths) / len(lengths) == pytest.approx(100, abs=0.1)
    # every tenth of the range holds about a tenth of the requests
    tenths = [sum(1 for n in lengths if 80 + 4 * k <= n < 84 + 4 * k) for k in range(10)]
    assert all(80 <= t <= 120 for t in tenths)
    assert [s.output_length for s in w.start()] == lengths  # the same in every replay


def test_output_range_ratio_keeps_one_token_and_zero_spreads_nothing() -> None:
    assert spread_length(1, 1.0, 3) >= 1
    assert [spread_length(8, 0.0, i) for i in range(5)] == [8] * 5
    assert spread_length(0, 0.5, 7) == 0


@pytest.mark.parametrize("ratio", [-0.1, 1.5, "0.2", float("nan")])
def test_a_bad_output_range_ratio_in_a_payload_is_refused(ratio: object) -> None:
    with pytest.raises(WorkloadError, match="output_range_ratio"):
        build_workload({"source": dict(SYN, output_range_ratio=ratio),
                        "load": {"type": "concurrency", "concurrency": 1},
                        "stop": {"requests": 1}})


def test_output_range_ratio_in_a_config(compile_toml: Callable[..., Any]) -> None:
    text = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated]
[traffic.source]
type = "{kind}"
output_range_ratio = 0.25
{more}
"""
    payload = compile_toml(text.format(kind="synthetic", more=""))
    assert payload.workload.source.output_range_ratio == 0.25
    with pytest.raises(CompileError) as err:
        compile_toml(text.format(kind="trace", more='paths = ["t.jsonl"]'))
    assert "traffic.source.output_range_ratio: source type 'trace' does not accept " \
           "output_range_ratio [traffic-key]" in str(err.value)


# -- arrivals ------------------------------------------------------------------------------


def test_concurrency_is_a_closed_loop(simulate: Simulate) -> None:
    w = build_workload({"source": SYN, "load": {"type": "concurrency", "concurrency": 2},
                        "stop": {"requests": 5}})
    served = simulate(w, service_ms=lambda s: 10.0 + s.request_id)
    arrivals = [(s.request_id, s.arrival_ms) for s, _ in served]
    # 0 and 1 at t=0; 0 ends at 10 -> 2; 1 ends at 11 -> 3; 2 ends at 22 -> 4
    assert arrivals == [(0, 0.0), (1, 0.0), (2, 10.0), (3, 11.0), (4, 22.0)]


def test_closed_loop_start_yields_only_concurrency_requests() -> None:
    w = build_workload({"source": SYN, "load": {"type": "concurrency", "concurrency": 4},
                        "stop": {"requests": 100}})
    assert [s.arrival_ms for s in w.start()] == [0.0] * 4
    w2 = build_workload({"source": SYN, "load": {"type": "concurrency", "concurrency": 4},
                         "stop": {"requests": 2}})
    assert len(list(w2.start())) == 2


def test_poisson_arrivals_are_seeded_exponential_gaps() -> None:
    w = build_workload({"source": SYN,
                        "load": {"type": "poisson", "requests_per_second": 4.0, "seed": 7},
                        "stop": {"requests": 6}})
    got = [s.arrival_ms for s in w.start()]
    rng = random.Random(7)
    expected = [0.0]
    for _ in range(5):
        expected.append(expected[-1] + rng.expovariate(4.0) * 1000.0)
    assert got == expected
    assert got == [s.arrival_ms for s in w.start()]  # a second replay is identical
    assert list(itertools.islice(poisson_arrivals(4.0, 7), 6)) == expected


def test_poisson_seed_defaults_to_42() -> None:
    w = build_workload({"source": SYN, "load": {"type": "poisson", "requests_per_second": 2.0},
                        "stop": {"requests": 3}})
    rng = random.Random(42)
    first_gap = rng.expovariate(2.0) * 1000.0
    assert [s.arrival_ms for s in w.start()][:2] == [0.0, first_gap]


def test_constant_rate_arrivals() -> None:
    w = build_workload({"source": SYN,
                        "load": {"type": "constant_rate", "requests_per_second": 8.0},
                        "stop": {"requests": 4}})
    assert [s.arrival_ms for s in w.start()] == [0.0, 125.0, 250.0, 375.0]
    assert list(itertools.islice(constant_arrivals(3.0), 3)) == [0.0, 1000.0 / 3, 2000.0 / 3]


@pytest.mark.parametrize("rate", [1e-300, 1e-10])
def test_an_arrival_past_the_virtual_time_a_replay_covers_is_an_error(rate: float) -> None:
    # 1e-300 requests/s put the second arrival at 1e303 ms; the clock would overflow or
    # lose its milliseconds (zero latencies, requests dropped at +inf) long before
    w = build_workload({"source": SYN,
                        "load": {"type": "constant_rate", "requests_per_second": rate},
                        "stop": {"requests": 3}})
    arrivals = w.start()
    assert next(arrivals).arrival_ms == 0.0
    with pytest.raises(WorkloadError) as info:
        next(arrivals)
    (d,) = info.value.diagnostics
    assert (d.code, d.path) == ("arrival-too-late", ("traffic", "load"))
    assert d.message.startswith(f"request 1 arrives at {1000 / rate:.3g} ms of virtual time")


def test_open_loop_stops_at_max_virtual_time() -> None:
    w = build_workload({"source": SYN,
                        "load": {"type": "constant_rate", "requests_per_second": 1.0},
                        "stop": {"max_virtual_time_seconds": 2.5}})
    assert w.max_time_ms == 2500.0
    assert [s.arrival_ms for s in w.start()] == [0.0, 1000.0, 2000.0]


# -- sessions ------------------------------------------------------------------------------


def test_session_turns_run_in_order_and_extend_the_previous_prompt(simulate: Simulate) -> None:
    w = build_workload({"source": session_source(),
                        "load": {"type": "concurrency", "concurrency": 1},
                        "stop": {"sessions": 2}})
    served = simulate(w, service_ms=10.0)
    specs = [s for s, _ in served]
    assert [(s.request_id, s.session_id, s.turn_index) for s in specs] == [
        (0, "session_0", 0), (1, "session_0", 1), (2, "session_0", 2),
        (3, "session_1", 0), (4, "session_1", 1), (5, "session_1", 2)]
    # turn k+1 arrives inter_turn_delay after turn k ends; the next session when one ends
    assert [s.arrival_ms for s in specs] == [0.0, 15.0, 30.0, 40.0, 55.0, 70.0]
    t0, t1, t2 = specs[:3]
    assert [t.input_length for t in (t0, t1, t2)] == [64, 64 + 16 + 64, 144 + 16 + 64]
    assert t1.prompt[: len(t0.prompt)] == t0.prompt
    assert t1.prompt[len(t0.prompt)] == Segment(generated_key(0), 16, repeat=False)
    assert t2.prompt[: len(t1.prompt)] == t1.prompt
    assert t2.prompt[len(t1.prompt)] == Segment(generated_key(1), 16, repeat=False)
    # each later turn says which request's prompt and output begin its prompt
    assert [s.extends for s in specs] == [-1, 0, 1, -1, 3, 4]
    assert all(prompt_length(s.prompt) == s.input_length for s in specs)
    # sessions do not share tokens without prefix groups
    assert not set(block_hashes(specs[0].prompt, 8)) & set(block_hashes(specs[3].prompt, 8))


def test_sessions_under_poisson_load_count_sessions(simulate: Simulate) -> None:
    w = build_workload({"source": session_source(turns=2),
                        "load": {"type": "poisson", "sessions_per_second": 50.0, "seed": 3},
                        "stop": {"sessions": 4}})
    served = simulate(w, service_ms=1.0)
    assert len(served) == 8
    starts = [s.arrival_ms for s, _ in served if s.turn_index == 0]
    rng = random.Random(3)
    expected = [0.0]
    for _ in range(3):
        expected.append(expected[-1] + rng.expovariate(50.0) * 1000.0)
    assert starts == expected
    ends = {s.request_id: end for s, end in served}
    for s, _ in served:
        if s.turn_index == 1:
            assert s.arrival_ms == ends[s.request_id - 1] + 5.0


def test_request_stop_caps_request_ids_for_sessions(simulate: Simulate) -> None:
    w = build_workload({"source": session_source(turns=3),
                        "load": {"type": "concurrency", "concurrency": 2},
                        "stop": {"requests": 4}})
    ids = sorted(s.request_id for s, _ in simulate(w))
    assert ids == [0, 1, 2, 3]


def test_shared_prefix_groups_are_seeded_and_shared_within_a_group() -> None:
    src = session_source(shared_prefix_ratio=0.5, prefix_groups=2, new_input_tokens_per_turn=64)
    spec = {"source": src, "load": {"type": "constant_rate", "sessions_per_second": 1.0},
            "stop": {"sessions": 12}}
    firsts = list(build_workload(spec).start())
    assert firsts == list(build_workload(spec).start())  # deterministic
    groups = [s.prompt[0].key for s in firsts]
    assert set(groups) == {1, 2}  # both groups used with this seed
    for a, b in itertools.combinations(firsts, 2):
        ha, hb = block_hashes(a.prompt, 8), block_hashes(b.prompt, 8)
        same = a.prompt[0].key == b.prompt[0].key
        assert (ha[:4] == hb[:4]) is same  # 32 shared tokens = 4 blocks of 8
        assert ha[4] != hb[4]
    other_seed = dict(spec, load={"type": "poisson", "sessions_per_second": 1.0, "seed": 1})
    assert [s.prompt[0].key for s in build_workload(other_seed).start()] != groups


def test_shared_prefix_rounding_in_blocks() -> None:
    assert shared_prefix_tokens(SessionSource(new_input_tokens_per_turn=100,
                                              shared_prefix_ratio=0.25, prefix_groups=1)) == 25
    # 100 tokens in blocks of 16 -> 7 blocks; round(7 * 0.5) = 4 blocks (halves round up)
    assert shared_prefix_tokens(SessionSource(new_input_tokens_per_turn=100,
                                              shared_prefix_ratio=0.5, prefix_groups=1,
                                              block_size=16)) == 64
    assert shared_prefix_tokens(SessionSource(new_input_tokens_per_turn=100,
                                              shared_prefix_ratio=1.0, prefix_groups=1,
                                              block_size=16)) == 100


# -- spec errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"source": SYN, "load": {"type": "concurrency", "concurrency": 1}, "stop": {}},
         "a synthetic workload needs a stop condition"),
        ({"source": SYN, "load": {"type": "poisson", "sessions_per_second": 1.0},
          "stop": {"requests": 1}},
         "rate unit does not match source type 'synthetic'; use requests_per_second"),
        ({"source": session_source(), "load": {"type": "constant_rate",
                                               "requests_per_second": 1.0},
          "stop": {"sessions": 1}},
         "rate unit does not match source type 'synthetic-session'; use sessions_per_second"),
        ({"source": SYN, "load": {"type": "poisson"}, "stop": {"requests": 1}},
         "poisson load requires requests_per_second"),
        ({"source": SYN, "load": {"type": "trace_timestamps"}, "stop": {"requests": 1}},
         "synthetic source rejects trace_timestamps load; use concurrency, poisson or "
         "constant_rate"),
        ({"source": session_source(shared_prefix_ratio=0.5), "load": {"type": "concurrency"},
          "stop": {"sessions": 1}}, "shared_prefix_ratio > 0 requires prefix_groups > 0"),
        ({"source": SYN, "load": {"type": "concurrency", "concurrency": 0},
          "stop": {"requests": 1}}, "must be in [1, 2^20], got 0"),
        ({"source": {"type": "nope"}, "load": {}, "stop": {}},
         "expected one of \"synthetic\", \"synthetic-session\", \"trace\", got string 'nope'"),
        ({"source": {"type": "trace", "path": "t.jsonl"},
          "load": {"type": "poisson", "requests_per_second": 1.0}, "stop": {}},
         "trace load must be trace_timestamps or concurrency"),
        ({"source": {"type": "trace", "path": "t.jsonl", "format": "weka"},
          "load": {"type": "concurrency"}, "stop": {}}, "trace format 'weka' is not supported"),
    ],
)
def test_bad_workload_specs_raise_workload_error(spec: dict[str, object], message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        build_workload(spec)
    assert info.value.diagnostics[0].message == message
    assert info.value.diagnostics[0].path[0] == "traffic"


def test_a_payload_seed_is_held_to_the_config_s_range() -> None:
    spec = {"source": {"type": "synthetic"}, "stop": {"requests": 1},
            "load": {"type": "poisson", "requests_per_second": 1.0, "seed": -1}}
    with pytest.raises(WorkloadError) as info:
        build_workload(spec)
    (diag,) = info.value.diagnostics
    assert (format_path(diag.path), diag.message) == ("traffic.load.seed",
                                                      "must be in [0, 2^64-1], got -1")


# -- the typed workload: one type from resolve to replay --------------------------------------

def test_a_compiled_workload_is_typed_and_round_trips_through_its_json(
        compile_toml: Callable[..., Any]) -> None:
    from servesim.payload import dump_payload, load_payload
    from servesim.workloads.spec import RateLoad, SyntheticSource, WorkloadSpec

    payload = compile_toml("""
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.aggregated]
[traffic.source]
input_tokens = 512
[traffic.load]
type = "constant_rate"
requests_per_second = 3.0
[traffic.stop]
requests = 5
""")
    # the defaults are the workload type's own (output_tokens 128, no seed for constant_rate)
    assert payload.workload == WorkloadSpec(
        SyntheticSource(input_tokens=512),
        RateLoad(type="constant_rate", requests_per_second=3.0), Stop(requests=5))
    data = json.loads(dump_payload(payload))
    assert data["workload"] == {
        "source": {"type": "synthetic", "input_tokens": 512, "output_tokens": 128,
                   "cached_prefix_tokens": 0},
        "load": {"type": "constant_rate", "requests_per_second": 3.0},
        "stop": {"requests": 5}}
    assert load_payload(data).workload == payload.workload


@pytest.mark.parametrize(("edit", "expected"), [
    ({"source": {"type": "synthetic", "input_tokens": "many"}},
     "traffic.source.input_tokens: expected an integer or a table, got string 'many' "
         "[wrong-type]"),
    ({"load": {"type": "burst"}},
     "traffic.load.type: expected one of \"concurrency\", \"poisson\", \"constant_rate\", "
     "\"gamma\", \"trace_timestamps\", got string 'burst' [bad-choice]"),
    ({"load": []}, "traffic.load: expected a table, got an array [wrong-type]"),
    ({"stop": {"requests": 1, "request": 2}},
     "traffic.stop.request: unknown key 'request' (allowed here: requests, sessions, "
     "max_virtual_time_seconds) [unknown-key]\n  hint: did you mean 'requests'?"),
])
def test_a_bad_payload_workload_is_refused_at_its_traffic_key(edit: dict[str, Any],
                                                               expected: str) -> None:
    from servesim.errors import PayloadError
    from servesim.payload import SCHEMA_VERSION, load_payload

    workload = {"source": SYN, "load": {"type": "concurrency"}, "stop": {"requests": 1},
                **edit}
    data = {"schema_version": SCHEMA_VERSION, "engine": "vllm", "mode": "aggregated",
            "roles": {}, "workload": workload}
    with pytest.raises(PayloadError) as info:
        load_payload(data)
    assert [d.render() for d in info.value.diagnostics] == [expected]
    with pytest.raises(WorkloadError) as built:  # the same, handed to build_workload
        build_workload(workload)
    assert [d.render() for d in built.value.diagnostics] == [expected]


def test_workloads_never_import_the_compiler() -> None:
    import subprocess
    import sys

    code = ("import sys, servesim.workloads, servesim.payload; "
            "print(sorted(m for m in sys.modules if m.startswith(('servesim.compiler', "
            "'servesim.plugins'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
