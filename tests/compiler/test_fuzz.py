"""Property tests: any document either compiles or fails with diagnostics, never a crash.

Two generators feed ``compile_source``: structure-aware random documents (tables over
the real key names of the config model, with values of random types) and random
mutations of every example config (drop, replace or insert keys, change value types,
delete or duplicate lines). The property: the result is a :class:`Payload`, or a
:class:`ServesimError` whose diagnostics render to text; any other exception is a bug.
"""

from __future__ import annotations

import io
import json
import math
import types
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from servesim import catalog
from servesim.compiler import SourceText, compile_source
from servesim.compiler.model.parsed import Engine, ParsedConfig, Traffic, Worker
from servesim.compiler.model.resolved import ResolvedConfig
from servesim.compiler.source import tomllib
from servesim.errors import ServesimError
from servesim.payload import Payload, dump_payload, load_payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.render import resolved_tree

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.toml"))
REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --- a tiny TOML writer (inline tables only; enough for any JSON-like value) -------------

def _key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(type(v))


def dumps(doc: dict[str, Any]) -> str:
    return "".join(f"{_key(k)} = {_value(v)}\n" for k, v in doc.items())


def test_writer_round_trips() -> None:
    doc = {"a": {"b c": [1, 2.5, "x\n\"y\""], "d": {}}, "e": True, "f": -(2**64)}
    assert tomllib.loads(dumps(doc)) == doc


# --- value strategies -----------------------------------------------------------------

WORDS = st.sampled_from([
    "auto", "max", "fixed", "default", "vllm", "sglang", "trtllm", "aggregated",
    "disaggregated", "afd", "prefill", "decode", "mtp", "ngram", "fp8", "bfloat16",
    "synthetic", "synthetic-session", "trace", "mooncake", "concurrency", "poisson",
    "constant_rate", "trace_timestamps", "polynomial", "table", "destination_missing",
    "full_prompt", "Qwen/Qwen3-32B", "moonshotai/Kimi-K3", "Qwen/Qwen3.5-35B-A3B",
    "deepseek-ai/DeepSeek-V3", "meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "b200_sxm",
    "h100_sxm", "l40s", "", " ", "trace.jsonl", "float16", "float32", "int8", "nvfp4",
])
INTS = st.one_of(
    st.integers(-3, 10), st.sampled_from([16, 64, 128, 512, 1536, 8192, 2**20, 2**31,
                                          2**53, 2**63 - 1, 2**64 - 1, 2**64, -(2**63)]),
    st.integers(-(2**70), 2**70))
FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([0.0, 0.5, 0.8, 1.0, 2.2, 3.0, -0.0, 1e-300, 1e300]))
SCALARS = st.one_of(INTS, FLOATS, WORDS, st.text(max_size=8), st.booleans())
ANY_VALUE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.text(max_size=6), inner, max_size=3)),
    max_leaves=6)


def _members(tp: Any) -> list[Any]:
    if get_origin(tp) in (Union, types.UnionType):
        return [m for m in get_args(tp) if m is not type(None)]
    return [tp]


NAMES = st.sampled_from(["Qwen/Qwen3-32B", "moonshotai/Kimi-K3", "Qwen/Qwen3.5-35B-A3B",
                         "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-20b", "h200_sxm",
                         "b200_sxm", "h100_sxm", "l40s", "trace.jsonl"])
SMALL_INTS = st.one_of(st.integers(1, 8), st.sampled_from([16, 64, 128, 512, 1536, 8192]))
SMALL_FLOATS = st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0, 2.0, 2.2, 3.0, 10.0])


def _typed(tp: Any, depth: int, wild: bool) -> st.SearchStrategy[Any]:
    """Well-typed values for ``tp``; when ``wild``, edge numbers and values of any type."""
    options: list[st.SearchStrategy[Any]] = []
    for m in _members(tp):
        if get_origin(m) is Literal:
            options.append(st.sampled_from(get_args(m)))
        elif m is bool:
            options.append(st.booleans())
        elif m is int:
            options.append(INTS if wild else SMALL_INTS)
        elif m is float:
            options.append(st.one_of(FLOATS, INTS) if wild else SMALL_FLOATS)
        elif m is str:
            options.append(WORDS if wild else NAMES)
        elif get_origin(m) is list:
            options.append(st.lists(_typed(get_args(m)[0], depth, wild), max_size=6))
        elif attrs.has(m):
            options.append(_table(m, wild, depth + 1) if depth < 8 else st.just({}))
        else:  # dict[str, Any] (afd, host_offload, ...)
            options.append(st.dictionaries(st.text(max_size=6), SCALARS, max_size=2))
    typed = st.one_of(*options)
    return st.one_of(typed, typed, ANY_VALUE) if wild else typed


