"""Bad input of every kind, with the exact rendered diagnostics (paths and codes pinned)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servesim.catalog import model_aliases, model_names
from servesim.compiler import compile_file, compile_source, compile_text
from servesim.compiler.source import MAX_CONFIG_BYTES, SourceText
from servesim.errors import CompileError
from servesim.plugins.manager import EngineRegistry, get_plugin_manager

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
HEAD = '[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
AGG = "[engine.workers.aggregated]\n"
ENGINE_KEYS = ("model, hardware, workers, mode, backend, backend_version, context_length, "
               "kv_transfer, speculation, nextn, nextn_accepted, enable_chunked_prefill, "
               "kvcache_quant_mode, gemm_quant_mode, moe_quant_mode, afd, engine, options")
KV_KEYS = ("block_size, prefix_caching, bytes_per_token, capacity, state_cache, "
           "prefix_match_unit, host_offload, g3_offload")


def errors(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compile_text(text, name="bad.toml", registry=REGISTRY)
    return [d.render() for d in info.value.diagnostics]


def parse_errors(text: str) -> list[str]:
    """Diagnostics of the parse stage alone (no catalog lookups)."""
    with pytest.raises(CompileError) as info:
        compile_source(SourceText(text=text, name="bad.toml"), registry=REGISTRY,
                       stop_after="parse")
    assert {d.stage for d in info.value.diagnostics} == {"parse"}
    return [d.render() for d in info.value.diagnostics]


# --- reading the file -----------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    (HEAD + AGG.rstrip("]\n") + "\n",
     "bad.toml:4:27: invalid TOML: Expected ']' at the end of a table declaration"),
    (HEAD + "x = \n", "bad.toml:4:5: invalid TOML: Invalid value"),
    (HEAD + "model = 'twice'\n", "bad.toml:4:16: invalid TOML: Cannot overwrite a value"),
    ('[engine]\nmodel = "Qwen/Qwen3-32B\n', "bad.toml:2:24: invalid TOML: Illegal character '\\n'"),
    (HEAD + "[engine]\n", "bad.toml:4:8: invalid TOML: Cannot declare ('engine',) twice"),
    ("[engine]\nnextn = 1.\n",
     "bad.toml:2:10: invalid TOML: Expected newline or end of document after a statement"),
], ids=["unclosed-table", "missing-value", "duplicate-key", "unterminated-string",
        "duplicate-table", "bad-float"])
def test_toml_syntax_errors_carry_file_line_and_column(text: str, expected: str) -> None:
    assert errors(text) == [f"{expected} [toml-syntax]"]


@pytest.mark.parametrize("text", ["", "   \n\t\n"], ids=["empty", "whitespace"])
def test_empty_file(text: str) -> None:
    assert errors(text) == [
        "bad.toml: the file is empty; a config needs at least an [engine] table with model, "
        "hardware and workers [empty-config]"]


def test_comment_only_file_misses_the_engine_table() -> None:
    assert errors("# nothing here yet\n") == ["engine: required key 'engine' is missing "
                                              "[missing-key]"]


def test_file_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "latin1.toml").write_bytes(b'[engine]\nmodel = "caf\xe9"\n')
    (tmp_path / "huge.toml").write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    (tmp_path / "folder.toml").mkdir()
    expected = {
        "missing.toml": "missing.toml: file not found [file-not-found]",
        "folder.toml": "folder.toml: is a directory, expected a TOML file [file-unreadable]",
        "latin1.toml": "latin1.toml: not UTF-8 text (byte 21) [not-utf8]",
        "huge.toml": f"huge.toml: file is over {MAX_CONFIG_BYTES} bytes, the most a TOML "
                     "file may be [file-too-large]",
        # an endless device, a pipe no one writes: not read at all
        "/dev/zero": "/dev/zero: is not a regular file (a device, pipe or socket), expected a "
                     "TOML file [file-unreadable]",
        "fifo.toml": "fifo.toml: is not a regular file (a device, pipe or socket), expected a "
                     "TOML file [file-unreadable]",
    }
    os.mkfifo(tmp_path / "fifo.toml")
    for name, line in expected.items():
        with pytest.raises(CompileError) as info:
            compile_file(name, registry=REGISTRY)
        assert [d.render() for d in info.value.diagnostics] == [line]


def test_syntax_error_location_names_the_file(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.toml").write_text(HEAD + "x = = 1\n", encoding="utf-8")
    with pytest.raises(CompileError) as info:
        compile_file("cfg.toml", registry=REGISTRY)
    assert [d.render() for d in info.value.diagnostics] == [
        "cfg.toml:4:5: invalid TOML: Invalid value [toml-syntax]"]


def test_utf8_byte_order_mark_is_accepted() -> None:
    data = b"\xef\xbb\xbf" + (HEAD + AGG).encode()
    payload = compile_source(SourceText.from_bytes(data, name="bom.toml"), registry=REGISTRY)
    assert payload.roles["aggregated"].model == "Qwen/Qwen3-32B"


# --- unknown keys ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    (HEAD + AGG + "[trafic]\n",
     "trafic: unknown key 'trafic' (allowed here: engine, traffic, evaluation) [unknown-key]\n"
     "  hint: did you mean 'traffic'?"),
    (HEAD + 'hardwre = "h100_sxm"\n' + AGG,
     f"engine.hardwre: unknown key 'hardwre' (allowed here: {ENGINE_KEYS}) [unknown-key]\n"
     "  hint: did you mean 'hardware'?"),
    (HEAD + AGG + "[engine.workers.agregated]\n",
     "engine.workers.agregated: unknown key 'agregated' (allowed here: aggregated, prefill, "
     "decode) [unknown-key]\n  hint: did you mean 'aggregated'?"),
    (HEAD + "[engine.workers.aggregated.kv_cache]\nblok_size = 4\n",
     f"engine.workers.aggregated.kv_cache.blok_size: unknown key 'blok_size' (allowed here: "
     f"{KV_KEYS}) [unknown-key]\n  hint: did you mean 'block_size'?"),
    (HEAD + '[engine.workers.aggregated.kv_cache.capacity]\ntyp = "fixed"\n',
     "engine.workers.aggregated.kv_cache.capacity.typ: unknown key 'typ' (allowed here: type, "
     "memory_fraction, cuda_graph_reserved_bytes, blocks, bytes) [unknown-key]\n"
     "  hint: did you mean 'type'?"),
    (HEAD + AGG + "[traffic.load]\nrps = 3.0\n",
     "traffic.load.rps: unknown key 'rps' (allowed here: type, concurrency, requests_per_second, "
     "sessions_per_second, seed, cv, speedup) [unknown-key]"),
], ids=["root", "engine", "workers", "kv_cache", "capacity", "no-hint"])
def test_unknown_keys(text: str, expected: str) -> None:
    assert parse_errors(text) == [expected]


# --- wrong types ------------------------------------------------------------------------------

BLOCK = "engine.workers.aggregated.kv_cache.block_size"


@pytest.mark.parametrize(("value", "message"), [
    ('"64"', "expected an integer, got string '64' [wrong-type]"),
    ("true", "expected an integer, got boolean true [wrong-type]"),
    ("64.0", "expected an integer, got float 64.0 [wrong-type]"),
    ("{ size = 64 }", "expected an integer, got a table [wrong-type]"),
    ("[64]", "expected an integer, got an array [wrong-type]"),
    ("1979-05-27", "expected an integer, got date [wrong-type]"),
], ids=["string", "bool", "float", "table", "array", "date"])
def test_wrong_type_for_an_integer(value: str, message: str) -> None:
    assert parse_errors(HEAD + f"[engine.workers.aggregated.kv_cache]\nblock_size = {value}\n") \
        == [f"{BLOCK}: {message}"]


@pytest.mark.parametrize(("text", "expected"), [
    ('[engine]\nmodel = 3\nhardware = "h200_sxm"\n' + AGG,
     "engine.model: expected a string, got integer 3 [wrong-type]"),
    (HEAD + AGG + "[engine.workers.aggregated.kv_cache]\nprefix_caching = 1\n",
     "engine.workers.aggregated.kv_cache.prefix_caching: expected true or false, got integer 1 "
     "[wrong-type]"),
    (HEAD + '[engine.workers.aggregated.kv_cache]\nbytes_per_token = "aut"\n',
     "engine.workers.aggregated.kv_cache.bytes_per_token: expected an integer or \"auto\", got "
     "string 'aut' [wrong-type]"),
    (HEAD + "context_length = 1.5\n" + AGG,
     'engine.context_length: expected an integer or "max", got float 1.5 [wrong-type]'),
    (HEAD + 'speculation = { kind = "ngram", num_speculative_tokens = 2, '
            'acceptance_rates = 0.5 }\n' + AGG,
     "engine.speculation.acceptance_rates: expected an array, got float 0.5 [wrong-type]"),
    (HEAD + 'speculation = { kind = "ngram", num_speculative_tokens = 2, '
            'acceptance_rates = [0.5, "high"] }\n' + AGG,
     "engine.speculation.acceptance_rates[1]: expected a number, got string 'high' "
     "[wrong-type]"),
    (HEAD + AGG + '[traffic]\nsource = "synthetic"\n',
     "traffic.source: expected a table, got string 'synthetic' [wrong-type]"),
    (HEAD + "[engine.workers]\naggregated = 3\n",
     "engine.workers.aggregated: expected a table, got integer 3 [wrong-type]"),
    (HEAD + "[[engine.workers.aggregated]]\n",
     "engine.workers.aggregated: expected a table, got an array [wrong-type]"),
    ("engine = []\n", "engine: expected a table, got an array [wrong-type]"),
], ids=["int-for-string", "int-for-bool", "bad-auto", "float-for-int-or-max",
        "scalar-for-array", "bad-array-item", "string-for-table", "int-for-table",
        "array-of-tables-for-table", "root-array"])
def test_wrong_types(text: str, expected: str) -> None:
    assert parse_errors(text) == [expected]


# --- numbers -----------------------------------------------------------------------------------

RATE = "traffic.load.requests_per_second"


@pytest.mark.parametrize(("value", "message"), [
    ("nan", "expected a finite number, got nan [not-finite]"),
    ("+inf", "expected a finite number, got inf [not-finite]"),
    ("-inf", "expected a finite number, got -inf [not-finite]"),
    ("0.0", "must be in (0, 10000000], got 0 [out-of-range]"),
    ("-2", "must be in (0, 10000000], got -2 [out-of-range]"),
    ("1e300", "must be in (0, 10000000], got 1e+300 [out-of-range]"),
])
def test_non_finite_and_out_of_range_floats(value: str, message: str) -> None:
    text = HEAD + AGG + f'[traffic.load]\ntype = "poisson"\nrequests_per_second = {value}\n'
    assert parse_errors(text) == [f"{RATE}: {message}"]


@pytest.mark.parametrize(("value", "message"), [
    ("-3", "must be in [1, 2^20], got -3"),
    ("0", "must be in [1, 2^20], got 0"),
    (str(2**64), "must be in [1, 2^20], got 2^64"),
    (str(2**64 - 1), "must be in [1, 2^20], got 2^64-1"),
    (str(-(2**63)), "must be in [1, 2^20], got -9223372036854775808"),
])
def test_negative_and_huge_integers(value: str, message: str) -> None:
    assert parse_errors(HEAD + AGG + f"[traffic.load]\nconcurrency = {value}\n") == [
        f"traffic.load.concurrency: {message} [out-of-range]"]


def test_u64_limits_are_inclusive() -> None:
    seed = "engine.speculation.seed"
    spec = 'speculation = { kind = "ngram", num_speculative_tokens = 1, ' \
           'acceptance_rates = [0.5], seed = %d }\n'
    payload = compile_text(HEAD + spec % (2**64 - 1) + AGG, registry=REGISTRY)
    assert payload.roles["aggregated"].speculation is not None
    assert payload.roles["aggregated"].speculation.seed == 2**64 - 1
    assert parse_errors(HEAD + spec % 2**64 + AGG) == [
        f"{seed}: must be in [0, 2^64-1], got 2^64 [out-of-range]"]
    assert parse_errors(HEAD + spec % -1 + AGG) == [
        f"{seed}: must be in [0, 2^64-1], got -1 [out-of-range]"]


# --- catalog names --------------------------------------------------------------------------------

def test_unknown_model_and_gpu_name_the_closest() -> None:
    model, hardware = errors('[engine]\nmodel = "Qwen/Qwen3-33B"\nhardware = "h200"\n' + AGG)
    assert model.startswith("engine.model: unknown model 'Qwen/Qwen3-33B'; closest known: "
                            "Qwen/Qwen3-32B, Qwen/Qwen3-8B, Qwen/Qwen3-30B-A3B. ")
    assert model.endswith("huggingface-cli download Qwen/Qwen3-33B config.json [unknown-model]")
    assert hardware == ("engine.hardware: unknown gpu 'h200'; closest known: h200_sxm, gb200 "
                        "[unknown-hardware]")
    assert errors(HEAD.replace('"h200_sxm"', '"H100"') + AGG) == [
        "engine.hardware: unknown gpu 'H100'; closest known: h100_sxm [unknown-hardware]"]


def test_unknown_name_with_nothing_close_lists_the_catalog() -> None:
    lines = errors('[engine]\nmodel = "zzz"\nhardware = "zzz"\n' + AGG)
    assert lines[1] == ("engine.hardware: unknown gpu 'zzz'; known: a100_sxm, b200_sxm, b300_sxm, "
                        "gb200, gb300, h100_sxm, h200_sxm, l40s [unknown-hardware]")
    # a model: too many to list; the command that lists them
    assert lines[0] == ("engine.model: unknown model 'zzz'; servesim models lists the "
                        f"{len(model_names()) + len(model_aliases())} known ids. Name a folder "
                        "holding its config.json, or a Hugging Face model id (org/name) "
                        "[unknown-model]")


def test_unknown_worker_hardware_names_the_worker_path() -> None:
    text = HEAD + 'mode = "disaggregated"\n[engine.workers.prefill]\n' \
        '[engine.workers.decode]\nhardware = "h100"\n'
    assert errors(text) == [
        "engine.workers.decode.hardware: unknown gpu 'h100'; closest known: h100_sxm "
        "[unknown-hardware]"]


# --- enums ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    (HEAD + 'backend = "vLLM"\nmode = "agg"\n' + AGG, [
        "engine.mode: expected one of \"aggregated\", \"disaggregated\", \"afd\", got string "
        "'agg' [bad-choice]",
        "engine.backend: expected one of \"vllm\", \"sglang\", \"trtllm\", got string 'vLLM' "
        "[bad-choice]"]),
    (HEAD + "backend = 1\n" + AGG, [
        "engine.backend: expected one of \"vllm\", \"sglang\", \"trtllm\", got integer 1 "
        "[bad-choice]"]),
    (HEAD + AGG + '[traffic.source]\ntype = "replay"\n', [
        "traffic.source.type: expected one of \"synthetic\", \"synthetic-session\", \"trace\", "
        "got string 'replay' [bad-choice]"]),
    (HEAD + 'kvcache_quant_mode = "fp4"\n' + AGG, [
        "engine.kvcache_quant_mode: expected one of \"auto\", \"bfloat16\", \"float16\", "
        "\"fp8\", \"fp8_block\", \"nvfp4\", \"int8\", \"float32\", got string 'fp4' "
        "[bad-choice]"]),
])
def test_bad_enum_values(text: str, expected: list[str]) -> None:
    assert parse_errors(text) == expected


@pytest.mark.parametrize("mode", ["fp8_block", "nvfp4"])
def test_quant_mode_that_is_no_kv_dtype(mode: str) -> None:
    # a valid gemm_quant_mode, but no element size for a KV cache
    assert errors(HEAD + f'kvcache_quant_mode = "{mode}"\n' + AGG) == [
        f"engine.kvcache_quant_mode: '{mode}' is not a KV cache dtype; use \"auto\", "
        "\"bfloat16\", \"float16\", \"float32\", \"fp8\" or \"int8\" [unsupported-kv-dtype]"]


def test_block_fp8_weights_weigh_one_byte_and_their_scales() -> None:
    def weights(mode: str) -> int:
        payload = compile_text(HEAD + f'gemm_quant_mode = "{mode}"\n' + AGG, registry=REGISTRY)
        value: int = payload.provenance["capacity"]["aggregated"]["weights"]
        return value

    # one fp32 scale per 128 x 128 block; NVFP4 one fp8 scale per 16 weights; the
    # embeddings and the LM head stay bf16 (2 x 151936 x 5120 x 2 B for Qwen3-32B)
    kept = 2 * 151936 * 5120 * 2
    assert weights("fp8") == (weights("auto") - kept) // 2 + kept
    assert weights("fp8") < weights("fp8_block") == pytest.approx(weights("fp8"), rel=1e-3)
    assert weights("nvfp4") == pytest.approx(
        (weights("auto") - kept) * (0.5 + 1 / 16) / 2 + kept, rel=1e-6)


# --- missing keys and many errors at once -----------------------------------------------------

def test_missing_required_keys() -> None:
    assert parse_errors("[engine]\n") == [
        "engine.model: required key 'model' is missing [missing-key]",
        "engine.hardware: required key 'hardware' is missing [missing-key]",
        "engine.workers: required key 'workers' is missing [missing-key]"]
    assert parse_errors(HEAD + 'speculation = { kind = "ngram" }\n' + AGG) == [
        "engine.speculation.num_speculative_tokens: required key 'num_speculative_tokens' is "
        "missing [missing-key]",
        "engine.speculation.acceptance_rates: required key 'acceptance_rates' is missing "
        "[missing-key]"]


def test_every_structural_error_is_reported_at_once() -> None:
    text = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = 1
backend = "x"
foo = 1
[engine.workers.aggregated.kv_cache]
block_size = "a"
[traffic.load]
concurrency = 1.5
"""
    assert parse_errors(text) == [
        "engine.hardware: expected a string, got integer 1 [wrong-type]",
        "engine.workers.aggregated.kv_cache.block_size: expected an integer, got string 'a' "
        "[wrong-type]",
        "engine.backend: expected one of \"vllm\", \"sglang\", \"trtllm\", got string 'x' "
        "[bad-choice]",
        f"engine.foo: unknown key 'foo' (allowed here: {ENGINE_KEYS}) [unknown-key]",
        "traffic.load.concurrency: expected an integer, got float 1.5 [wrong-type]"]


def test_every_range_and_shape_error_is_reported_at_once() -> None:
    text = HEAD + "nextn = 9\n" + AGG + """
[engine.workers.aggregated.parallelism]
tensor = 0
[traffic.load]
concurrency = 0
"""
    assert parse_errors(text) == [
        "engine.workers.aggregated.parallelism.tensor: must be in [1, 1024], got 0 "
        "[out-of-range]",
        "engine.nextn: must be in [0, 5], got 9 [out-of-range]",
        "traffic.load.concurrency: must be in [1, 2^20], got 0 [out-of-range]",
        "engine.nextn_accepted: nextn requires explicit nextn_accepted [nextn-accepted]"]


def test_a_swapped_letter_suggests_the_key_with_the_same_letters() -> None:
    from servesim.converter import closest

    assert closest("modle", ["mode", "model", "hardware"]) == "model"
    assert closest("mdoe", ["mode", "model"]) == "mode"
    assert closest("zzz", ["mode", "model"]) is None
