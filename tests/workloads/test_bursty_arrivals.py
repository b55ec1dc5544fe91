"""Gamma arrivals: the rate and the coefficient of variation of the gaps, seeded."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from typing import Any

import pytest

from servesim.errors import CompileError, WorkloadError
from servesim.workloads import build_workload, gamma_arrivals, poisson_arrivals

N = 20_000


def gaps(rate: float, cv: float, seed: int = 5, n: int = N) -> list[float]:
    times = list(itertools.islice(gamma_arrivals(rate, cv, seed), n + 1))
    return [b - a for a, b in itertools.pairwise(times)]


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_rate_and_the_cv(cv: float) -> None:
    xs = gaps(10.0, cv)
    assert statistics.fmean(xs) == pytest.approx(100.0, rel=0.05)  # 1000 / 10 ms
    assert statistics.pstdev(xs) / statistics.fmean(xs) == pytest.approx(cv, rel=0.08)


def test_bursty_arrivals_bunch_up() -> None:
    """With cv 4, most requests come close together, and a few long lulls keep the rate."""
    steady, bursty = gaps(10.0, 0.5), gaps(10.0, 4.0)
    assert statistics.median(bursty) < 10.0 < statistics.median(steady)
    assert max(bursty) > 10 * max(steady)


def test_cv_1_is_poisson_draw_for_draw() -> None:
    assert list(itertools.islice(gamma_arrivals(3.0, 1.0, 11), 100)) == list(
        itertools.islice(poisson_arrivals(3.0, 11), 100))


def test_same_seed_same_arrivals() -> None:
    first = list(itertools.islice(gamma_arrivals(2.0, 3.0, 1), 50))
    assert first[0] == 0.0
    assert first == list(itertools.islice(gamma_arrivals(2.0, 3.0, 1), 50))
    assert first != list(itertools.islice(gamma_arrivals(2.0, 3.0, 2), 50))


def test_a_gamma_load_drives_requests_and_sessions() -> None:
    for source, rate_key, stop in (
            ({"type": "synthetic", "input_tokens": 10, "output_tokens": 2}, "requests_per_second",
             {"requests": 40}),
            ({"type": "synthetic-session", "turns": 2}, "sessions_per_second", {"sessions": 40})):
        spec = {"source": source, "load": {"type": "gamma", rate_key: 4.0, "cv": 2.5,
                                           "seed": 3},
                "stop": stop}
        arrivals = [s.arrival_ms for s in build_workload(spec).start()]
        assert arrivals == list(itertools.islice(gamma_arrivals(4.0, 2.5, 3), 40))


def test_a_gamma_config_compiles(compile_toml: Callable[..., Any],
                                 config: Callable[..., str]) -> None:
    payload = compile_toml(config('type = "synthetic"',
                                  'type = "gamma"\nrequests_per_second = 8\ncv = 3'))
    load = payload.workload.load
    assert (load.type, load.rate, load.cv, load.seed) == ("gamma", 8.0, 3.0, 42)


@pytest.mark.parametrize(("source", "load", "message"), [
    ('type = "synthetic"', 'type = "gamma"\nrequests_per_second = 1',
     "traffic.load.cv: gamma load requires cv, the coefficient of variation of the gaps "
     "between arrivals (1: poisson; above 1: bursty) [traffic-load]"),
    ('type = "synthetic"', 'type = "gamma"\ncv = 2',
     "traffic.load.requests_per_second: gamma load requires requests_per_second "
     "[traffic-load]"),
    ('type = "synthetic"', 'type = "poisson"\nrequests_per_second = 1\ncv = 2',
     "traffic.load.cv: load type 'poisson' does not accept cv [traffic-key]"),
    ('type = "synthetic"', 'type = "gamma"\nrequests_per_second = 1\ncv = 0',
     "traffic.load.cv: must be in (0, 100], got 0 [out-of-range]"),
    ('type = "synthetic"', 'type = "gamma"\nrequests_per_second = 1\ncv = 1e9',
     "traffic.load.cv: must be in (0, 100], got 1000000000 [out-of-range]"),
    ('type = "synthetic"', 'type = "gamma"\nrequests_per_second = 1\ncv = nan',
     "traffic.load.cv: expected a finite number, got nan [not-finite]"),
    ('type = "synthetic-session"', 'type = "gamma"\nrequests_per_second = 1\ncv = 2',
     "traffic.load.requests_per_second: rate unit does not match source type "
     "'synthetic-session'; use sessions_per_second [traffic-load]"),
])
def test_a_bad_gamma_load_names_its_key(compile_toml: Callable[..., Any],
                                        config: Callable[..., str], source: str, load: str,
                                        message: str) -> None:
    stop = "sessions = 3" if "session" in source else "requests = 3"
    with pytest.raises(CompileError) as err:
        compile_toml(config(source, load, stop))
    assert message in [d.render() for d in err.value.diagnostics]


def test_a_trace_refuses_gamma_arrivals(compile_toml: Callable[..., Any],
                                        config: Callable[..., str]) -> None:
    with pytest.raises(CompileError) as err:
        compile_toml(config('type = "trace"\npaths = ["t.jsonl"]',
                            'type = "gamma"\nrequests_per_second = 1\ncv = 2', stop=""))
    assert "traffic.load.type: trace load must be trace_timestamps or concurrency " \
           "[traffic-load]" in [d.render() for d in err.value.diagnostics]


def test_a_payload_gamma_load_without_cv_is_refused() -> None:
    with pytest.raises(WorkloadError, match=r"traffic.load.cv: gamma load requires cv"):
        build_workload({"source": {"type": "synthetic"},
                        "load": {"type": "gamma", "requests_per_second": 1.0},
                        "stop": {"requests": 1}})
