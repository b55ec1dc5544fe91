"""The traffic rules between values hold a config and a hand-written payload alike.

Each case is one mistake written twice: as a ``traffic`` table the compiler refuses, and
as the workload dict of a payload that the workload builder refuses. Both must report
the same diagnostics (code, message, config path), all of them, in the same order.
"""

from __future__ import annotations

from typing import Any

import pytest

from servesim.compiler import compile_text
from servesim.errors import CompileError, Diagnostic, WorkloadError
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.workloads import build_workload

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
DEPLOYMENT = ('[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
              "[engine.workers.aggregated]\n")
TRACE_TOML = '[traffic.source]\ntype = "trace"\npaths = ["t.jsonl"]\n'
TRACE = {"type": "trace", "path": "t.jsonl", "format": "mooncake", "block_size": 512}
SYNTHETIC = {"type": "synthetic", "input_tokens": 100, "output_tokens": 8,
             "cached_prefix_tokens": 0}
SESSION = {"type": "synthetic-session", "new_input_tokens_per_turn": 64,
           "output_tokens_per_turn": 16, "turns": 3, "shared_prefix_ratio": 0.0,
           "prefix_groups": 0, "inter_turn_delay_ms": 0.0}
CONCURRENCY = {"type": "concurrency", "concurrency": 1}


def shown(diagnostics: tuple[Diagnostic, ...]) -> list[tuple[str, str, str]]:
    return [(d.code, d.where, d.message) for d in diagnostics]


CASES: dict[str, tuple[str, dict[str, Any], list[tuple[str, str, str]]]] = {
    "cached-prefix": (
        "[traffic.source]\ninput_tokens = 100\ncached_prefix_tokens = 101\n",
        {"source": {**SYNTHETIC, "cached_prefix_tokens": 101}, "load": CONCURRENCY,
         "stop": {"requests": 1}},
        [("traffic-value", "traffic.source.cached_prefix_tokens",
          "cached_prefix_tokens must be <= input_tokens (100), got 101")]),
    "prefix-groups": (
        '[traffic.source]\ntype = "synthetic-session"\nsession = { shared_prefix_ratio = 0.5 }\n',
        {"source": {**SESSION, "shared_prefix_ratio": 0.5}, "load": CONCURRENCY,
         "stop": {"sessions": 1}},
        [("traffic-value", "traffic.source.session.prefix_groups",
          "shared_prefix_ratio > 0 requires prefix_groups > 0")]),
    "trace-poisson": (
        TRACE_TOML + '[traffic.load]\ntype = "poisson"\nrequests_per_second = 1.0\n',
        {"source": TRACE, "load": {"type": "poisson", "requests_per_second": 1.0}, "stop": {}},
        [("traffic-load", "traffic.load.type",
          "trace load must be trace_timestamps or concurrency")]),
    # two rules broken at once: both reported, at compile time and at handoff
    "trace-rate-missing": (
        TRACE_TOML + '[traffic.load]\ntype = "constant_rate"\n',
        {"source": TRACE, "load": {"type": "constant_rate"}, "stop": {}},
        [("traffic-load", "traffic.load.type",
          "trace load must be trace_timestamps or concurrency"),
         ("traffic-load", "traffic.load.requests_per_second",
          "constant_rate load requires requests_per_second")]),
    "synthetic-timestamps": (
        '[traffic.load]\ntype = "trace_timestamps"\n',
        {"source": SYNTHETIC, "load": {"type": "trace_timestamps", "speedup": 1.0},
         "stop": {"requests": 1}},
        [("traffic-load", "traffic.load.type",
          "synthetic source rejects trace_timestamps load; use concurrency, poisson or "
          "constant_rate")]),
    "session-rate-unit": (
        '[traffic.source]\ntype = "synthetic-session"\n'
        '[traffic.load]\ntype = "poisson"\nrequests_per_second = 1.0\n',
        {"source": SESSION, "load": {"type": "poisson", "requests_per_second": 1.0},
         "stop": {"sessions": 1}},
        [("traffic-load", "traffic.load.requests_per_second",
          "rate unit does not match source type 'synthetic-session'; use sessions_per_second")]),
    "synthetic-rate-unit": (
        '[traffic.load]\ntype = "constant_rate"\nsessions_per_second = 1.0\n',
        {"source": SYNTHETIC, "load": {"type": "constant_rate", "sessions_per_second": 1.0},
         "stop": {"requests": 1}},
        [("traffic-load", "traffic.load.sessions_per_second",
          "rate unit does not match source type 'synthetic'; use requests_per_second")]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_config_and_payload_break_a_traffic_rule_with_the_same_diagnostics(case: str) -> None:
    traffic, workload, expected = CASES[case]
    with pytest.raises(CompileError) as compiled:
        compile_text(DEPLOYMENT + traffic, name="case.toml", registry=REGISTRY)
    with pytest.raises(WorkloadError) as handed:
        build_workload(workload)
    assert shown(compiled.value.diagnostics) == expected
    assert shown(handed.value.diagnostics) == expected


def test_the_fixed_workloads_pass_both_checks() -> None:
    """The same tables with the mistake mended compile, and their payloads build."""
    compile_text(DEPLOYMENT + '[traffic.source]\ntype = "synthetic-session"\n'
                 "session = { shared_prefix_ratio = 0.5, prefix_groups = 2 }\n"
                 '[traffic.load]\ntype = "poisson"\nsessions_per_second = 1.0\n',
                 name="case.toml", registry=REGISTRY)
    w = build_workload({"source": {**SESSION, "shared_prefix_ratio": 0.5, "prefix_groups": 2},
                        "load": {"type": "poisson", "sessions_per_second": 1.0},
                        "stop": {"sessions": 1}})
    assert len(list(w.start())) == 1
