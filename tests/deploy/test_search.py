"""``servesim search``: Optuna over a space, SLA constraints, Pareto fronts, load bisection,
resumable storage, and every bad space an input error."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from servesim.search.goals import LoadSearch, parse_constraint, parse_objective

from .conftest import run

pytest.importorskip("optuna")

SPACE = """
objectives = ["goodput_rps_per_gpu"]
constraints = ["tpot_ms.p99 <= 10"]
trials = 6
seed = 3
[parameters]
"engine.workers.aggregated.parallelism.tensor" = [1, 2, 3]
"engine.workers.aggregated.parallelism.replicas" = { low = 1, high = 2 }
"""
LOAD = """
[load]
key = "traffic.load.requests_per_second"
low = 1.0
high = 40.0
tolerance = 0.1
"""


def write_space(text: str = SPACE, name: str = "space.toml") -> str:
    Path(name).write_text(text, encoding="utf-8")
    return name


def rows_of(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(Path(path).read_text())["rows"]
    return rows


def test_objectives_and_constraints_read_as_written() -> None:
    assert parse_objective("goodput_rps_per_gpu").direction == "maximize"
    assert parse_objective("tpot_ms.p99").direction == "minimize"
    assert parse_objective("usd_per_hour").direction == "minimize"
    assert parse_objective("maximize tpot_ms.p50").direction == "maximize"
    c = parse_constraint("ttft_ms.p99 <= 1000")
    assert c is not None and c.violation({"p99_ttft_ms": 900.0}) == -100.0
    assert c.violation({"p99_ttft_ms": 1200.0}) == 200.0
    assert c.violation({}) == float("inf")
    assert parse_constraint("ttft_ms.p99 = 3") is None


def test_the_load_search_finds_the_largest_load_meeting_the_constraints() -> None:
    cond = parse_constraint("p99_ttft_ms <= 100")
    assert cond is not None
    tried: list[float] = []

    def replay_at(rate: float) -> dict[str, Any]:  # TTFT grows with the rate, 100 at 7.5
        tried.append(rate)
        return {"status": "ok", "p99_ttft_ms": rate * 100 / 7.5}

    best = LoadSearch(("r",), 1.0, 64.0, tolerance=0.02).best(replay_at, (cond,))
    assert 7.5 / 1.02 <= best["max_load"] <= 7.5
    assert best["p99_ttft_ms"] <= 100
    assert len(tried) < 20
    none = LoadSearch(("r",), 10.0, 64.0).best(replay_at, (cond,))
    assert none["max_load"] is None


def test_a_search_finds_the_best_feasible_point(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "search", "tiny.toml", "--space", write_space(),
                         "-o", "s.json", "-j", "1")
    assert code == 0, err
    rows = rows_of("s.json")
    assert [r["point"] for r in rows] == list(range(6))
    feasible = [r for r in rows if r["feasible"]]
    assert feasible and all(r["p99_tpot_ms"] <= 10 for r in feasible)
    best = max(r["goodput_rps_per_gpu"] for r in feasible)
    assert "Best deployments: maximize goodput_rps_per_gpu; tpot_ms.p99 <= 10" in out
    assert f"{best:.4g}" in out
    assert all(r["status"] == "invalid" for r in rows
               if r["engine.workers.aggregated.parallelism.tensor"] == 3)
    assert Path("s.db").exists()


def test_the_same_seed_gives_the_same_rows(capsys: pytest.CaptureFixture[str]) -> None:
    space = write_space()
    assert run(capsys, "search", "tiny.toml", "--space", space, "-o", "a.json", "-j", "1")[0] == 0
    assert run(capsys, "search", "tiny.toml", "--space", space, "-o", "b.json", "-j", "1")[0] == 0
    assert rows_of("a.json") == rows_of("b.json")


def test_a_search_resumes_from_its_storage(capsys: pytest.CaptureFixture[str]) -> None:
    space = write_space()
    assert run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json", "--trials", "3",
               "-j", "1")[0] == 0
    first = rows_of("s.json")
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json")
    assert code == 1 and "add --resume to continue it" in err
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json",
                       "--trials", "5", "--resume", "-j", "1")
    assert code == 0, err
    rows = rows_of("s.json")
    assert len(rows) == 5
    assert [r["point"] for r in rows[:3]] == [r["point"] for r in first]
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json",
                       "--resume", "--constraint", "ttft_ms.p99 <= 1")
    assert code == 1 and "another config, space or --set values" in err


def test_several_objectives_give_a_pareto_front(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "search", "tiny.toml", "--space", write_space(),
                         "--objective", "output_tok_s_per_gpu", "--objective", "tpot_ms.median",
                         "--trials", "8", "-o", "p.json", "-j", "2")
    assert code == 0, err
    assert "Pareto front: maximize output_tok_s_per_gpu, minimize tpot_ms.median" in out
    rows = rows_of("p.json")
    front = [r for r in rows if r["pareto"]]
    assert front and all(r["feasible"] for r in front)
    for r in front:  # nothing feasible beats a front point on both objectives
        assert not any(o["output_tok_s_per_gpu"] > r["output_tok_s_per_gpu"]
                       and o["median_tpot_ms"] < r["median_tpot_ms"]
                       for o in rows if o["feasible"])


def test_a_search_over_deployments_with_the_load_bisected(
        capsys: pytest.CaptureFixture[str]) -> None:
    space = write_space(SPACE.replace("trials = 6", "trials = 3") + LOAD)
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "l.json",
                         "--objective", "max_load_per_gpu", "-j", "2")
    assert code == 0, err
    ok = [r for r in rows_of("l.json") if r["status"] == "ok" and r["max_load"] is not None]
    assert ok
    for r in ok:
        assert 1.0 <= r["max_load"] <= 40.0 and r["p99_tpot_ms"] <= 10
        assert r["max_load_per_gpu"] == pytest.approx(r["max_load"] / r["gpus"])


@pytest.mark.parametrize(("space", "message"), [
    ("", "the space file is empty"),
    ("trials = 3\n", "needs a [parameters] table"),
    ('objectives = ["goodput"]\n[parameters]\na = [1]\n', "unknown metric 'goodput'"),
    ('constraints = ["ttft <"]\n[parameters]\na = [1]\n', "is not a constraint"),
    ("[parameters]\na = []\n", "an empty list of choices"),
    ("[parameters]\na = { low = 5, high = 1 }\n", "low <= high"),
    ("[parameters]\na = 3\n", "expected a list of choices"),
    ("colour = 1\n[parameters]\na = [1]\n", "unknown key 'colour'"),
    ("trials = 0\n[parameters]\na = [1]\n", "expected an integer from 1"),
    ("[parameters]\na = [1]\n[load]\nkey = 'x'\nlow = 1\nhigh = 2\n", "needs constraints"),
    ("[parameters]\na = [1]\n[load]\nkey = 'x'\nlow = 2\nhigh = 1\n", "0 < low < high"),
    ("[parameters\n", "invalid TOML"),
    ('[parameters]\n"engine.workers.aggregated.parallelism.tensr" = [1, 2]\n',
     "no trial of the search could be replayed"),
])
def test_a_bad_space_is_an_input_error(capsys: pytest.CaptureFixture[str], space: str,
                                       message: str) -> None:
    code, _, err = run(capsys, "search", "tiny.toml", "--space", write_space(space),
                       "-o", "s.json")
    assert code == 1 and message in err and "Traceback" not in err
    assert Path("s.db").exists() == ("no trial" in message)  # no study for a bad space


@pytest.mark.parametrize("argv", [["--seed", "-1"], ["--top", "0"], ["--trials", "0"],
                                  ["-j", "0"], ["--set", "engine.hardware=h100_sxm,h200_sxm"]])
def test_bad_search_options_are_input_errors(capsys: pytest.CaptureFixture[str],
                                             argv: list[str]) -> None:
    code, _, err = run(capsys, "search", "tiny.toml", "--space", write_space(), *argv)
    assert code == 1 and err.startswith("error: ") and "Traceback" not in err


def test_search_without_optuna_says_what_to_install(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optuna", None)
    code, _, err = run(capsys, "search", "tiny.toml", "--space", write_space())
    assert code == 1 and "pip install 'servesim[search]'" in err


def test_the_grid_sampler_tries_every_combination_once(
        capsys: pytest.CaptureFixture[str]) -> None:
    space = write_space(SPACE.replace("trials = 6\n", 'sampler = "grid"\n').replace(
        "{ low = 1, high = 2 }", "[1, 2]"))
    code, out, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "g.json",
                         "-j", "2")
    assert code == 0, err
    combos = [(r["engine.workers.aggregated.parallelism.tensor"],
               r["engine.workers.aggregated.parallelism.replicas"]) for r in rows_of("g.json")]
    assert combos == [(t, r) for t in (1, 2, 3) for r in (1, 2)]
    assert "of 6 trials met every constraint" in out and "2 could not be replayed" in out
    bad = write_space(SPACE.replace("trials = 6\n", 'sampler = "grid"\n'), "bad.toml")
    code, _, err = run(capsys, "search", "tiny.toml", "--space", bad)
    assert code == 1 and "the grid sampler takes lists of choices only" in err


def test_ctrl_c_keeps_finished_trials_and_resume_completes_them(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from servesim.sweep import trial

    real = trial.run_trial
    calls: list[int] = []

    def interrupted(base: Any, task: Any, *args: Any, **kw: Any) -> Any:
        calls.append(task[0])
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(base, task, *args, **kw)

    monkeypatch.setattr("servesim.sweep.executors.run_trial", interrupted)
    space = write_space(SPACE.replace("{ low = 1, high = 2 }", "{ low = 1, high = 9 }"))
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json",
                       "-j", "1", "--trials", "4")
    kept = len(rows_of("s.json"))  # two replays, and any point proposed again
    assert code == 130 and f"interrupted: {kept} trials finished" in err and 2 <= kept < 4
    assert "continue with --resume --storage s.db" in err
    monkeypatch.setattr("servesim.sweep.executors.run_trial", real)
    code, _, err = run(capsys, "search", "tiny.toml", "--space", space, "-o", "s.json",
                       "-j", "1", "--trials", "4", "--resume")
    assert code == 0, err
    assert len(rows_of("s.json")) == 4


def test_grid_from_the_command_line_and_its_trial_limit(
        capsys: pytest.CaptureFixture[str]) -> None:
    space = write_space(SPACE.replace("trials = 6\n", "").replace("{ low = 1, high = 2 }",
                                                                  "[1, 2]"))
    assert run(capsys, "search", "tiny.toml", "--space", space, "--sampler", "grid",
               "-o", "a.json", "-j", "1")[0] == 0
    assert len(rows_of("a.json")) == 6
    assert run(capsys, "search", "tiny.toml", "--space", space, "--sampler", "grid",
               "--trials", "2", "-o", "b.json", "-j", "1")[0] == 0
    assert len(rows_of("b.json")) == 2
    code, _, err = run(capsys, "search", "tiny.toml", "--space", write_space(SPACE, "r.toml"),
                       "--sampler", "grid")
    assert code == 1 and "the grid sampler takes lists of choices only" in err
