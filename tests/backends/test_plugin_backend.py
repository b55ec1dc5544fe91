"""A backend variant registered by a plugin (examples/backends/vllm_no_evict.py): one
module, selected by ``engine.backend``, compiled, checked and replayed like a built-in."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

from servesim.backends import Backend
from servesim.backends.vllm import Vllm
from servesim.errors import CompileError, PayloadError, ServesimError
from servesim.plugins import hookimpl
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.replay import replay_payload
from servesim.testing import ReplayRun, rendered, small_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "backends"


def _example() -> ModuleType:
    sys.path.insert(0, str(EXAMPLE))
    try:
        return importlib.import_module("vllm_no_evict")
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.fixture
def servesim_plugins() -> list[object]:
    return [_example()]


def _config(backend: str) -> str:
    """Eight clients of 32-token prompts and 256-token answers on a pool of 40 16-token
    blocks: all their prompts fit, not all their answers."""
    text = small_config(requests=24, concurrency=8, input_tokens=32, output_tokens=256,
                        blocks=40, block_size=16)
    return text.replace('hardware = "h200_sxm"\n',
                        f'hardware = "h200_sxm"\nbackend = "{backend}"\n', 1)


def _preemptions(run: ReplayRun) -> int:
    return sum(r["num_preemptions"] for r in run.requests)


def _schedule(run: ReplayRun) -> list[tuple[Any, ...]]:
    keys = ("ttft_ms", "e2e_latency_ms", "output_length", "num_preemptions")
    return [tuple(r.get(k) for k in keys) for r in run.requests]


def test_the_plugin_registers_its_backend(engine_registry: EngineRegistry) -> None:
    assert list(engine_registry.backends) == ["vllm", "sglang", "trtllm", "vllm-no-evict"]
    (row,) = [r for r in engine_registry.backend_items() if r[0] == "vllm-no-evict"]
    assert row[2] == "vllm_no_evict"


def test_the_variant_keeps_vllms_defaults(compile_toml: Callable[..., Any]) -> None:
    text = _config("vllm-no-evict").replace("block_size = 16\n", "")
    role = compile_toml(text).roles["aggregated"]
    assert role.backend == "vllm-no-evict"
    assert (role.block_size, role.max_model_len) == (64, 40960)  # vLLM's, not TRT-LLM's


def test_the_variant_never_preempts_where_vllm_does(
        replay_toml: Callable[..., ReplayRun]) -> None:
    vllm = replay_toml(_config("vllm"))
    variant = replay_toml(_config("vllm-no-evict"))
    assert _preemptions(vllm) > 0
    assert _preemptions(variant) == 0
    assert len(variant.requests) == 24
    assert all(r["output_length"] == 256 for r in variant.requests)
    # the admission is TensorRT-LLM's: on the same pool and block size the same schedule
    assert _schedule(variant) == _schedule(replay_toml(_config("trtllm")))
    assert _schedule(variant) != _schedule(vllm)


def test_the_variant_takes_vllms_scheduler_fields(compile_toml: Callable[..., Any]) -> None:
    extra = "\n[engine.workers.aggregated.scheduler]\nprefill_schedule_interval = 2\n"
    assert compile_toml(_config("vllm-no-evict").replace(
        "[engine.workers.aggregated.kv_cache]", extra + "[engine.workers.aggregated.kv_cache]"))
    with pytest.raises(CompileError) as info:
        compile_toml(_config("sglang").replace(
            "block_size = 16", "block_size = 1").replace(
            "[engine.workers.aggregated.kv_cache]",
            extra + "[engine.workers.aggregated.kv_cache]"))
    assert "engine.workers.aggregated.scheduler.prefill_schedule_interval: "\
        "prefill_schedule_interval is supported only for backend=vllm or "\
        "backend=vllm-no-evict, got backend=sglang [backend-field]" in rendered(info.value)


def test_without_the_plugin_the_backend_is_unknown(
        compile_toml: Callable[..., Any], tmp_path: Path) -> None:
    payload = compile_toml(_config("vllm-no-evict"))
    builtins = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    from servesim.compiler import compile_source
    from servesim.compiler.source import SourceText

    with pytest.raises(CompileError) as info:
        compile_source(SourceText(text=_config("vllm-no-evict"), name="t.toml"),
                       registry=builtins)
    assert 'engine.backend: expected one of "vllm", "sglang", "trtllm", got string '\
        "'vllm-no-evict' [bad-choice]" in rendered(info.value)
    with pytest.raises(PayloadError) as replayed:
        replay_payload(payload, registry=builtins, base_dir=tmp_path)
    assert 'engine.backend: expected one of "vllm", "sglang", "trtllm", got '\
        "'vllm-no-evict' [unknown-backend]" in rendered(replayed.value)


class _Clash:
    class Again(Vllm):
        DESCRIPTION = "a second vllm"

    @hookimpl
    def servesim_register_backends(self) -> list[type[Backend]]:
        return [self.Again]


def test_a_duplicate_backend_name_is_fatal_and_names_both_plugins() -> None:
    with pytest.raises(ServesimError) as info:
        EngineRegistry.collect(get_plugin_manager(load_entrypoints=False, plugins=[_Clash()]))
    (diag,) = info.value.diagnostics
    assert diag.code == "duplicate-backend"
    assert "backend name 'vllm' is registered by both 'servesim.builtin' and" in diag.message


class _NotABackend:
    @hookimpl
    def servesim_register_backends(self) -> list[object]:
        return [attrs]


def test_a_registration_that_is_no_backend_is_refused() -> None:
    with pytest.raises(ServesimError) as info:
        EngineRegistry.collect(get_plugin_manager(load_entrypoints=False,
                                                  plugins=[_NotABackend()]))
    (diag,) = info.value.diagnostics
    assert diag.code == "plugin-bad-registration"
    assert "not a Backend subclass" in diag.message
