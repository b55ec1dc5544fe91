"""Length distributions of synthetic traffic: sampled statistics, seeding, every bad input."""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servesim.errors import CompileError, WorkloadError
from servesim.workloads import build_workload
from servesim.workloads.spec import SessionSource, SyntheticSource, workload_to_data

N = 20_000  # a large sample: the sampled mean and spread settle within a few percent


def synthetic(input_tokens: Any = 100, output_tokens: Any = 8, *, seed: int | None = 7,
              requests: int = N, **more: Any) -> dict[str, Any]:
    source = {"type": "synthetic", "input_tokens": input_tokens, "output_tokens": output_tokens,
              **more}
    if seed is not None:
        source["seed"] = seed
    return {"source": source, "load": {"type": "concurrency", "concurrency": requests},
            "stop": {"requests": requests}}


def lengths(spec: dict[str, Any], base_dir: Path | None = None) -> list[tuple[int, int]]:
    """(input, output) length of every request of a closed-loop workload, in id order."""
    with build_workload(spec, base_dir=base_dir) as w:
        return [(s.input_length, s.output_length) for s in w.start()]


def inputs(table: dict[str, Any], **kw: Any) -> list[int]:
    return [i for i, _ in lengths(synthetic(table, **kw))]


def cv(xs: list[int]) -> float:
    return statistics.pstdev(xs) / statistics.fmean(xs)


# -- sampled statistics -----------------------------------------------------------------------


def test_uniform_min_max_covers_the_range_evenly() -> None:
    xs = inputs({"distribution": "uniform", "min": 100, "max": 300})
    assert min(xs) == 100 and max(xs) == 300
    assert statistics.fmean(xs) == pytest.approx(200, rel=0.01)
    # a uniform spread over [a, b] has the standard deviation (b - a) / sqrt(12)
    assert statistics.pstdev(xs) == pytest.approx(200 / math.sqrt(12), rel=0.03)


def test_uniform_mean_and_range_ratio_spread_around_the_mean() -> None:
    xs = inputs({"distribution": "uniform", "mean": 1000, "range_ratio": 0.5})
    assert min(xs) == 500 and max(xs) == 1500
    assert statistics.fmean(xs) == pytest.approx(1000, rel=0.01)


def test_uniform_lengths_stay_within_the_token_limit() -> None:
    xs = inputs({"distribution": "uniform", "mean": 2**24, "range_ratio": 1.0}, requests=5000)
    assert max(xs) <= 2**24 and min(xs) >= 1
    assert statistics.fmean(xs) == pytest.approx(2**23, rel=0.05)  # over [1, 2^24]


def test_normal_lengths_have_the_mean_and_std() -> None:
    xs = inputs({"distribution": "normal", "mean": 1000, "std": 200})
    assert statistics.fmean(xs) == pytest.approx(1000, rel=0.01)
    assert statistics.pstdev(xs) == pytest.approx(200, rel=0.03)


def test_normal_lengths_are_clipped_to_min_and_max() -> None:
    xs = inputs({"distribution": "normal", "mean": 100, "std": 400, "max": 500})
    assert min(xs) == 1 and max(xs) == 500  # the default min is one token
    assert Counter(xs)[1] > N // 10  # the mass below 1 lands on 1


def test_lognormal_mean_and_std_are_the_lengths_own() -> None:
    xs = inputs({"distribution": "lognormal", "mean": 2000, "std": 800})
    assert statistics.fmean(xs) == pytest.approx(2000, rel=0.02)
    assert cv(xs) == pytest.approx(0.4, rel=0.05)
    assert statistics.median(xs) < statistics.fmean(xs)  # skewed to the right


def test_lognormal_mu_and_sigma_are_of_the_logarithm() -> None:
    xs = inputs({"distribution": "lognormal", "mu": 7.0, "sigma": 0.5})
    assert statistics.median(xs) == pytest.approx(math.exp(7.0), rel=0.02)
    assert statistics.pstdev([math.log(x) for x in xs]) == pytest.approx(0.5, rel=0.03)


def test_output_lengths_are_drawn_too() -> None:
    outs = [o for _, o in lengths(synthetic(100, {"distribution": "normal", "mean": 300,
                                                  "std": 60}))]
    assert statistics.fmean(outs) == pytest.approx(300, rel=0.01)
    assert cv(outs) == pytest.approx(0.2, rel=0.05)


def test_empirical_csv_draws_rows_and_pairs_input_with_output(tmp_path: Path) -> None:
    (tmp_path / "lengths.csv").write_text(
        "input_length,output_length\n100,10\n200,20\n\n300,30\n400,40\n")
    table = {"distribution": "empirical", "path": "lengths.csv"}
    drawn = lengths(synthetic(table, dict(table)), base_dir=tmp_path)
    assert set(drawn) == {(100, 10), (200, 20), (300, 30), (400, 40)}  # one row for both
    counts = Counter(drawn)
    assert all(c == pytest.approx(N / 4, rel=0.05) for c in counts.values())