def _table(cls: type, wild: bool, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    hints = get_type_hints(cls)
    fields = attrs.fields(cls)
    required = {f.name: _typed(hints[f.name], depth, wild) for f in fields
                if f.default is attrs.NOTHING}
    optional = {f.name: _typed(hints[f.name], depth, wild) for f in fields
                if f.default is not attrs.NOTHING}
    extra = st.dictionaries(st.sampled_from(["blok_size", "tokens_per_block", "x", "Mode",
                                             "prefill_block_size"]), SCALARS, max_size=1)

    @st.composite
    def build(draw: st.DrawFn) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # required keys are present most of the time, so later passes get exercised
        if not wild or draw(st.integers(0, 9)) > 0:
            out.update(draw(st.fixed_dictionaries(required)))
        else:
            out.update(draw(st.fixed_dictionaries({}, optional=required)))
        # a sparse table (few keys) passes the shape rules more often than a dense one
        odds = draw(st.sampled_from([1, 3, 5])) if not wild else 5
        for name, strategy in optional.items():
            if draw(st.integers(0, 9)) < odds:
                out[name] = draw(strategy)
        if wild and draw(st.integers(0, 9)) == 0:
            out.update(draw(extra))
        return out

    return build()


@st.composite
def _deployments(draw: st.DrawFn) -> dict[str, Any]:
    """A valid skeleton (model, GPU, roles matching the mode) with sparse random settings."""
    mode = draw(st.sampled_from([None, "aggregated", "disaggregated"]))
    roles = ["prefill", "decode"] if mode == "disaggregated" else ["aggregated"]
    engine: dict[str, Any] = {
        "model": draw(st.sampled_from(catalog.model_names())),
        "hardware": draw(st.sampled_from(catalog.gpu_names())),
        "workers": {r: draw(_table(Worker, wild=False)) for r in roles},
    }
    if mode is not None:
        engine["mode"] = mode
    hints = get_type_hints(Engine)
    for key in ("backend", "kvcache_quant_mode", "gemm_quant_mode", "context_length",
                "enable_chunked_prefill", "nextn"):
        if draw(st.integers(0, 9)) < 2:
            engine[key] = draw(_typed(hints[key], 0, wild=False))
    if "nextn" in engine:
        engine["nextn_accepted"] = draw(SMALL_FLOATS)
    doc: dict[str, Any] = {"engine": engine}
    if draw(st.booleans()):
        doc["traffic"] = draw(_table(Traffic, wild=False))
    return doc


DOCUMENTS = st.one_of(_deployments(), _table(ParsedConfig, wild=False),
                      _table(ParsedConfig, wild=True))


def check(text: str, base_dir: Path | None = None) -> None:
    """The property: a payload or diagnostics; every stage's artifact can be shown and the
    payload survives its JSON round trip."""
    artifacts: list[Any] = []
    source = SourceText(text=text, name="fuzz.toml", base_dir=base_dir)
    try:
        payload = compile_source(source, registry=REGISTRY,
                                 on_stage=lambda _stage, a: artifacts.append(a))
    except ServesimError as exc:
        assert exc.diagnostics, "a ServesimError must carry at least one diagnostic"
        for d in exc.diagnostics:
            assert isinstance(d.render(), str) and d.code and d.message
        payload = None
    for artifact in artifacts:
        json.dumps(artifact.to_data())
        if isinstance(artifact, ResolvedConfig):
            Console(file=io.StringIO(), width=100).print(resolved_tree(artifact))
    if payload is not None:
        assert isinstance(payload, Payload)
        assert load_payload(json.loads(dump_payload(payload))) == payload


@FUZZ
@given(DOCUMENTS)
def test_random_documents_compile_or_diagnose(doc: dict[str, Any]) -> None:
    check(dumps(doc))


# --- mutations of the example configs --------------------------------------------------

def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def _all_keys(cls: type, seen: set[type] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    seen.add(cls)
    hints = get_type_hints(cls)
    out = set()
    for f in attrs.fields(cls):
        out.add(f.name)
        for m in _members(hints[f.name]):
            if attrs.has(m) and m not in seen:
                out |= _all_keys(m, seen)
    return out


KNOWN_KEYS = sorted(_all_keys(ParsedConfig))


@st.composite
def mutated(draw: st.DrawFn) -> tuple[str, Path]:
    path = draw(st.sampled_from(EXAMPLE_FILES))
    text = path.read_text(encoding="utf-8")
    kind = draw(st.sampled_from(["tree"] * 4 + ["lines"]))
    if kind == "lines":
        lines = text.splitlines()
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(lines) - 1))
            op = draw(st.sampled_from(["drop", "dup", "swap"]))
            if op == "drop":
                del lines[i]
            elif op == "dup":
                lines.insert(i, lines[i])
            else:
                j = draw(st.integers(0, len(lines) - 1))
                lines[i], lines[j] = lines[j], lines[i]
            if not lines:
                break
        return "\n".join(lines) + "\n", path.parent
    doc = tomllib.loads(text)
    for _ in range(draw(st.integers(1, 4))):
        targets = _paths(doc)[1:]
        if not targets:
            break
        target = draw(st.sampled_from(targets))
        parent, last = _get(doc, target[:-1]), target[-1]
        op = draw(st.sampled_from(["drop", "replace", "insert", "retype"]))
        if op == "drop":
            del parent[last]
        elif op == "replace":
            parent[last] = draw(ANY_VALUE)
        elif op == "retype":
            old = parent[last]
            parent[last] = draw(st.one_of(SCALARS, st.just([old]), st.just({"value": old}),
                                          st.just(str(old))))
        else:
            container = parent[last] if isinstance(parent[last], dict) else parent
            if isinstance(container, dict):
                container[draw(st.sampled_from(KNOWN_KEYS))] = draw(ANY_VALUE)
    return dumps(doc), path.parent


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_examples_compile(example: Path) -> None:
    text = example.read_text(encoding="utf-8")
    check(text, example.parent)
    assert isinstance(compile_source(SourceText(text=text, base_dir=example.parent),
                                     registry=REGISTRY), Payload)


@FUZZ
@given(mutated())
def test_mutated_examples_compile_or_diagnose(case: tuple[str, Path]) -> None:
    text, base_dir = case
    check(text, base_dir)
