"""Behavioural config cases 1-25 of the replay semantics, with pinned diagnostics.

Every error test compares the exact rendered diagnostics (``Diagnostic.render()``,
path and code included). Cases that need features servesim does not implement pin
what servesim does instead: G3 offload and ``afd`` are "not supported", a
recommendation-only input (``hardware = "auto"``) is refused, and models missing from
the catalog (DeepSeek V4) are unknown models with the closest names.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from servesim.compiler import compile_source, compile_text
from servesim.compiler.model.resolved import ResolvedConfig
from servesim.compiler.source import SourceText
from servesim.errors import CompileError
from servesim.payload import Payload, RoleArgs
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.workloads.spec import Stop

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))

QWEN = '[engine]\nmodel = "Qwen/Qwen3-32B"\nhardware = "h200_sxm"\n'
HYBRID = '[engine]\nmodel = "Qwen/Qwen3.5-35B-A3B"\nhardware = "h200_sxm"\n'
AGG = "[engine.workers.aggregated]\n"
# spec §3.4 example: 64-token blocks of 16 B, 1500 B of state per request
MANUAL_STATE = """
[engine.workers.aggregated.kv_cache]
block_size = 64
bytes_per_token = 16
capacity = { type = "fixed", bytes = 8192 }
state_cache = { bytes_per_request = 1500 }
"""


def compile_ok(text: str) -> Payload:
    return compile_text(text, name="case.toml", registry=REGISTRY)


def resolve(text: str) -> ResolvedConfig:
    resolved: ResolvedConfig = compile_source(SourceText(text=text, name="case.toml"),
                                              registry=REGISTRY, stop_after="resolve")
    return resolved


def errors(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compile_ok(text)
    return [d.render() for d in info.value.diagnostics]


def role(payload: Payload, name: str = "aggregated") -> RoleArgs:
    return payload.roles[name]


# --- 1-3: defaults ----------------------------------------------------------------------

def test_case_01_fully_defaulted_aggregated_worker() -> None:
    resolved = resolve(QWEN + AGG)
    assert resolved.payload.mode == "aggregated"
    r = resolved.payload.roles["aggregated"]
    assert (r.backend, r.block_size, r.prefix_caching) == ("vllm", 64, True)
    assert (r.max_batched_tokens, r.max_sequences) == (8192, 256)
    assert (r.replicas, r.tensor, r.pipeline, r.attention_data) == (1, 1, 1, 1)
    assert r.timing.type == "default" and r.startup_seconds == 0.0
    # context_length = "max" on vLLM is the model's max_position_embeddings
    assert r.max_model_len == 40960
    prov = resolved.provenance
    fraction = prov["engine.workers.aggregated.kv_cache.capacity.memory_fraction"]
    assert (fraction.origin, fraction.formula) == ("defaulted", "vllm default")
    assert prov["engine.mode"].origin == "defaulted"
    assert prov["engine.workers.aggregated.kv_cache.block_size"].origin == "defaulted"


def test_case_01_defaults_equal_their_explicit_values() -> None:
    explicit = QWEN + """
