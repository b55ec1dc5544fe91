"""servesim's pytest plugin: fixtures for testing servesim plugins the way servesim does.

It is loaded automatically wherever servesim is installed (entry point ``pytest11``; with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, pass ``-p servesim.testing``). Name your plugin
modules in a ``servesim_plugins`` fixture and every other fixture uses them, with
entry-point autoloading off, so a test sees exactly the plugins it asks for::

    # tests/conftest.py
    import pytest

    @pytest.fixture
    def servesim_plugins():
        import my_engine.plugin
        return [my_engine.plugin]

    # tests/test_my_engine.py
    from servesim.testing import small_config

    def test_replays(replay_toml):
        run = replay_toml(small_config(engine="my-engine", options={"x": 2}))
        assert run.report["completed"] == 20

Fixtures: ``servesim_plugins``, ``plugin_manager``, ``engine_registry``,
``compile_toml``, ``replay_toml``, ``servesim_cli``. Helpers: :func:`small_config`,
:func:`rendered`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    import pluggy

    from servesim.errors import ServesimError
    from servesim.payload import Payload
    from servesim.plugins.manager import EngineRegistry


# -- helpers -----------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {value!r} as TOML")


def small_config(*, engine: str | None = None, options: Mapping[str, Any] | None = None,
                 requests: int = 20, input_tokens: int = 256, output_tokens: int = 16,
                 concurrency: int = 4, prefill_ms: float = 10.0, decode_ms: float = 2.0,
                 timing: str = "fixed", blocks: int = 4096, block_size: int = 16,
                 max_sequences: int | None = None, replicas: int = 1,
                 attention_data: int = 1, extra: str = "") -> str:
    """TOML of a small aggregated deployment that replays in milliseconds.

    Qwen3-32B on one H200, a fixed pool of ``blocks`` x ``block_size`` tokens, fixed step
    times (or another ``timing`` type, without the fixed values), ``replicas`` workers of
    ``attention_data`` ranks, ``requests`` synthetic
    requests from ``concurrency`` clients. ``engine``/``options`` fill ``engine.engine``
    and ``[engine.options]``; ``extra`` is appended verbatim.
    """
    lines = ["[engine]", 'model = "Qwen/Qwen3-32B"', 'hardware = "h200_sxm"']
    if engine is not None:
        lines.append(f"engine = {_toml_value(engine)}")
    if options is not None:
        lines.append(f"options = {_toml_value(dict(options))}")
    lines += ["[engine.workers.aggregated.parallelism]", f"replicas = {replicas}"]
    if attention_data != 1:
        lines.append(f"attention_data = {attention_data}")
    if max_sequences is not None:
        lines += ["[engine.workers.aggregated.scheduler]", f"max_sequences = {max_sequences}"]
    lines += ["[engine.workers.aggregated.kv_cache]", f"block_size = {block_size}",
              f"capacity = {{ type = \"fixed\", blocks = {blocks} }}",
              "[engine.workers.aggregated.timing]", f"type = {_toml_value(timing)}"]
    if timing == "fixed":
        lines += [f"prefill_ms = {prefill_ms!r}", f"decode_ms = {decode_ms!r}"]
    lines += ["[traffic.source]", 'type = "synthetic"', f"input_tokens = {input_tokens}",
              f"output_tokens = {output_tokens}", "[traffic.load]", 'type = "concurrency"',
              f"concurrency = {concurrency}", "[traffic.stop]", f"requests = {requests}"]
    return "\n".join(lines) + "\n" + extra


def rendered(error: ServesimError) -> list[str]:
    """The one-line form of every diagnostic of ``error`` (``path: message [code]``)."""
    return [f"{d.where}: {d.message} [{d.code}]" for d in error.diagnostics]


@attrs.frozen
class ReplayRun:
    """A finished replay: the report, one dict per request (as ``--requests-out`` writes
    them, in terminal order) and the payload that was replayed."""

    report: dict[str, Any]
    requests: list[dict[str, Any]]
    payload: Payload


@attrs.frozen
class CliResult:
    code: int
    out: str
    err: str


# -- fixtures ----------------------------------------------------------------------------------

@pytest.fixture
def servesim_plugins() -> Sequence[object]:
    """The plugins under test (modules or objects with hookimpls); override it."""
    return []


@pytest.fixture
def plugin_manager(servesim_plugins: Sequence[object]) -> pluggy.PluginManager:
    """A fresh manager: the built-ins and ``servesim_plugins``, no entry points."""
    from servesim.plugins.manager import get_plugin_manager

    return get_plugin_manager(load_entrypoints=False, plugins=servesim_plugins)


@pytest.fixture
def engine_registry(plugin_manager: pluggy.PluginManager) -> EngineRegistry:
    """Engines, backends, timing providers and trace formats of ``plugin_manager``."""
    from servesim.plugins.manager import EngineRegistry

    return EngineRegistry.collect(plugin_manager)


@pytest.fixture
def compile_toml(engine_registry: EngineRegistry, tmp_path: Path) -> Callable[..., Any]:
    """``compile_toml(text, *, stop_after="lower", base_dir=tmp_path)``: the stage's artifact.

    Raises :class:`~servesim.errors.CompileError`; :func:`rendered` gives its lines.
    """
    from servesim.compiler import compile_source
    from servesim.compiler.source import SourceText

    def run(text: str, *, stop_after: str = "lower", base_dir: Path | None = None,
            name: str = "test.toml") -> Any:
        source = SourceText(text=text, name=name, base_dir=base_dir or tmp_path)
        return compile_source(source, registry=engine_registry,
                              stop_after=stop_after)  # type: ignore[arg-type]

    return run


@pytest.fixture
def replay_toml(engine_registry: EngineRegistry, compile_toml: Callable[..., Any],
                tmp_path: Path) -> Callable[..., ReplayRun]:
    """``replay_toml(text_or_payload, *, base_dir=tmp_path)``: compile (if TOML) and replay."""
    from servesim.payload import Payload
    from servesim.replay import replay_payload

    counter = iter(range(1_000_000))

    def run(config: str | Payload, *, base_dir: Path | None = None) -> ReplayRun:
        payload = config if isinstance(config, Payload) else compile_toml(
            config, base_dir=base_dir)
        out = tmp_path / f"requests-{next(counter)}.jsonl"
        outcome = replay_payload(payload, registry=engine_registry,
                                 base_dir=base_dir or tmp_path, requests_out=out)
        lines = out.read_text(encoding="utf-8").splitlines()
        return ReplayRun(outcome.report, [json.loads(line) for line in lines], payload)

    return run


@pytest.fixture
def servesim_cli(servesim_plugins: Sequence[object], capsys: pytest.CaptureFixture[str],
                 monkeypatch: pytest.MonkeyPatch) -> Callable[..., CliResult]:
    """``servesim_cli("replay", "cfg.toml", "--quiet")``: run the CLI in-process.

    Entry-point autoloading is off; every module in ``servesim_plugins`` is passed with
    ``--plugin``. Returns the exit code and the captured stdout and stderr.
    """
    from servesim.cli import main
    from servesim.plugins.manager import DISABLE_AUTOLOAD_ENV

    monkeypatch.setenv(DISABLE_AUTOLOAD_ENV, "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setenv("NO_COLOR", "1")
    modules = [p.__name__ for p in servesim_plugins if hasattr(p, "__name__")
               and not isinstance(p, type)]

    def run(*args: str | Path, plugins: Iterable[str] | None = None) -> CliResult:
        flags = [a for m in (modules if plugins is None else plugins) for a in ("--plugin", m)]
        capsys.readouterr()
        code = main([*flags, *map(str, args)])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run