def test_empirical_csv_with_one_column_or_a_named_one(tmp_path: Path) -> None:
    (tmp_path / "one.csv").write_text("\ufefftokens\r\n5\r\n6\r\n")  # a spreadsheet's
    (tmp_path / "two.csv").write_text("isl,osl\n5,50\n6,60\n")
    one = {"distribution": "empirical", "path": "one.csv"}
    two = {"distribution": "empirical", "path": "two.csv", "column": "osl"}
    drawn = lengths(synthetic(one, two, requests=200), base_dir=tmp_path)
    assert {i for i, _ in drawn} == {5, 6} and {o for _, o in drawn} == {50, 60}


def test_empirical_mooncake_rows_give_their_lengths(tmp_path: Path) -> None:
    rows = [{"input_length": 700, "output_length": 10, "hash_ids": [1, 2]},
            {"input_length": 30, "output_length": 3, "hash_ids": [5]}]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = {"distribution": "empirical", "path": "t.jsonl"}
    assert set(lengths(synthetic(table, dict(table), requests=100), base_dir=tmp_path)) == {
        (700, 10), (30, 3)}


def test_session_turns_draw_their_own_lengths(simulate: Callable[..., Any]) -> None:
    spec = {"source": {"type": "synthetic-session", "turns": 3, "seed": 1,
                       "new_input_tokens_per_turn": {"distribution": "uniform", "min": 10,
                                                     "max": 90},
                       "output_tokens_per_turn": {"distribution": "normal", "mean": 20,
                                                  "std": 5}},
            "load": {"type": "concurrency", "concurrency": 50}, "stop": {"sessions": 200}}
    served = [s for s, _ in simulate(build_workload(spec))]
    assert len(served) == 600
    by_id = {s.request_id: s for s in served}
    new_inputs = []
    for s in served:
        prev = by_id.get(s.request_id - 1) if s.turn_index else None
        base = 0 if prev is None else prev.input_length + prev.output_length
        new_inputs.append(s.input_length - base)  # the prompt grows by this turn's input
    assert min(new_inputs) == 10 and max(new_inputs) == 90
    assert statistics.fmean(s.output_length for s in served) == pytest.approx(20, rel=0.05)


# -- seeding ------------------------------------------------------------------------------------


LOGNORMAL = {"distribution": "lognormal", "mean": 2000, "std": 800}


def test_same_seed_same_lengths_other_seed_other_lengths() -> None:
    a = lengths(synthetic(LOGNORMAL, dict(LOGNORMAL), requests=500, seed=3))
    assert a == lengths(synthetic(LOGNORMAL, dict(LOGNORMAL), requests=500, seed=3))
    assert a != lengths(synthetic(LOGNORMAL, dict(LOGNORMAL), requests=500, seed=4))


def test_lengths_do_not_depend_on_the_load_or_the_stop() -> None:
    closed = lengths(synthetic(LOGNORMAL, requests=300))
    spec = synthetic(LOGNORMAL, requests=100)
    spec["load"] = {"type": "poisson", "requests_per_second": 5.0}
    assert lengths(spec) == closed[:100]


def test_every_replay_of_a_workload_draws_the_same_lengths() -> None:
    w = build_workload(synthetic(LOGNORMAL, requests=50))
    assert [s.input_length for s in w.start()] == [s.input_length for s in w.start()]