mode = "aggregated"
backend = "vllm"
context_length = "max"
[engine.workers.aggregated]
startup_seconds = 0
timing = { type = "default" }
[engine.workers.aggregated.parallelism]
replicas = 1
tensor = 1
pipeline = 1
attention_data = 1
moe_tensor = 1
moe_expert = 1
[engine.workers.aggregated.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.aggregated.kv_cache]
block_size = 64
prefix_caching = true
bytes_per_token = "auto"
capacity = { type = "default", memory_fraction = 0.9 }
"""
    assert compile_ok(explicit).roles == compile_ok(QWEN + AGG).roles
    lower_fraction = explicit.replace("memory_fraction = 0.9", "memory_fraction = 0.8")
    assert compile_ok(lower_fraction).roles != compile_ok(QWEN + AGG).roles


def test_case_02_prefill_role_defaults_to_one_sequence() -> None:
    payload = compile_ok(QWEN + 'mode = "disaggregated"\n'
                         "[engine.workers.prefill]\n[engine.workers.decode]\n")
    assert payload.engine == "disagg"
    assert role(payload, "prefill").max_sequences == 1
    assert role(payload, "decode").max_sequences == 256
    explicit = compile_ok(QWEN + 'mode = "disaggregated"\n[engine.workers.prefill]\n'
                          "scheduler = { max_sequences = 4 }\n[engine.workers.decode]\n")
    assert role(explicit, "prefill").max_sequences == 4


@pytest.mark.parametrize(("backend", "block_size", "fraction"),
                         [("sglang", 1, 0.88), ("trtllm", 32, 0.9), ("vllm", 64, 0.9)])
def test_case_03_backend_block_size_and_memory_fraction(backend: str, block_size: int,
                                                        fraction: float) -> None:
    text = QWEN + f'backend = "{backend}"\n' + AGG
    resolved = resolve(text)
    assert resolved.payload.roles["aggregated"].block_size == block_size
    prov = resolved.provenance["engine.workers.aggregated.kv_cache.capacity.memory_fraction"]
    assert prov.formula == f"{backend} default"
    explicit = text + f"kv_cache = {{ block_size = {block_size}, capacity = {{ " \
        f"memory_fraction = {fraction} }} }}\n"
    assert compile_ok(explicit).roles == compile_ok(text).roles


@pytest.mark.parametrize(("backend", "dp", "budget"),
                         [("sglang", 1, 8192), ("sglang", 4, 2048), ("vllm", 4, 8192)])
def test_sglang_token_budget_is_its_chunked_prefill_size_split_over_dp_ranks(
        backend: str, dp: int, budget: int) -> None:
    text = QWEN + f'backend = "{backend}"\n' + AGG + f"parallelism = {{ attention_data = {dp} }}\n"
    assert role(compile_ok(text)).max_batched_tokens == budget
    authored = text + "scheduler = { max_batched_tokens = 1000 }\n"
    assert role(compile_ok(authored)).max_batched_tokens == 1000


# --- 4-5: backend-specific fields ---------------------------------------------------------

def test_case_04_vllm_rejects_block_size_one_sglang_accepts_it() -> None:
    kv = "[engine.workers.aggregated.kv_cache]\nblock_size = 1\n"
    assert errors(QWEN + kv) == [
        "engine.workers.aggregated.kv_cache.block_size: vLLM/TRT-LLM require block_size >= 2, "
        "got 1 [block-size-too-small]\n"
        "  hint: SGLang is the only backend with single-token pages"]
    assert errors(QWEN + 'backend = "trtllm"\n' + kv) == errors(QWEN + kv)
    assert role(compile_ok(QWEN + 'backend = "sglang"\n' + kv)).block_size == 1


def test_case_05_scheduler_intervals_are_backend_specific() -> None:
    assert errors(QWEN + "[engine.workers.aggregated.scheduler]\n"
                         "prefill_decode_interval = 2\n") == [
        "engine.workers.aggregated.scheduler.prefill_decode_interval: prefill_decode_interval "
        "is supported only for backend=sglang, got backend=vllm [backend-field]"]
    assert errors(QWEN + 'backend = "sglang"\n[engine.workers.aggregated.scheduler]\n'
                         "prefill_schedule_interval = 3\n") == [
        "engine.workers.aggregated.scheduler.prefill_schedule_interval: "
        "prefill_schedule_interval is supported only for backend=vllm, got backend=sglang "
        "[backend-field]"]
    # neutral values are accepted on every backend
    neutral = compile_ok(QWEN + 'backend = "sglang"\n[engine.workers.aggregated.scheduler]\n'
                                "prefill_schedule_interval = 1\nprefill_decode_interval = 0\n")
    assert role(neutral).prefill_decode_interval == 0
    # SGLang's own interval spaces its prefill passes; the replay does not space them yet
    assert errors(QWEN + 'backend = "sglang"\n[engine.workers.aggregated.scheduler]\n'
                         "prefill_decode_interval = 2\n") == [
        "engine.workers.aggregated.scheduler.prefill_decode_interval: prefill_decode_interval "
        "is not supported yet: the replay runs SGLang's prefill passes whenever there is "
        "prompt work [not-supported]\n"
        "  hint: remove it (0, the default, is supported)"]


def test_attention_dp_balance_is_tensorrt_llm_s_placement_any_backend_s() -> None:
    balance = ("[engine.workers.aggregated.scheduler]\nattention_dp_balance = true\n"
               "attention_dp_timeout_iters = 60\nattention_dp_batching_wait_iters = 0\n")
    assert errors(QWEN + balance) == [
        "engine.workers.aggregated.scheduler.attention_dp_balance: attention_dp_balance is "
        "supported only for backend=trtllm, got backend=vllm [backend-field]\n"
        "  hint: vLLM spaces prefills across attention-DP ranks with "
        "prefill_schedule_interval"]
    trt = role(compile_ok(QWEN + 'backend = "trtllm"\n' + balance))
    assert (trt.attention_dp_balance, trt.attention_dp_timeout_iters,
            trt.attention_dp_batching_wait_iters) == (True, 60, 0)
    placed = role(compile_ok(QWEN + "[engine.workers.aggregated.scheduler]\n"
                                     'attention_dp_placement = "least_loaded"\n'))
    assert placed.attention_dp_placement == "least_loaded"
    default = role(compile_ok(QWEN + 'backend = "trtllm"\n' + AGG))
    assert (default.attention_dp_balance, default.attention_dp_timeout_iters,
            default.attention_dp_batching_wait_iters, default.attention_dp_placement) == (
        False, 50, 10, "round_robin")


# --- 6-10: capacity and manual state cache ------------------------------------------------

CAPACITY = "engine.workers.aggregated.kv_cache"
NEEDS_BLOCK = (f"{CAPACITY}.block_size: manual KV capacity requires explicit positive "
               "block_size (fixed KV capacity in bytes) [manual-geometry]")
NEEDS_BPT = (f"{CAPACITY}.bytes_per_token: manual KV capacity requires explicit positive "
             "bytes_per_token (fixed KV capacity in bytes) [manual-geometry]")


@pytest.mark.parametrize(("capacity", "expected"), [
    ('{ type = "fixed" }',
     [f"{CAPACITY}.capacity: fixed KV capacity requires blocks or bytes [capacity-fixed]"]),
    ('{ type = "fixed", bytes = 8192, blocks = 8 }',
     [f"{CAPACITY}.capacity: fixed KV capacity accepts only one of blocks or bytes "
      "[capacity-fixed]", NEEDS_BLOCK, NEEDS_BPT]),
    ('{ type = "default", bytes = 8192 }',
     [f"{CAPACITY}.capacity.bytes: default KV capacity rejects blocks or bytes "
      '[capacity-default]\n  hint: set capacity.type = "fixed" to give the pool size',
      NEEDS_BLOCK, NEEDS_BPT]),
    ('{ type = "fixed", bytes = 8192, memory_fraction = 0.9 }',
     [f"{CAPACITY}.capacity.memory_fraction: fixed KV capacity rejects memory_fraction "
      "[capacity-fixed]", NEEDS_BLOCK, NEEDS_BPT]),
    ('{ type = "fixed", blocks = 8, cuda_graph_reserved_bytes = 1 }',
     [f"{CAPACITY}.capacity.cuda_graph_reserved_bytes: fixed KV capacity rejects "
      "cuda_graph_reserved_bytes [capacity-fixed]"]),
    ('{ blocks = 8 }',
     [f"{CAPACITY}.capacity.blocks: default KV capacity rejects blocks or bytes "
      '[capacity-default]\n  hint: set capacity.type = "fixed" to give the pool size']),
])
def test_case_06_capacity_shape(capacity: str, expected: list[str]) -> None:
    assert errors(QWEN + f"[engine.workers.aggregated.kv_cache]\ncapacity = {capacity}\n") \
        == expected


def test_case_07_manual_state_cache_lowering() -> None:
    payload = compile_ok(HYBRID + MANUAL_STATE)
    r = role(payload)
    assert (r.num_gpu_blocks, r.block_size, r.kv_bytes_per_token) == (8, 64, 16)
    assert r.state_cache is not None
    assert r.state_cache.bytes_per_request == 1500
    assert r.state_cache.state_blocks == 2
    assert r.state_cache.allocated_bytes_per_request == 2048
    assert r.state_cache.source == "overridden"
    # no memory-fraction sizing happened: the pool is exactly the authored bytes
    assert payload.provenance["capacity"] == {}
    assert payload.provenance["state_cache"]["aggregated"]["source"] == "overridden"


def test_case_08_bytes_round_down_and_blocks_give_the_same_payload() -> None:
    base = compile_ok(HYBRID + MANUAL_STATE)
    assert compile_ok(HYBRID + MANUAL_STATE.replace("8192", "8193")).roles == base.roles
    blocks = MANUAL_STATE.replace("bytes = 8192", "blocks = 8")
    assert compile_ok(HYBRID + blocks).roles == base.roles


def test_case_09_capacity_must_hold_a_token_block_and_a_state() -> None:
    assert errors(HYBRID + MANUAL_STATE.replace("8192", "2048")) == [
        f"{CAPACITY}.capacity: state_cache capacity must fit one token block and one request "
        "state: 2 blocks of 64 tokens < 2 state blocks + 1 [state-cache-capacity]\n"
        "  hint: raise capacity.blocks or capacity.bytes"]


def test_case_10_manual_state_cache_needs_explicit_geometry() -> None:
    assert errors(HYBRID + MANUAL_STATE.replace("block_size = 64\n", "")) == [
        f"{CAPACITY}.block_size: manual KV capacity requires explicit positive block_size "
        "(manual state_cache) [manual-geometry]"]
    assert errors(HYBRID + MANUAL_STATE.replace("= 16", '= "auto"')) == [
        f"{CAPACITY}.bytes_per_token: manual KV capacity requires explicit positive "
        "bytes_per_token (manual state_cache) [manual-geometry]"]
    default_capacity = MANUAL_STATE.replace('capacity = { type = "fixed", bytes = 8192 }\n', "")
    assert errors(HYBRID + default_capacity) == [
        f"{CAPACITY}.state_cache: state_cache requires fixed capacity (blocks or bytes) "
        "[state-cache-capacity]\n"
        '  hint: set capacity = { type = "fixed", blocks = N }']
    # the host (G2) tier holds token KV blocks, not state snapshots
    assert errors(HYBRID + MANUAL_STATE + "host_offload = { capacity_blocks = 4 }\n") == [
        f"{CAPACITY}.host_offload: host_offload does not support state_cache: the host tier "
        "holds token KV blocks, not recurrent state snapshots [host-offload-conflict]\n"
        "  hint: remove host_offload"]


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_case_11_state_cache_requires_vllm(backend: str) -> None:
    assert errors(HYBRID + f'backend = "{backend}"\n' + MANUAL_STATE) == [
        f"{CAPACITY}.state_cache: state_cache requires backend=vllm, got backend={backend} "
        "[state-cache-backend]"]


STATE_FIELD = f"{CAPACITY}.state_cache.bytes_per_request"


@pytest.mark.parametrize(("value", "message"), [
    ("0", "must be in [1, 2^64-1], got 0 [out-of-range]"),
    ("-1", "must be in [1, 2^64-1], got -1 [out-of-range]"),
    ("true", "expected an integer, got boolean true [wrong-type]"),
    ("1.5", "expected an integer, got float 1.5 [wrong-type]"),
    ('"16"', "expected an integer, got string '16' [wrong-type]"),
    (str(2**64), "must be in [1, 2^64-1], got 2^64 [out-of-range]"),
])
def test_case_12_bytes_per_request_values(value: str, message: str) -> None:
    text = HYBRID + MANUAL_STATE.replace("bytes_per_request = 1500", f"bytes_per_request = {value}")
    assert errors(text) == [f"{STATE_FIELD}: {message}"]


def test_case_12_unknown_state_cache_key() -> None:
    text = HYBRID + MANUAL_STATE.replace("1500 }", "1500, tokens_per_block = 4 }")
    assert errors(text) == [
        f"{CAPACITY}.state_cache.tokens_per_block: unknown key 'tokens_per_block' (allowed "
        "here: bytes_per_request, mamba_cache_dtype) [unknown-key]"]


# --- 13-14: prefix_match_unit -----------------------------------------------------------

PMU = f"{CAPACITY}.prefix_match_unit"


def test_case_13_prefix_match_unit_requires_state_cache() -> None:
    assert errors(HYBRID + "[engine.workers.aggregated.kv_cache]\nprefix_match_unit = 16\n") \
        == [f"{PMU}: prefix_match_unit currently requires state_cache "
            "[prefix-match-unit-requires-state-cache]"]


@pytest.mark.parametrize(("value", "message"), [
    ("0", "must be in [1, 2^20], got 0 [out-of-range]"),
    ("-1", "must be in [1, 2^20], got -1 [out-of-range]"),
    ("true", "expected an integer, got boolean true [wrong-type]"),
    ("1.5", "expected an integer, got float 1.5 [wrong-type]"),
    ('"1536"', "expected an integer, got string '1536' [wrong-type]"),
    (str(2**64), "must be in [1, 2^20], got 2^64 [out-of-range]"),
    ("63", "prefix_match_unit must be a positive divisor of the resolved block_size 64, got 63 "
           "[prefix-match-unit-not-divisor]"),
    ("65", "prefix_match_unit must be a positive divisor of the resolved block_size 64, got 65 "
           "[prefix-match-unit-not-divisor]"),
])
def test_case_13_prefix_match_unit_values(value: str, message: str) -> None:
    assert errors(HYBRID + MANUAL_STATE + f"prefix_match_unit = {value}\n") == [
        f"{PMU}: {message}"]


def test_case_13_prefix_match_unit_divisor_is_lowered() -> None:
    assert role(compile_ok(HYBRID + MANUAL_STATE + "prefix_match_unit = 16\n")) \
        .prefix_match_unit == 16


def _pmu_speculation(block: int, unit: int) -> str:
    return (f"{PMU}: prefix_match_unit does not support speculative decoding (speculation or "
            f"nextn > 0) unless it equals the resolved block_size {block}, got {unit} "
            f"[prefix-match-unit-speculation]\n"
            f"  hint: set prefix_match_unit = {block} or remove it")


@pytest.mark.parametrize("speculation", [
    'speculation = { kind = "ngram", num_speculative_tokens = 2, acceptance_rates = [0.5, 0.5] }',
    "nextn = 1\nnextn_accepted = 0.5",
    "nextn = 5\nnextn_accepted = 4.5",
])
def test_case_14_prefix_match_unit_with_speculation(speculation: str) -> None:
    text = HYBRID + speculation + "\n" + MANUAL_STATE + "prefix_match_unit = 16\n"
    assert errors(text) == [_pmu_speculation(64, 16)]


def test_case_14_nextn_zero_is_no_speculation() -> None:
    payload = compile_ok(HYBRID + "nextn = 0\n" + MANUAL_STATE + "prefix_match_unit = 16\n")
    assert role(payload).speculation is None
    assert role(payload).prefix_match_unit == 16


# --- 15: recommendation-only input --------------------------------------------------------

def test_case_15_recommendation_input_is_refused() -> None:
    text = HYBRID.replace('"h200_sxm"', '"auto"') + MANUAL_STATE
    assert errors(text) == [
        "engine.hardware: 'auto' hardware is recommendation-only and not supported; name one "
        'GPU, e.g. "h200_sxm" [not-supported]']


# --- 16-19: inferred state cache, Kimi K3 ---------------------------------------------------

def kimi(*, tensor: int = 8, engine: str = "", kv: str = "",
         capacity: str = "blocks = 512") -> str:
    return f"""
