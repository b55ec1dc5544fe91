"""The bad-input corpus (tests/corpus) through the CLI: exit code and exact stderr lines.

See tests/corpus/README.md for the layout. Besides the committed cases, numbers at and
past every limit of :mod:`servesim.limits` are generated here from the attrs metadata of
the parsed config and of the payload, and pinned in ``tests/corpus/limits.golden``.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from servesim.cli import main
from servesim.compiler.model.parsed import ParsedConfig
from servesim.errors import format_path
from servesim.payload import GpuPriceArgs, Payload, RoleArgs, role_field_path
from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

from .conftest import Golden

CORPUS = Path(__file__).resolve().parent / "corpus"
CODES = ("[out-of-range]", "[not-finite]", "[wrong-type]")


# -- running the CLI -------------------------------------------------------------------------

@attrs.frozen
class Outcome:
    code: int
    stdout: str
    stderr: list[str]


def run_cli(argv: list[str], cwd: Path, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> Outcome:
    monkeypatch.chdir(cwd)
    # entry-point plugins (e.g. the example plugin) would change the registered names
    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    # files are named relative to the case's folder (trace locations come out absolute)
    err = captured.err.replace(f"{cwd.resolve()}{os.sep}", "")
    return Outcome(code, captured.out, err.splitlines())


@attrs.frozen
class Expected:
    exit: int
    command: list[str]
    report: dict[str, str]
    stderr: list[str]


def read_expected(path: Path, default_command: str) -> Expected:
    head, _, body = path.read_text(encoding="utf-8").partition("---\n")
    fields: dict[str, str] = {}
    report: dict[str, str] = {}
    for line in head.splitlines():
        key, _, value = line.partition(":")
        if key == "report":
            name, _, want = value.strip().partition("=")
            report[name] = want
        else:
            fields[key] = value.strip()
    return Expected(int(fields["exit"]), fields.get("command", default_command).split(),
                    report, body.splitlines())


def render_expected(expected: Expected, outcome: Outcome, default_command: str) -> str:
    head = [f"exit: {outcome.code}"]
    if expected.command != default_command.split():
        head.append(f"command: {' '.join(expected.command)}")
    head += [f"report: {k}={v}" for k, v in expected.report.items()]
    return "\n".join([*head, "---", *outcome.stderr]) + "\n"


# -- the committed cases ---------------------------------------------------------------------

def million_identical_hash_ids(path: Path) -> None:
    """A million copies of one hash id that claim all 16M tokens and can never fit the
    pool, after a row of 250 copies that fits."""
    few, ids = json.dumps([7] * 250), json.dumps([7] * 1_000_000)
    path.write_text(
        f'{{"timestamp": 0, "input_length": 4000, "output_length": 2, "hash_ids": {few}}}\n'
        f'{{"timestamp": 1, "output_length": 2, "hash_ids": {ids}}}\n', encoding="utf-8")


GENERATED = {"trace/million_identical_hash_ids": million_identical_hash_ids}
DEFAULT = {"config": "validate", "trace": "replay --quiet --format json",
           "payload": "replay --quiet --format json"}
SUFFIX = {"config": ".toml", "trace": ".jsonl", "payload": ".json"}


def cases() -> Iterator[str]:
    for kind, suffix in SUFFIX.items():
        for path in sorted((CORPUS / kind).glob(f"*{suffix}")):
            if not path.name.startswith("_"):
                yield f"{kind}/{path.stem}"
    yield from GENERATED


def test_every_case_has_an_expected_file_and_every_expected_file_a_case() -> None:
    expected = {f"{p.parent.name}/{p.stem}" for p in CORPUS.glob("*/*.expected")}
    assert expected == set(cases())


@pytest.mark.parametrize("case", list(cases()))
def test_corpus_case(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                     monkeypatch: pytest.MonkeyPatch, golden: Golden) -> None:
    kind, name = case.split("/")
    expected_path = CORPUS / kind / f"{name}.expected"
    default = DEFAULT[kind]
    expected = read_expected(expected_path, default) if expected_path.exists() \
        else Expected(1, default.split(), {}, [])
    if kind == "config":
        target = f"{name}.toml"
        shutil.copy(CORPUS / kind / target, tmp_path / target)
    elif kind == "trace":
        target = "cfg.toml"
        shutil.copy(CORPUS / "trace" / "_harness.toml", tmp_path / target)
        if case in GENERATED:
            GENERATED[case](tmp_path / "trace.jsonl")
        else:
            shutil.copy(CORPUS / kind / f"{name}.jsonl", tmp_path / "trace.jsonl")
    else:
        target = f"{name}.json"
        shutil.copy(CORPUS / kind / target, tmp_path / target)
    command = expected.command
    outcome = run_cli([command[0], target, *command[1:]], tmp_path, capsys, monkeypatch)
    golden.check(expected_path, render_expected(expected, outcome, default))
    assert (outcome.code, outcome.stderr) == (expected.exit, expected.stderr)
    if expected.report:
        report = json.loads(outcome.stdout)
        assert {k: json.dumps(report[k]) for k in expected.report} == expected.report


def test_a_million_identical_hash_ids_make_a_one_segment_prompt(tmp_path: Path) -> None:
    """Memory per request does not grow with repeated hash ids: consecutive copies of one
    id merge into a single run of tokens (the replay itself is the corpus case)."""
    from servesim.workloads import build_workload

    million_identical_hash_ids(tmp_path / "trace.jsonl")
    spec = {"source": {"type": "trace", "path": str(tmp_path / "trace.jsonl"),
                       "format": "mooncake", "block_size": 16},
            "load": {"type": "trace_timestamps", "speedup": 1.0}, "stop": {}}
    with build_workload(spec, base_dir=tmp_path) as workload:
        requests = list(workload.start())
    assert [(r.input_length, len(r.prompt)) for r in requests] == [(4000, 1), (16_000_000, 1)]


# -- numbers at and past every limit ---------------------------------------------------------

@attrs.frozen
class Limit:
    path: tuple[str, ...]  # where the value goes in the document
    lo: float | None
    hi: float | None
    lo_open: bool
    integer: bool
    in_list: bool


def _limits(cls: type, path: tuple[str, ...], place: dict[type, tuple[str, ...]]
            ) -> Iterator[Limit]:
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        hint = hints[f.name]
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        args = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
        if typing.get_origin(hint) is dict and attrs.has(typing.get_args(hint)[1]):
            args = [typing.get_args(hint)[1]]  # payload roles: one entry per role
        nested = next((a for a in args if attrs.has(a)), None)
        if nested is not None:
            yield from _limits(nested, place.get(nested, (*path, f.name)), place)
        if not ({"lo", "hi"} & set(f.metadata)):  # a number or a table: both are bounded
            continue
        in_list = any(typing.get_origin(a) in (list, tuple) for a in args)
        scalars = [typing.get_args(a)[0] if typing.get_origin(a) in (list, tuple) else a
                   for a in args]
        integer = int in scalars and float not in scalars
        yield Limit((*path, f.name), f.metadata.get("lo"), f.metadata.get("hi"),
                    bool(f.metadata.get("lo_open")), integer, in_list)


def _variants(limit: Limit) -> list[Any]:
    lo, hi = limit.lo, limit.hi
    values: list[Any] = []
    if lo is not None:
        values += [lo, lo - 1]
    if hi is not None:
        values += [hi, hi + 1 if limit.integer else hi * 2]
    values += [0, -1, 2**64]
    values = [int(v) for v in values] if limit.integer else [float(v) for v in values]
    out: list[Any] = []
    for v in values:
        if v not in out:
            out.append(v)
    return [*out, math.nan, math.inf, -math.inf]


def _bad(limit: Limit, v: Any) -> bool:
    if isinstance(v, float) and not math.isfinite(v):
        return True
    if limit.lo is not None and (v < limit.lo or (limit.lo_open and v == limit.lo)):
        return True
    return limit.hi is not None and v > limit.hi


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if doc.get(key) is None:  # an absent or null table (a payload's "sla": null)
            doc[key] = {}
        doc = doc[key]
    doc[path[-1]] = value


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"


NORMAL = {"distribution": "normal", "mean": 1000, "std": 100}
LENGTHS: dict[str, dict[str, Any]] = {  # a length table that reads the bounded key
    "mean": NORMAL, "std": NORMAL, "min": NORMAL, "max": NORMAL,
    "range_ratio": {"distribution": "uniform", "mean": 1000, "range_ratio": 0.1},
    "mu": {"distribution": "lognormal", "mu": 7, "sigma": 0.5},
    "sigma": {"distribution": "lognormal", "mu": 7, "sigma": 0.5}}
SPECULATION = {"kind": "mtp", "num_speculative_tokens": 1, "acceptance_rates": [0.5]}
CONFIG_BASE: dict[str, Any] = {
    "engine": {"model": "Qwen/Qwen3-32B", "hardware": "h200_sxm",
               "workers": {"aggregated": {}}}}


def config_limit_cases() -> Iterator[tuple[str, str, Limit, Any]]:
    """(case id, TOML text, limit, value) for every bounded field of the parsed config."""
    from servesim.compiler.model.parsed import Worker

    place = {Worker: ("engine", "workers", "aggregated")}
    for limit in _limits(ParsedConfig, (), place):
        for v in _variants(limit):
            doc = copy.deepcopy(CONFIG_BASE)
            if limit.path[:2] == ("engine", "speculation"):
                doc["engine"]["speculation"] = dict(SPECULATION)
            if limit.path[-2] == "host_offload" and not limit.path[-1].startswith("capacity"):
                _set(doc, limit.path[:-1], {"capacity_blocks": 1})  # the one capacity it needs
            if limit.path[:2] == ("traffic", "source") and limit.path[2] != "session" \
                    and len(limit.path) == 4:
                _set(doc, limit.path[:3], dict(LENGTHS[limit.path[3]]))  # a length table
            _set(doc, limit.path, [v] if limit.in_list else v)
            text = "".join(f"{k} = {_toml_value(x)}\n" for k, x in doc.items())
            yield f"config {'.'.join(limit.path)} = {v!r}", text, limit, v


PAYLOAD_BASE = json.loads((CORPUS / "payload" / "valid.json").read_text(encoding="utf-8"))
PAYLOAD_SKELETONS: dict[tuple[str, ...], dict[str, Any]] = {
    ("roles", "aggregated", "speculation"): {**SPECULATION, "seed": 42},
    # one state block of the base role's 4 MiB blocks
    ("roles", "aggregated", "state_cache"): {"bytes_per_request": 1, "state_blocks": 1,
                                             "allocated_bytes_per_request": 4194304},
    ("kv_transfer",): {"bytes_per_token": 1, "bandwidth_gb_per_second": 1.0},
    ("roles", "aggregated", "host_offload"): {"capacity_blocks": 1,
                                              "bandwidth_gb_per_second": 1.0},
    ("gpu_hour_usd", "h200_sxm"): {"usd_per_hour": 1.0, "source": "config"},
}


def payload_limit_cases() -> Iterator[tuple[str, dict[str, Any], Limit, Any]]:
    place = {RoleArgs: ("roles", "aggregated"), GpuPriceArgs: ("gpu_hour_usd", "h200_sxm")}
    for limit in _limits(Payload, (), place):
        if limit.path[0] == "workload":
            # the traffic table's bounds, run by the config cases; a payload at the limit
            # (2^31 requests) would replay for ever
            continue
        for v in _variants(limit):
            doc = copy.deepcopy(PAYLOAD_BASE)
            for prefix, skeleton in PAYLOAD_SKELETONS.items():
                if limit.path[:len(prefix)] == prefix:
                    _set(doc, prefix, copy.deepcopy(skeleton))
            _set(doc, limit.path, [v] if limit.in_list else v)
            yield f"payload {'.'.join(limit.path)} = {v!r}", doc, limit, v


def test_limit_cases_cover_every_bound() -> None:
    """Every bounded field is generated: a new limit gets its cases without a test edit."""
    config = {c[2].path for c in config_limit_cases()}
    payload = {c[2].path for c in payload_limit_cases()}
    assert ("engine", "workers", "aggregated", "parallelism", "replicas") in config
    assert ("traffic", "load", "seed") in config and ("engine", "speculation", "seed") in config
    assert ("roles", "aggregated", "num_gpu_blocks") in payload
    assert ("kv_transfer", "state_bytes") in payload
    assert len(config) >= 50 and len(payload) >= 25


def _anchor(limit: Limit, path: tuple[str | int, ...]) -> str:
    return f"error: {format_path((*path, 0) if limit.in_list else path)}: "


def _check_verdict(label: str, limit: Limit, v: Any, stderr: list[str], *anchors: str
                   ) -> None:
    """Independent of the golden: a bad value is diagnosed where it is, a good one is not."""
    hits = [line for line in stderr if line.startswith(anchors) and line.endswith(CODES)]
    if _bad(limit, v):
        assert hits, f"{label}: not diagnosed: {stderr}"
    else:
        assert not hits, f"{label}: a value within the limit was refused: {hits}"


def test_numbers_at_and_past_every_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch,
                                         golden: Golden) -> None:
    lines: list[str] = []
    for label, text, limit, v in config_limit_cases():
        (tmp_path / "limit.toml").write_text(text, encoding="utf-8")
        outcome = run_cli(["validate", "limit.toml"], tmp_path, capsys, monkeypatch)
        assert outcome.code in (0, 1), label
        _check_verdict(label, limit, v, outcome.stderr, _anchor(limit, limit.path))
        lines += [f"{label} -> exit {outcome.code}", *(f"  {e}" for e in outcome.stderr)]
    for label, doc, limit, v in payload_limit_cases():
        (tmp_path / "limit.json").write_text(json.dumps(doc), encoding="utf-8")
        outcome = run_cli(["replay", "limit.json", "--quiet", "--format", "json"], tmp_path,
                          capsys, monkeypatch)
        assert outcome.code in (0, 1), label
        path = limit.path
        if path[0] == "roles":  # a role's fields are named where they live in a config
            path = (*role_field_path(path[1], path[2]), *path[3:])
        elif path[0] == "sla":
            path = ("evaluation", *path)
        elif path[0] == "gpu_hour_usd":  # a GPU's price, named by the GPU's config key
            path = ("evaluation", *path[:2])
        else:
            path = ("engine", *path)
        # type errors name the payload key, limits the config key the value comes from
        _check_verdict(label, limit, v, outcome.stderr, _anchor(limit, path),
                       _anchor(limit, limit.path))
        lines += [f"{label} -> exit {outcome.code}", *(f"  {e}" for e in outcome.stderr)]
    golden.check(CORPUS / "limits.golden", "\n".join(lines) + "\n")