def test_traffic_seed_seeds_lengths_and_arrivals(
        compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    src = 'input_tokens = { distribution = "lognormal", mean = 2000, std = 800 }'
    payload = compile_toml(config(src, 'type = "gamma"\nrequests_per_second = 2\ncv = 3',
                                  traffic="seed = 9"))
    assert payload.workload.source.seed == 9 and payload.workload.load.seed == 9
    # unseeded: the arrivals' default seed, 42
    payload = compile_toml(config(src))
    assert payload.workload.source.seed == 42


def test_a_fixed_length_config_is_unchanged(
        compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    from servesim.payload import payload_to_dict

    payload = compile_toml(config("input_tokens = 512"))
    assert payload.workload.source == SyntheticSource(input_tokens=512)
    assert "seed" not in payload_to_dict(payload)["workload"]["source"]


def test_a_drawn_workload_round_trips_through_its_json(
        compile_toml: Callable[..., Any], config: Callable[..., str], tmp_path: Path) -> None:
    from servesim.payload import dump_payload, load_payload

    (tmp_path / "l.csv").write_text("output_length\n4\n")
    payload = compile_toml(config(
        'type = "synthetic-session"\n'
        'new_input_tokens_per_turn = { distribution = "normal", mean = 50, std = 5 }\n'
        'output_tokens_per_turn = { distribution = "empirical", path = "l.csv" }',
        stop="sessions = 2"))
    source = payload.workload.source
    assert isinstance(source, SessionSource) and source.output_tokens_per_turn.format == "csv"
    text = dump_payload(payload, relative_to=str(tmp_path))
    assert '"path": "l.csv"' in text
    assert load_payload(json.loads(text)).workload.source == attrs_relative(source)


def attrs_relative(source: SessionSource) -> SessionSource:
    import attrs

    length = source.output_tokens_per_turn
    assert not isinstance(length, int)
    return attrs.evolve(source, output_tokens_per_turn=attrs.evolve(length, path="l.csv"))


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("table", "message"), [
    ('{ distribution = "lognormal", std = 800 }',
     "traffic.source.input_tokens.mean: std requires mean [traffic-length]"),
    ('{ distribution = "normal", mean = 800 }',
     "traffic.source.input_tokens.std: mean requires std [traffic-length]"),
    ('{ distribution = "normal" }',
     "traffic.source.input_tokens.mean: normal requires mean [traffic-length]"),
    ('{ distribution = "uniform", min = 5 }',
     "traffic.source.input_tokens.max: min requires max [traffic-length]"),
    ('{ distribution = "lognormal", mean = 9, std = 1, mu = 2 }',
     "traffic.source.input_tokens: lognormal: give mean and std, or mu and sigma, not both "
     "[traffic-length]"),
    ('{ distribution = "normal", mean = 9, std = 1, range_ratio = 0.5 }',
     "traffic.source.input_tokens.range_ratio: distribution 'normal' does not accept "
     "range_ratio [traffic-length]"),
    ('{ distribution = "uniform", min = 50, max = 10 }',
     "traffic.source.input_tokens.min: min (50) must be <= max (10) [traffic-length]"),
    ('{ distribution = "empirical" }',
     "traffic.source.input_tokens.path: empirical requires path [traffic-length]"),
    ('{ distribution = "normal", mean = nan, std = 1 }',
     "traffic.source.input_tokens.mean: expected a finite number, got nan [not-finite]"),
    ('{ distribution = "normal", mean = 100, std = -1 }',
     "traffic.source.input_tokens.std: must be in [0, 2^24], got -1 [out-of-range]"),
    ('{ distribution = "normal", mean = 1e30, std = 1 }',
     "traffic.source.input_tokens.mean: must be in (0, 2^24], got 1e+30 [out-of-range]"),
    ('{ distribution = "lognormal", mu = 40, sigma = 1 }',
     "traffic.source.input_tokens.mu: must be in [0, 16.635532333438686], got 40 "
     "[out-of-range]"),
    ('{ distribution = "poisson", mean = 3 }',
     "traffic.source.input_tokens.distribution: expected one of \"uniform\", \"normal\", "
     "\"lognormal\", \"empirical\", got string 'poisson' [bad-choice]"),
    ('{ mean = 3 }',
     "traffic.source.input_tokens.distribution: required key 'distribution' is missing "
     "[missing-key]"),
    ('"many"',
     "traffic.source.input_tokens: expected an integer or a table, got string 'many' "
     "[wrong-type]"),
])
def test_a_bad_length_table_names_its_key(
        compile_toml: Callable[..., Any], config: Callable[..., str], table: str,
        message: str) -> None:
    with pytest.raises(CompileError) as err:
        compile_toml(config(f"input_tokens = {table}"))
    assert message in [d.render().split("\n")[0] for d in err.value.diagnostics]


def test_a_bad_length_table_has_a_hint_with_an_example(
        compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    with pytest.raises(CompileError) as err:
        compile_toml(config('output_tokens = { distribution = "lognormal", std = 800 }'))
    (d,) = err.value.diagnostics
    assert d.hint == 'write { distribution = "lognormal", mean = 2000, std = 800 }'


@pytest.mark.parametrize(("source", "message"), [
    ('input_tokens = { distribution = "normal", mean = 500, std = 50 }\n'
     "cached_prefix_tokens = 40",
     "traffic.source.cached_prefix_tokens: cached_prefix_tokens must be <= the shortest prompt "
     "(input_tokens gives 1 tokens or more), got 40; raise input_tokens.min [traffic-value]"),
    ('input_tokens = { distribution = "uniform", mean = 100, range_ratio = 0.5 }\n'
     "cached_prefix_tokens = 60",
     "traffic.source.cached_prefix_tokens: cached_prefix_tokens must be <= the shortest prompt "
     "(input_tokens gives 50 tokens or more), got 60; raise input_tokens.min [traffic-value]"),
    ('output_tokens = { distribution = "normal", mean = 500, std = 50 }\n'
     "output_range_ratio = 0.2",
     "traffic.source.output_range_ratio: output_range_ratio spreads a fixed output_tokens; "
     "with a distribution, write output_tokens = { distribution = \"uniform\", mean = N, "
     "range_ratio = R } [traffic-value]"),
])
def test_length_tables_meet_the_other_source_keys(
        compile_toml: Callable[..., Any], config: Callable[..., str], source: str,
        message: str) -> None:
    with pytest.raises(CompileError) as err:
        compile_toml(config(source))
    assert [d.render() for d in err.value.diagnostics] == [message]


def test_a_cached_prefix_within_the_shortest_prompt_is_accepted(
        compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    payload = compile_toml(config('input_tokens = { distribution = "normal", mean = 500, '
                                  "std = 50, min = 100 }\ncached_prefix_tokens = 100"))
    table = workload_to_data(payload.workload)["source"]["input_tokens"]
    drawn = lengths(synthetic(table, cached_prefix_tokens=100, requests=200))
    assert min(i for i, _ in drawn) >= 100


def test_a_bad_length_table_in_a_payload_is_refused_at_its_traffic_key() -> None:
    with pytest.raises(WorkloadError) as err:
        build_workload(synthetic({"distribution": "normal", "std": 3}))
    assert [d.render() for d in err.value.diagnostics] == [
        "traffic.source.input_tokens.mean: std requires mean [traffic-length]\n"
        '  hint: write { distribution = "normal", mean = 2000, std = 800 }']


@pytest.mark.parametrize(("name", "text", "message"), [
    ("missing.csv", None, "missing.csv: file not found [file-not-found]"),
    ("empty.csv", "", "traffic.source.input_tokens.path: {path} holds no lengths "
     "[traffic-length]"),
    ("blank.csv", "\n\n", "traffic.source.input_tokens.path: {path} holds no lengths "
     "[traffic-length]"),
    ("header.csv", "input_length\n", "traffic.source.input_tokens.path: {path} holds no "
     "lengths [traffic-length]"),
    ("short.csv", "a,input_length\n1,2\n3\n", "{path}:3: row has 1 fields, the column is "
     "field 2 [bad-length-file]"),
    ("words.csv", "input_length\n12\ntwelve\n", "{path}:3: expected a length, got 'twelve' "
     "[bad-length-file]"),
    ("neg.csv", "input_length\n-4\n", "{path}:2: expected a length, got '-4' "
     "[bad-length-file]"),
    ("huge.csv", "input_length\n99999999999\n", "{path}:2: length 99999999999 is over "
     "16777216 tokens [bad-length-file]"),
    ("columns.csv", "isl,osl\n1,2\n", "traffic.source.input_tokens.column: {path} has no "
     "column 'input_length' (header: isl, osl) [traffic-length]"),
    ("missing.jsonl", None, "missing.jsonl: trace file not found [trace-unreadable]"),
    ("empty.jsonl", "", "traffic.source.input_tokens.path: {path} holds no lengths "
     "[traffic-length]"),
    ("cut.jsonl", '{"input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"input_len',
     "{path}:2: *"),
])
def test_a_bad_empirical_file_is_refused_before_the_replay(
        tmp_path: Path, name: str, text: str | None, message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    spec = synthetic({"distribution": "empirical", "path": str(path)})
    with pytest.raises(WorkloadError) as err:
        build_workload(spec)
    (line,) = [d.render().split("\n")[0] for d in err.value.diagnostics]
    expected = message.format(path=path)
    if expected.endswith("*"):
        assert line.startswith(expected[:-1])
    else:
        assert line == expected.replace(f"{name}:", f"{path}:", 1) if text is None else expected


def test_validate_reports_a_missing_empirical_file(
        tmp_path: Path, compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import check_input_files

    payload = compile_toml(config('input_tokens = { distribution = "empirical", '
                                  'path = "gone.csv" }'))
    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    diags = check_input_files(payload, registry=registry, base_dir=tmp_path)
    assert [d.render() for d in diags] == [
        f"{tmp_path / 'gone.csv'}: file not found [file-not-found]\n"
        "  hint: check traffic.source.input_tokens.path (relative to the config file)"]


def test_a_session_length_table_is_checked_at_its_key(
        compile_toml: Callable[..., Any], config: Callable[..., str]) -> None:
    with pytest.raises(CompileError) as err:
        compile_toml(config('type = "synthetic-session"\n'
                            'output_tokens_per_turn = { distribution = "uniform", max = 9 }',
                            stop="sessions = 2"))
    assert [d.render().split("\n")[0] for d in err.value.diagnostics] == [
        "traffic.source.output_tokens_per_turn.min: max requires min [traffic-length]"]