[engine]
model = "moonshotai/Kimi-K3"
hardware = "b200_sxm"
{engine}
[engine.workers.aggregated.parallelism]
tensor = {tensor}
[engine.workers.aggregated.kv_cache]
{kv}
capacity = {{ type = "fixed", {capacity} }}
state_cache = {{}}
"""


@pytest.mark.parametrize(("engine", "kv", "block", "bytes_per_token", "bytes_per_request"), [
    ("", "", 768, 27648, 61046784),
    ('kvcache_quant_mode = "fp8"', "", 1472, 13824, 58503168),
    ('kvcache_quant_mode = "fp8"', "block_size = 128", 1536, 13824, 61046784),
    ("", "block_size = 128\nbytes_per_token = 13824", 1536, 13824, 61046784),
])
def test_case_16_kimi_k3_inferred_geometry(engine: str, kv: str, block: int,
                                           bytes_per_token: int,
                                           bytes_per_request: int) -> None:
    r = role(compile_ok(kimi(engine=engine, kv=kv)))
    assert (r.block_size, r.kv_bytes_per_token) == (block, bytes_per_token)
    assert r.state_cache is not None
    assert r.state_cache.bytes_per_request == bytes_per_request
    assert r.state_cache.raw_bytes_per_request == 56171520
    assert r.state_cache.source == "inferred"


def test_case_16_resolved_block_size_formula() -> None:
    resolved = resolve(kimi(engine='kvcache_quant_mode = "fp8"', kv="block_size = 128"))
    prov = resolved.provenance["engine.workers.aggregated.kv_cache.block_size"]
    assert (prov.origin, prov.formula) == ("derived",
                                           "block_size 1536 = 128 x ceil(814080/73728)")


def test_case_17_kimi_k3_capacity_in_bytes() -> None:
    payload = compile_ok(kimi(capacity=f"bytes = {8 * 21233664}"))
    r = role(payload)
    assert (r.block_size, r.kv_bytes_per_token, r.num_gpu_blocks) == (768, 27648, 8)
    assert r.state_cache is not None
    assert r.state_cache.bytes_per_request == 61046784
    assert payload.provenance["state_cache"]["aggregated"] == {
        "source": "inferred", "bytes_per_request": 61046784, "state_blocks": 3,
        "allocated_bytes_per_request": 63700992, "raw_bytes_per_request": 56171520}


def test_case_18_kimi_k3_capacity_too_small_and_unit_not_a_divisor() -> None:
    assert errors(kimi(capacity=f"bytes = {4 * 21233664 - 1}")) == [
        f"{CAPACITY}.capacity: state_cache capacity must fit one token block and one request "
        "state: 3 blocks of 768 tokens < 3 state blocks + 1 [state-cache-capacity]\n"
        "  hint: raise capacity.blocks or capacity.bytes"]
    # 512 divides nothing the user wrote; it fails against the *resolved* block size 768
    assert errors(kimi(kv="prefix_match_unit = 512")) == [
        f"{PMU}: prefix_match_unit must be a positive divisor of the resolved block_size 768, "
        "got 512 [prefix-match-unit-not-divisor]"]


def test_case_19_inferred_and_equivalent_manual_config_give_identical_engine_args() -> None:
    inferred = role(compile_ok(kimi(
        kv="block_size = 128\nbytes_per_token = 13824\nprefix_match_unit = 128")))
    assert (inferred.block_size, inferred.prefix_match_unit) == (1536, 128)
    manual_text = kimi(kv="block_size = 1536\nbytes_per_token = 13824\nprefix_match_unit = 128")
    manual_text = manual_text.replace("state_cache = {}",
                                      "state_cache = { bytes_per_request = 61046784 }")
    manual = role(compile_ok(manual_text))
    assert inferred.state_cache is not None and manual.state_cache is not None
    assert (inferred.state_cache.source, manual.state_cache.source) == ("inferred", "overridden")
    # only the sizing provenance differs; everything an engine runs with is identical
    provenance_free = attrs.evolve(inferred.state_cache, source="overridden",
                                   raw_bytes_per_request=None)
    assert attrs.evolve(inferred, state_cache=provenance_free) == manual


# --- 20: other inferred layouts (GDN: Qwen3.5) -------------------------------------------------

def qwen35(*, tensor: int = 1, engine: str = "", kv: str = "state_cache = {}",
           parallelism: str = "") -> str:
    return (HYBRID + engine + f"\n[engine.workers.aggregated.parallelism]\ntensor = {tensor}\n"
            f"{parallelism}\n[engine.workers.aggregated.kv_cache]\n"
            f'capacity = {{ type = "fixed", blocks = 512 }}\n{kv}\n')


def test_case_20_gdn_inferred_state() -> None:
    tp1 = role(compile_ok(qwen35()))
    assert tp1.state_cache is not None
    assert (tp1.block_size, tp1.state_cache.raw_bytes_per_request) == (1088, 64389120)
    tp2 = role(compile_ok(qwen35(tensor=2)))
    assert tp2.state_cache is not None
    assert tp2.state_cache.raw_bytes_per_request == 64389120 // 2
    # speculative drafts widen the conv state
    ngram = role(compile_ok(qwen35(engine='speculation = { kind = "ngram", '
                                          "num_speculative_tokens = 2, "
                                          "acceptance_rates = [0.5, 0.5] }")))
    assert ngram.state_cache is not None
    assert ngram.state_cache.raw_bytes_per_request == 65372160


def test_case_20_gdn_inference_failures() -> None:
    assert errors(qwen35(parallelism="pipeline = 2")) == [
        f"{CAPACITY}.state_cache: state_cache inference: requires vllm and PP=1, got "
        "pipeline=2; set bytes_per_request explicitly [state-cache-inference]"]
    assert errors(qwen35(tensor=3)) == [
        f"{CAPACITY}.state_cache: state_cache inference: GDN key heads 16 and value heads 32 "
        "must be divisible by tensor=3; set bytes_per_request explicitly "
        "[state-cache-inference]"]


def test_case_20_state_cache_source_metadata() -> None:
    disabled = compile_ok(qwen35(kv=""))
    assert role(disabled).state_cache is None
    assert disabled.provenance["state_cache"]["aggregated"] == {"source": "disabled"}
    overridden = compile_ok(HYBRID + MANUAL_STATE)
    assert overridden.provenance["state_cache"]["aggregated"]["source"] == "overridden"


def test_deepseek_v4_is_not_in_the_catalog() -> None:
    (line,) = errors('[engine]\nmodel = "deepseek-ai/DeepSeek-V4"\nhardware = "h200_sxm"\n'
                     + AGG)
    assert line.startswith("engine.model: unknown model 'deepseek-ai/DeepSeek-V4'; closest "
                           "known: deepseek-ai/DeepSeek-V3, ")
    assert line.endswith("huggingface-cli download deepseek-ai/DeepSeek-V4 config.json "
                         "[unknown-model]")


# --- 21-23: speculation ----------------------------------------------------------------------

NGRAM = 'speculation = { kind = "ngram", num_speculative_tokens = %d, acceptance_rates = %s }\n'


def test_case_21_ngram_rules() -> None:
    assert errors(QWEN + NGRAM % (3, "[0.8, 0.6]") + AGG) == [
        "engine.speculation.acceptance_rates: acceptance_rates must contain one conditional "
        "probability per speculative token: 3 expected, got 2 [speculation-rates]"]
    assert errors(QWEN + NGRAM % (2, "[0.8, 0.6]") + "nextn = 2\nnextn_accepted = 1.0\n"
                  + AGG) == [
        "engine.nextn: speculation cannot be combined with nextn [speculation-nextn]"]
    assert errors(QWEN + 'backend = "sglang"\n' + NGRAM % (2, "[0.8, 0.6]") + AGG) == [
        "engine.speculation.kind: ngram speculation requires vllm aggregated/disaggregated "
        "language workers, got backend=sglang [speculation-backend]"]
    spec = role(compile_ok(QWEN + NGRAM % (2, "[0.8, 0.6]") + AGG)).speculation
    assert spec is not None
    assert (spec.kind, spec.acceptance_rates, spec.seed) == ("ngram", (0.8, 0.6), 42)


def test_case_22_nextn_accepted_rules() -> None:
    assert errors(QWEN + "nextn = 2\n" + AGG) == [
        "engine.nextn_accepted: nextn requires explicit nextn_accepted [nextn-accepted]"]
    assert errors(QWEN + "nextn = 2\nnextn_accepted = 2.5\n" + AGG) == [
        "engine.nextn_accepted: nextn_accepted must be within [0, nextn] = [0, 2], got 2.5 "
        "[nextn-accepted]"]
    assert errors(QWEN + "nextn_accepted = 0.5\n" + AGG) == [
        "engine.nextn_accepted: nextn_accepted must be within [0, nextn] = [0, 0], got 0.5 "
        "[nextn-accepted]"]


@pytest.mark.parametrize(("accepted", "rates"), [
    ("2.2", (1.0, 1.0, 0.2)), ("3.0", (1.0, 1.0, 1.0)), ("3", (1.0, 1.0, 1.0)),
    ("0.0", (0.0, 0.0, 0.0)), ("0.5", (0.5, 0.0, 0.0)), ("1", (1.0, 0.0, 0.0)),
])
def test_case_23_legacy_mtp_lowers_to_conditional_rates(accepted: str,
                                                         rates: tuple[float, ...]) -> None:
    payload = compile_ok(QWEN + f"nextn = 3\nnextn_accepted = {accepted}\n" + AGG)
    spec = role(payload).speculation
    assert spec is not None
    assert (spec.kind, spec.num_speculative_tokens, spec.acceptance_rates, spec.seed) == (
        "mtp", 3, rates, 42)
    # the canonical form of the same rates compiles to the same engine args
    canonical = compile_ok(QWEN + 'speculation = { kind = "mtp", num_speculative_tokens = 3, '
                           f"acceptance_rates = {list(rates)} }}\n" + AGG)
    assert canonical.roles == payload.roles


def test_case_23_mtp_rates_provenance() -> None:
    prov = resolve(QWEN + "nextn = 3\nnextn_accepted = 2.2\n" + AGG).provenance
    assert (prov["engine.speculation"].origin, prov["engine.speculation"].formula) == (
        "derived", 'legacy nextn = 3, nextn_accepted = 2.2 -> kind = "mtp", '
        "acceptance_rates = [1.0, 1.0, 0.2]")


# --- 24-25: transfer, offload, P/D state cache ---------------------------------------------------

def test_case_24_aggregated_rejects_kv_transfer_and_offload_is_unsupported() -> None:
    assert errors(QWEN + AGG + "[engine.kv_transfer]\nbandwidth_gb_per_second = 1.0\n") == [
        "engine.kv_transfer: aggregated mode rejects kv_transfer [role-mode-mismatch]"]
    assert errors(QWEN + "[engine.workers.aggregated.kv_cache]\n"
                         'g3_offload = { scope = "worker_local", num_g3_blocks = 4 }\n') == [
        f"{CAPACITY}.g3_offload: g3_offload (the G3 KV tier: disk or remote storage) is not "
        "supported; remove it (host_offload, the G2 host-memory tier, is) [not-supported]"]


PD = HYBRID + 'mode = "disaggregated"\n'


@pytest.mark.parametrize(("with_state", "without"), [("prefill", "decode"),
                                                     ("decode", "prefill")])
def test_case_25_pd_state_cache_on_both_roles(with_state: str, without: str) -> None:
    text = PD + MANUAL_STATE.replace("aggregated", with_state) + f"[engine.workers.{without}]\n"
    assert errors(text) == [
        f"engine.workers.{without}.kv_cache.state_cache: a disaggregated state_cache requires "
        "it on both prefill and decode workers [pd-state-cache]"]
    both = text + MANUAL_STATE.replace("aggregated", without)
    payload = compile_ok(both)
    assert payload.kv_transfer is not None
    assert payload.kv_transfer.state_bytes == 1500


# --- roles, mode and hardware (V1-V7) ---------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    (QWEN + "[engine.workers.prefill]\n", [
        "engine.workers.aggregated: aggregated mode requires workers.aggregated [missing-role]"
        "\n  hint: add an [engine.workers.aggregated] table (it may be empty)",
        "engine.workers: aggregated mode rejects prefill/decode workers [role-mode-mismatch]"
        '\n  hint: set engine.mode = "disaggregated" or remove them']),
    (QWEN + 'mode = "disaggregated"\n[engine.workers.prefill]\n', [
        "engine.workers.decode: disaggregated mode requires prefill and decode workers "
        "[missing-role]"]),
    (QWEN + 'mode = "disaggregated"\n[engine.workers.prefill]\n[engine.workers.decode]\n'
     + AGG, ["engine.workers.aggregated: disaggregated mode rejects aggregated workers "
             "[role-mode-mismatch]"]),
    ('[engine]\nmodel = ""\nhardware = " "\n' + AGG, [
        "engine.model: value must be nonempty [empty-value]",
        "engine.hardware: value must be nonempty [empty-value]"]),
    (QWEN + AGG + 'hardware = "h100_sxm"\n', [
        "engine.workers.aggregated.hardware: worker hardware overrides require prefill/decode "
        "workers in disaggregated mode [hardware-override]"]),
    (QWEN + 'mode = "disaggregated"\n[engine.workers.prefill]\nhardware = " h100_sxm"\n'
     '[engine.workers.decode]\nhardware = "auto"\n', [
         "engine.workers.prefill.hardware: must be one concrete nonempty hardware identifier, "
         "got ' h100_sxm' [hardware-override]",
         "engine.workers.decode.hardware: must be one concrete nonempty hardware identifier, "
         "got 'auto' [hardware-override]"]),
    (QWEN + "afd = {}\n" + AGG, [
        "engine.afd: attention-FFN disaggregation (afd) is not supported; use mode = "
        '"aggregated" or "disaggregated" [not-supported]']),
    (QWEN + 'mode = "afd"\n' + AGG, [
        "engine.mode: attention-FFN disaggregation (afd) is not supported; use mode = "
        '"aggregated" or "disaggregated" [not-supported]']),
], ids=["agg-without-role", "pd-missing-decode", "pd-with-agg", "empty-names",
        "agg-hardware-override", "pd-bad-hardware", "afd-table", "afd-mode"])
def test_roles_mode_and_hardware(text: str, expected: list[str]) -> None:
    assert errors(text) == expected


def test_pd_workers_may_override_hardware() -> None:
    payload = compile_ok(QWEN + 'mode = "disaggregated"\n[engine.workers.prefill]\n'
                         '[engine.workers.decode]\nhardware = "h100_sxm"\n')
    assert (role(payload, "prefill").hardware, role(payload, "decode").hardware) == (
        "h200_sxm", "h100_sxm")


# --- the issue's rule: prefix_match_unit vs the *resolved* block size under speculation --------

K3 = """
[engine]
model = "moonshotai/Kimi-K3"
hardware = "b200_sxm"
{engine}
"""
K3_ROLE = """
[engine.workers.{role}.parallelism]
tensor = {tensor}
[engine.workers.{role}.kv_cache]
{kv}
capacity = {{ type = "fixed", blocks = 512 }}
state_cache = {{}}
{unit}
"""
CANONICAL = 'speculation = { kind = "mtp", num_speculative_tokens = 1, acceptance_rates = [0.8] }'
LEGACY = "nextn = 1\nnextn_accepted = 0.8"


def k3_aggregated(speculation: str, unit: int | None) -> str:
    return (K3.format(engine=f'kvcache_quant_mode = "fp8"\n{speculation}')
            + K3_ROLE.format(role="aggregated", tensor=8, kv="block_size = 128",
                             unit="" if unit is None else f"prefix_match_unit = {unit}"))


@pytest.mark.parametrize("speculation", [CANONICAL, LEGACY], ids=["canonical", "legacy"])
def test_k3_requested_block_unit_is_rejected_with_speculation(speculation: str) -> None:
    # 128 equals the *requested* block size, but the role runs with 1536-token blocks
    assert errors(k3_aggregated(speculation, 128)) == [
        "engine.workers.aggregated.kv_cache.prefix_match_unit: prefix_match_unit does not "
        "support speculative decoding (speculation or nextn > 0) unless it equals the resolved "
        "block_size 1536, got 128 [prefix-match-unit-speculation]\n"
        "  hint: set prefix_match_unit = 1536 or remove it"]


@pytest.mark.parametrize("speculation", [CANONICAL, LEGACY], ids=["canonical", "legacy"])
def test_k3_resolved_block_unit_is_accepted_with_speculation(speculation: str) -> None:
    r = role(compile_ok(k3_aggregated(speculation, 1536)))
    assert (r.block_size, r.prefix_match_unit) == (1536, 1536)
    assert r.speculation is not None
    assert (r.speculation.kind, r.speculation.acceptance_rates) == ("mtp", (0.8,))


def test_k3_canonical_and_legacy_speculation_lower_identically() -> None:
    assert compile_ok(k3_aggregated(CANONICAL, 1536)).roles == \
        compile_ok(k3_aggregated(LEGACY, 1536)).roles


@pytest.mark.parametrize("unit", [128, 1536, None])
def test_k3_without_speculation_any_divisor_is_accepted(unit: int | None) -> None:
    r = role(compile_ok(k3_aggregated("", unit)))
    assert (r.block_size, r.prefix_match_unit, r.speculation) == (1536, unit, None)


def k3_disaggregated(speculation: str, prefill_unit: int, decode_unit: int) -> str:
    # BF16, requested block 64: prefill TP8 resolves to 768, decode TP4 to 1472
    return (K3.format(engine=f'mode = "disaggregated"\n{speculation}')
            + K3_ROLE.format(role="prefill", tensor=8, kv="",
                             unit=f"prefix_match_unit = {prefill_unit}")
            + K3_ROLE.format(role="decode", tensor=4, kv="",
                             unit=f"prefix_match_unit = {decode_unit}"))


def test_k3_disaggregated_roles_resolve_different_blocks() -> None:
    payload = compile_ok(k3_disaggregated("", 64, 64))
    prefill, decode = role(payload, "prefill"), role(payload, "decode")
    assert (prefill.block_size, decode.block_size) == (768, 1472)
    assert decode.state_cache is not None
    assert decode.state_cache.bytes_per_request == 117006336
    assert (prefill.prefix_match_unit, decode.prefix_match_unit) == (64, 64)


@pytest.mark.parametrize("speculation", [CANONICAL, LEGACY], ids=["canonical", "legacy"])
def test_k3_disaggregated_unit_is_checked_per_role(speculation: str) -> None:
    def rule(name: str, block: int, unit: int) -> str:
        return (f"engine.workers.{name}.kv_cache.prefix_match_unit: prefix_match_unit does not "
                "support speculative decoding (speculation or nextn > 0) unless it equals the "
                f"resolved block_size {block}, got {unit} [prefix-match-unit-speculation]\n"
                f"  hint: set prefix_match_unit = {block} or remove it")

    assert errors(k3_disaggregated(speculation, 64, 64)) == [
        rule("prefill", 768, 64), rule("decode", 1472, 64)]
    # the prefill unit that is right for prefill is wrong for decode
    assert errors(k3_disaggregated(speculation, 768, 768)) == [
        "engine.workers.decode.kv_cache.prefix_match_unit: prefix_match_unit must be a "
        "positive divisor of the resolved block_size 1472, got 768 "
        "[prefix-match-unit-not-divisor]"]
    assert errors(k3_disaggregated(speculation, 768, 64)) == [rule("decode", 1472, 64)]
    payload = compile_ok(k3_disaggregated(speculation, 768, 1472))
    assert (role(payload, "prefill").prefix_match_unit,
            role(payload, "decode").prefix_match_unit) == (768, 1472)



# --- traffic (V49-V53) and paths relative to the config ----------------------------------------

TRACE = '[traffic.source]\ntype = "trace"\npaths = ["t.jsonl"]\n'


@pytest.mark.parametrize(("traffic", "expected"), [
    (TRACE + '[traffic.load]\ntype = "poisson"\nrequests_per_second = 1.0\n', [
        "traffic.load.type: trace load must be trace_timestamps or concurrency "
        "[traffic-load]"]),
    (TRACE + "[traffic.stop]\nsessions = 3\n", [
        "traffic.stop.sessions: trace stop accepts only requests and max_virtual_time_seconds "
        "[traffic-stop]"]),
    ('[traffic.source]\ntype = "trace"\npaths = ["a", "b"]\n', [
        "traffic.source.paths: mooncake traces take exactly one path, got 2 [traffic-key]"]),
    ('[traffic.load]\ntype = "trace_timestamps"\n', [
        "traffic.load.type: synthetic source rejects trace_timestamps load; use concurrency, "
        "poisson or constant_rate [traffic-load]"]),
    ('[traffic.source]\ntype = "synthetic-session"\n[traffic.load]\ntype = "poisson"\n'
     "requests_per_second = 1.0\n", [
         "traffic.load.requests_per_second: rate unit does not match source type "
         "'synthetic-session'; use sessions_per_second [traffic-load]"]),
    ('[traffic.load]\ntype = "constant_rate"\n', [
        "traffic.load.requests_per_second: constant_rate load requires requests_per_second "
        "[traffic-load]"]),
    ("[traffic.load]\nspeedup = 2.0\n", [
        "traffic.load.speedup: load type 'concurrency' does not accept speedup [traffic-key]"]),
    ("[traffic.stop]\nrequests = 1\nrequests_per_load_unit = 2.0\n", [
        "traffic.stop: set exactly one count condition, got requests, requests_per_load_unit "
        "[traffic-stop]"]),
    ("[traffic.stop]\nmax_virtual_time_seconds = 3.0\n", [
        "traffic.stop.max_virtual_time_seconds: max_virtual_time_seconds is trace-only "
        "[traffic-stop]",
        "traffic.stop: synthetic traffic needs exactly one count condition (requests or "
        "requests_per_load_unit) [traffic-stop]"]),
    ('[traffic.source]\ntype = "synthetic-session"\nsession = { shared_prefix_ratio = 0.5 }\n', [
        "traffic.source.session.prefix_groups: shared_prefix_ratio > 0 requires prefix_groups "
        "> 0 [traffic-value]"]),
    ("[traffic.source]\ncached_prefix_tokens = 1025\n", [
        "traffic.source.cached_prefix_tokens: cached_prefix_tokens must be <= input_tokens "
        "(1024), got 1025 [traffic-value]"]),
], ids=["trace-poisson", "trace-request-stop", "two-traces", "synthetic-timestamps",
        "session-rate-unit", "missing-rate", "concurrency-speedup", "two-stops",
        "synthetic-time-stop", "prefix-groups", "cached-prefix"])
def test_traffic_rules(traffic: str, expected: list[str]) -> None:
    assert errors(QWEN + AGG + traffic) == expected


@pytest.mark.parametrize(("load", "per_unit", "count"), [
    ("concurrency = 100", 0.07, 7),  # 0.07 x 100 = 7.000000000000001 in floating point
    ("concurrency = 10", 0.3, 3),
    ("concurrency = 4", 0.1, 1),  # never fewer than one
    ('type = "poisson"\nrequests_per_second = 2.5', 3.0, 8),  # 7.5 rounds half to even
])
def test_relative_stop_rounds(load: str, per_unit: float, count: int) -> None:
    payload = compile_ok(QWEN + AGG + f"[traffic.load]\n{load}\n"
                         f"[traffic.stop]\nrequests_per_load_unit = {per_unit}\n")
    assert payload.workload.stop == Stop(requests=count)


def test_relative_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    text = QWEN + '[engine.workers.aggregated.timing]\ntype = "table"\npath = "t.csv"\n' \
        + TRACE + '[traffic.load]\ntype = "trace_timestamps"\n'
    payload = compile_text(text, base_dir=tmp_path, registry=REGISTRY)
    assert role(payload).timing.path == str(tmp_path / "t.csv")
    assert payload.workload.source.path == str(tmp_path / "t.jsonl")
    # without a folder (text compiled in memory) they stay as written
    payload = compile_ok(text)
    assert role(payload).timing.path == "t.csv"
    assert payload.workload.source.path == "t.jsonl"
