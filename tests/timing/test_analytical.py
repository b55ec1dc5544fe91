"""Physical sanity of the analytical (default) step-time model."""

from __future__ import annotations

import itertools

import attrs
import pytest

from servesim.catalog import load_gpu, load_model
from servesim.errors import ReplayError
from servesim.payload import RoleArgs, SpeculationArgs, TimingArgs
from servesim.timing import make_timer
from servesim.timing.analytical import (
    AnalyticalConstants,
    AnalyticalTimer,
    Curve,
    build_geometry,
    load_constants,
    timer_from_role,
)


def _role(**kw: object) -> RoleArgs:
    base: dict[str, object] = {"worker_type": "aggregated", "backend": "vllm",
                               "model": "Qwen/Qwen3-32B", "hardware": "h100_sxm"}
    base.update(kw)
    return RoleArgs(**base)  # type: ignore[arg-type]


def _timer(model: str = "Qwen/Qwen3-32B", gpu: str = "h100_sxm", **kw: object) -> AnalyticalTimer:
    geo = build_geometry(load_model(model), load_gpu(gpu), **kw)  # type: ignore[arg-type]
    return AnalyticalTimer(geo, load_constants())


def test_default_timing_is_registered() -> None:
    timer = make_timer(_role(timing=TimingArgs(type="default")))
    assert isinstance(timer, AnalyticalTimer)
    assert timer.decode_ms(8, 8 * 1024, 1024, 10**6) > 0


def test_empty_halves_cost_nothing() -> None:
    t = _timer()
    assert t.prefill_ms(0, 0, 0) == 0.0
    assert t.prefill_ms(3, 512, 512) == 0.0  # fully cached: no new tokens
    assert t.decode_ms(0, 0, 0, 100) == 0.0


@pytest.mark.parametrize("model", ["Qwen/Qwen3-32B", "deepseek-ai/DeepSeek-R1",
                                   "openai/gpt-oss-120b", "Qwen/Qwen3.5-35B-A3B",
                                   "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"])
def test_monotone_in_batch_and_context(model: str) -> None:
    t = _timer(model, "b200_sxm", tensor=8)
    decode = [t.decode_ms(b, b * 2048, 2048, 0) for b in (1, 4, 16, 64, 256)]
    assert decode == sorted(decode) and decode[0] < decode[-1]
    ctx = [t.decode_ms(16, 16 * c, c, 0) for c in (128, 1024, 8192, 65536)]
    assert ctx == sorted(ctx) and ctx[0] < ctx[-1]
    prefill = [t.prefill_ms(b, 1024, 0) for b in (1, 2, 8)]
    assert prefill == sorted(prefill) and prefill[0] < prefill[-1]
    longer = [t.prefill_ms(1, s, 0) for s in (256, 1024, 4096, 16384)]
    assert longer == sorted(longer) and longer[0] < longer[-1]


def test_more_tensor_parallelism_means_less_weight_time_per_gpu() -> None:
    times = [_timer(tensor=tp).decode_ms(1, 1024, 1024, 0) for tp in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True)
    geos = [build_geometry(load_model("Qwen/Qwen3-32B"), load_gpu("h100_sxm"), tensor=tp)
            for tp in (1, 2, 4, 8)]
    weights = [sum(c.count * c.dense_bytes for c in g.classes) for g in geos]
    for w1, w2 in itertools.pairwise(weights):
        assert w2 == pytest.approx(w1 / 2)


def test_fp8_weights_are_faster_than_bf16_on_a_gpu_with_fp8_flops() -> None:
    bf16 = _timer(gemm_quant="bf16")
    fp8 = _timer(gemm_quant="fp8")
    assert fp8.decode_ms(8, 8 * 1024, 1024, 0) < bf16.decode_ms(8, 8 * 1024, 1024, 0)
    assert fp8.prefill_ms(4, 4096, 0) < bf16.prefill_ms(4, 4096, 0)
    # the checkpoint's own precision is the default (DeepSeek-V3 ships FP8 weights)
    ckpt = _timer("deepseek-ai/DeepSeek-V3", "h200_sxm", tensor=8, moe_tensor=8)
    bf = _timer("deepseek-ai/DeepSeek-V3", "h200_sxm", tensor=8, moe_tensor=8,
                gemm_quant="bf16", moe_quant="bf16")
    assert ckpt.geometry.gemm_quant == "fp8"
    assert ckpt.decode_ms(4, 4096, 1024, 0) < bf.decode_ms(4, 4096, 1024, 0)


def test_weight_only_4bit_kernels_share_one_efficiency() -> None:
    # int4 (w4a16) and, on a GPU without FP4 tensor cores, mxfp4 both dequantise to bf16:
    # compute-bound prefill prices them alike, below bf16 weights' efficiency.
    int4, mxfp4, bf16 = (_timer(gemm_quant=q) for q in ("int4_wo", "mxfp4", "bf16"))
    prompt = (8, 4096, 0)  # 8 prompts of 4096 tokens
    assert int4.prefill_ms(*prompt) == pytest.approx(mxfp4.prefill_ms(*prompt), rel=1e-3)
    assert int4.prefill_ms(*prompt) > bf16.prefill_ms(*prompt)
    # one-token decode reads the weights: 4-bit weights are faster there
    assert int4.decode_ms(1, 1024, 1024, 0) < bf16.decode_ms(1, 1024, 1024, 0)


def test_a_checkpoint_s_own_quantization_picks_the_kernels() -> None:
    # Kimi K2.5 ships int4 (w4a16) routed experts: on a B200, bf16 tensor cores after
    # dequantisation, not the FP4 ones its size alone would suggest; gpt-oss's MXFP4
    # experts run FP4 ones, and the bf16 layers of both bf16 ones.
    kimi = _timer("moonshotai/Kimi-K2.5", "b200_sxm", tensor=8).geometry
    assert (kimi.gemm_quant, kimi.moe_quant, kimi.moe_peak) == (
        "bf16", "int4", load_gpu("b200_sxm").bf16_flops)
    gpt = _timer("openai/gpt-oss-120b", "b200_sxm", tensor=8).geometry
    assert (gpt.gemm_quant, gpt.moe_quant, gpt.moe_peak) == (
        "bf16", "mxfp4", load_gpu("b200_sxm").fp4_flops)


def test_4bit_weights_run_fp4_tensor_cores_only_where_the_gpu_has_them() -> None:
    # gpt-oss's MXFP4 experts: FP4 tensor cores on Blackwell, weight-only kernels on
    # Hopper; int4 experts are weight-only everywhere. Each class has its own level.
    kernels = {(model, gpu): _timer(model, gpu, tensor=8).geometry.moe_kernel
               for model in ("openai/gpt-oss-120b", "moonshotai/Kimi-K2.5")
               for gpu in ("h100_sxm", "b200_sxm")}
    assert kernels == {("openai/gpt-oss-120b", "h100_sxm"): "w4a16",
                       ("openai/gpt-oss-120b", "b200_sxm"): "fp4",
                       ("moonshotai/Kimi-K2.5", "h100_sxm"): "w4a16",
                       ("moonshotai/Kimi-K2.5", "b200_sxm"): "w4a16"}
    slower = load_constants().with_values(**{"moe_quant_level.w4a16": 0.25})
    prompt = (8, 4096, 0)
    for gpu, changes in (("h100_sxm", True), ("b200_sxm", False)):
        geo = _timer("openai/gpt-oss-120b", gpu, tensor=8).geometry
        before = AnalyticalTimer(geo, load_constants()).prefill_ms(*prompt)
        after = AnalyticalTimer(geo, slower).prefill_ms(*prompt)
        assert (after > before) is changes


def _expert_ms(gpu: str, moe_quant: str | None = None) -> float:
    """A 64-request decode step's routed-expert time on ``gpu`` (gpt-oss-120b, TP4)."""
    t = _timer("openai/gpt-oss-120b", gpu, tensor=4, moe_tensor=4, moe_quant=moe_quant)
    layers = sum(c.count for c in t.geometry.classes if c.moe)
    return layers * t._moe_s(64) * 1e3


def test_weight_only_experts_are_bounded_by_dequantisation_not_bandwidth() -> None:
    # An H200 is an H100's SMs with 1.43x the memory bandwidth: bf16 experts read faster,
    # weight-only 4-bit ones are bounded by the SMs' dequantisation rate on both.
    h100, h200 = load_gpu("h100_sxm"), load_gpu("h200_sxm")
    assert h200.mem_bw > 1.4 * h100.mem_bw
    assert h200.w4a16_bytes_per_s == h100.w4a16_bytes_per_s
    assert _expert_ms("h200_sxm", "bf16") < 0.8 * _expert_ms("h100_sxm", "bf16")
    assert _expert_ms("h200_sxm") == pytest.approx(_expert_ms("h100_sxm"), rel=0.02)
    # the ceiling binds below the bandwidth: without it the H200 would be faster
    geo = _timer("openai/gpt-oss-120b", "h200_sxm", tensor=4, moe_tensor=4).geometry
    assert geo.moe_kernel == "w4a16" and geo.moe_dequant_bw == h200.w4a16_bytes_per_s
    unbounded = AnalyticalTimer(attrs.evolve(geo, moe_dequant_bw=0.0), load_constants())
    assert unbounded._moe_s(64) < 0.8 * _timer(
        "openai/gpt-oss-120b", "h200_sxm", tensor=4, moe_tensor=4)._moe_s(64)
    # tensor-core FP4 (Blackwell) reads its experts at the memory bandwidth
    assert _timer("openai/gpt-oss-120b", "b200_sxm", tensor=4).geometry.moe_dequant_bw == 0.0


def test_exposed_softmax_is_priced_by_the_gpus_exponential_throughput() -> None:
    # one exponential per query-key pair and head; Blackwell Ultra doubles the units'
    # throughput per SM, so the same prompt's exposed softmax costs B300 less than B200
    exposed, hidden = (load_constants().with_values(softmax_exposed=v) for v in (0.5, 0.0))
    extra = {}
    for gpu in ("b200_sxm", "b300_sxm"):
        geo = _timer("Qwen/Qwen3-32B", gpu).geometry
        with_it, without = (AnalyticalTimer(geo, c) for c in (exposed, hidden))
        extra[gpu] = with_it.prefill_ms(1, 8192, 0) - without.prefill_ms(1, 8192, 0)
        assert with_it.decode_ms(8, 8 * 4096, 4096, 0) == without.decode_ms(8, 8 * 4096, 4096, 0)
    rates = {gpu: load_gpu(gpu).exp_per_s for gpu in extra}
    assert extra["b200_sxm"] > 0
    assert extra["b300_sxm"] == pytest.approx(
        extra["b200_sxm"] * rates["b200_sxm"] / rates["b300_sxm"], rel=1e-9)


def test_fp8_weights_without_fp8_tensor_cores_run_bf16_kernels() -> None:
    # An A100 has no FP8 tensor cores: FP8 weights are dequantised into bf16 GEMMs, which
    # run at bf16's efficiency and only read half the bytes. On an H100 they run FP8 ones.
    def prefill_and_decode(gpu: str, quant: str) -> tuple[float, float]:
        t = _timer("meta-llama/Meta-Llama-3.1-70B", gpu, tensor=8, gemm_quant=quant)
        return t.prefill_ms(8, 4096, 0), t.decode_ms(1, 1024, 1024, 0)

    (fp8_prefill, fp8_decode), (bf16_prefill, bf16_decode) = (
        prefill_and_decode("a100_sxm", q) for q in ("fp8", "bf16"))
    assert _timer("Qwen/Qwen3-32B", "a100_sxm", gemm_quant="fp8").geometry.gemm_kernel == "bf16"
    assert fp8_prefill == pytest.approx(bf16_prefill, rel=0.02)
    assert fp8_decode < bf16_decode
    h100_fp8, h100_bf16 = (prefill_and_decode("h100_sxm", q)[0] for q in ("fp8", "bf16"))
    assert h100_fp8 < h100_bf16


def test_a_speculative_decode_pass_verifies_every_draft() -> None:
    # MTP with 3 drafts: each of 8 requests computes 4 tokens per pass over its context.
    # Dearer than 8 plain decodes, cheaper than 32 requests' (which read 4x the KV cache).
    llama = dict(model="meta-llama/Meta-Llama-3.1-70B", hardware="h200_sxm", tensor=8,
                 kv_bytes_per_token=2 * 1 * 128 * 80 * 2)  # one KV head per GPU, bf16
    mtp = timer_from_role(_role(**llama, speculation=SpeculationArgs(
        kind="mtp", num_speculative_tokens=3, acceptance_rates=(1.0, 1.0, 0.5))))
    plain = timer_from_role(_role(**llama))
    assert mtp.geometry.decode_queries == 4
    ctx = 4096
    assert (plain.decode_ms(8, 8 * ctx, ctx, 0) < mtp.decode_ms(8, 8 * ctx, ctx, 0)
            < plain.decode_ms(32, 32 * ctx, ctx, 0))
    # prompt work is not speculative
    assert mtp.prefill_ms(2, 2048, 0) == plain.prefill_ms(2, 2048, 0)


def test_prefill_quadratic_term_is_visible() -> None:
    # Same new tokens, longer cached prefix: only attention grows, linearly in the prefix.
    t = _timer(tensor=2)
    base = t.prefill_ms(1, 2048, 0)
    p4k = t.prefill_ms(1, 2048 + 4096, 4096)
    p8k = t.prefill_ms(1, 2048 + 8192, 8192)
    assert base < p4k < p8k
    # Doubling a long prompt more than doubles the marginal attention-heavy cost.
    assert t.prefill_ms(1, 32768, 0) > 2 * t.prefill_ms(1, 16384, 0)


def test_moe_touched_experts_saturate() -> None:
    t = _timer("Qwen/Qwen3-30B-A3B", "h100_sxm")
    g = t.geometry
    one = t._moe_s(1)
    many = t._moe_s(4096)
    assert 0 < one < many
    # with every expert touched, more tokens only add compute, not weight traffic
    assert g.local_experts * (1 - (1 - g.topk / g.experts) ** 4096) == pytest.approx(g.experts)


def test_attention_data_parallel_ranks_feed_the_experts() -> None:
    solo = _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", tensor=1, moe_expert=8)
    dp = _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", tensor=1, attention_data=8,
                moe_expert=8)
    assert dp.decode_ms(64, 64 * 1024, 1024, 0) > solo.decode_ms(64, 64 * 1024, 1024, 0)


def test_prefill_role_prices_a_whole_forward() -> None:
    agg = _timer(worker_type="aggregated")
    pre = _timer(worker_type="prefill")
    assert pre.prefill_ms(1, 1024, 0) > agg.prefill_ms(1, 1024, 0)


def test_unknown_model_and_gpu_are_named() -> None:
    with pytest.raises(ReplayError) as err:
        timer_from_role(_role(model="acme/NoSuchModel-7B"))
    (diag,) = err.value.diagnostics
    assert diag.code == "timing-unsupported"
    assert "acme/NoSuchModel-7B" in diag.message
    assert diag.where == "engine.workers.aggregated.model"
    with pytest.raises(ReplayError) as err:
        timer_from_role(_role(hardware="tpu_v9"))
    assert "tpu_v9" in err.value.diagnostics[0].message
    assert err.value.diagnostics[0].where == "engine.workers.aggregated.hardware"


def test_unsupported_architecture_is_a_diagnostic() -> None:
    model = load_model("Qwen/Qwen3-30B-A3B")
    broken = attrs.evolve(model, moe_intermediate_size=None)
    with pytest.raises(ReplayError, match="MoE layers without moe_intermediate_size"):
        build_geometry(broken, load_gpu("h100_sxm"))
    with pytest.raises(ReplayError, match="cannot price fp3 weights"):
        build_geometry(model, load_gpu("h100_sxm"), gemm_quant="fp3")


def test_curve_interpolates_in_log_space_and_clamps() -> None:
    c = Curve((1.0, 4.0), (0.2, 0.6))
    assert c(0.5) == 0.2 and c(100) == 0.6
    assert c(2.0) == pytest.approx(0.4)


def test_constants_carry_provenance() -> None:
    c = load_constants()
    assert c.provenance
    assert {"vllm", "sglang", "trtllm"} <= set(c.backends)


def test_constants_round_trip_through_json() -> None:
    c = load_constants()
    again = type(c).from_json(c.to_json())
    assert again == c
    assert again.expert_us == c.expert_us
    assert again.backends["sglang"].request_ms == c.backends["sglang"].request_ms


def test_request_latency_is_outside_the_passes() -> None:
    base = load_constants()
    slow = base.with_values(**{"vllm.request_ms": 500.0, "vllm.request_us_per_token": 100.0})
    geo = build_geometry(load_model("Qwen/Qwen3-32B"), load_gpu("h100_sxm"), backend="vllm")
    fast_t, slow_t = AnalyticalTimer(geo, base), AnalyticalTimer(geo, slow)
    # the front end adds to a request's latency, never to a pass
    assert slow_t.prefill_ms(4, 1024, 0) == fast_t.prefill_ms(4, 1024, 0)
    assert slow_t.decode_ms(8, 8192, 1024, 0) == fast_t.decode_ms(8, 8192, 1024, 0)
    assert slow_t.request_ms(1024) > fast_t.request_ms(1024)
    # tokenising a longer prompt takes longer
    assert slow_t.request_ms(8192) > slow_t.request_ms(1024) >= 500.0
    assert fast_t.request_ms(0) >= 0.0


def test_a_dtypes_kernel_level_prices_only_its_own_gemms() -> None:
    # the fit sets each dtype's level by key, for dense and for expert GEMMs apart
    base = load_constants()
    slow = base.with_values(**{"moe_quant_level.fp8": base.value("moe_quant_level.fp8") / 2})
    assert slow.value("moe_quant_level.fp8") == base.moe_quant_level["fp8"] / 2
    assert slow.quant_level == base.quant_level

    def prefill_ms(c: AnalyticalConstants, model: str, quant: str) -> float:
        geo = build_geometry(load_model(model), load_gpu("h100_sxm"), tensor=8,
                             gemm_quant=quant, moe_quant=quant)
        return AnalyticalTimer(geo, c).prefill_ms(1, 8192, 0)

    moe, dense = "deepseek-ai/DeepSeek-R1", "meta-llama/Meta-Llama-3.1-70B"
    assert prefill_ms(slow, moe, "fp8") > prefill_ms(base, moe, "fp8")
    assert prefill_ms(slow, moe, "bf16") == prefill_ms(base, moe, "bf16")
    assert prefill_ms(slow, dense, "fp8") == prefill_ms(base, dense, "fp8")


def test_fp8_gemms_keep_their_efficiency_at_long_prompts() -> None:
    # Measured H100 GEMMs (n = k = 8192): bf16 kernels fall from 82% of peak at 1,024
    # tokens to 68% at 16,384; fp8 ones stay at 62-73%. So the longer the prompt, the
    # larger the share of bf16's time an FP8 projection saves.
    def gemm_ms(quant: str, tokens: int) -> float:
        geo = build_geometry(load_model("meta-llama/Meta-Llama-3.1-70B"), load_gpu("h100_sxm"),
                             tensor=8, gemm_quant=quant)
        return AnalyticalTimer(geo, load_constants())._gemm_s(tokens, tokens) * 1e3

    short, long = (gemm_ms("fp8", m) / gemm_ms("bf16", m) for m in (1024, 16384))
    assert long < short < 1.0 and long != pytest.approx(short, rel=0.05)


def test_each_touched_expert_costs_time() -> None:
    base = load_constants()
    geo = build_geometry(load_model("Qwen/Qwen3-30B-A3B"), load_gpu("h100_sxm"))
    cheap = AnalyticalTimer(geo, base.with_values(expert_us=0.01))
    dear = AnalyticalTimer(geo, base.with_values(expert_us=10.0))
    # one token touches topk experts per layer, 64 tokens many more: the fixed cost grows
    extra_one = dear._moe_s(1) - cheap._moe_s(1)
    extra_many = dear._moe_s(64) - cheap._moe_s(64)
    assert 0 < extra_one < extra_many
    # a dense model has no experts to pay for
    dense = build_geometry(load_model("Qwen/Qwen3-32B"), load_gpu("h100_sxm"))
    assert AnalyticalTimer(dense, base.with_values(expert_us=10.0)).decode_ms(
        8, 8192, 1024, 0) == AnalyticalTimer(dense, base).decode_ms(8, 8192, 1024, 0)


@pytest.mark.parametrize("worker_type", ["aggregated", "prefill"])
def test_each_moe_layer_costs_its_extra_kernels_every_pass(worker_type: str) -> None:
    base = load_constants().with_values(**{"vllm.moe_layer_us": 0.01})
    dear = base.with_values(**{"vllm.moe_layer_us": 100.01})

    def extra_ms(model: str) -> tuple[float, float]:
        geo = build_geometry(load_model(model), load_gpu("h100_sxm"), tensor=8,
                             worker_type=worker_type)
        a, b = AnalyticalTimer(geo, base), AnalyticalTimer(geo, dear)
        return (b.decode_ms(8, 8192, 1024, 0) - a.decode_ms(8, 8192, 1024, 0),
                b.prefill_ms(1, 1024, 0) - a.prefill_ms(1, 1024, 0))

    # DeepSeek-R1: 58 of its 61 layers are MoE layers, 0.1 ms more each per pass
    decode, prefill = extra_ms("deepseek-ai/DeepSeek-R1")
    assert decode == pytest.approx(58 * 0.1)
    # a prefill worker's pass is a whole forward; an aggregated one's prompt work joins a
    # decode forward, which already paid for its layers
    assert prefill == (pytest.approx(58 * 0.1) if worker_type == "prefill" else 0.0)
    # a dense model has no MoE layer to pay for
    assert extra_ms("Qwen/Qwen3-32B") == (0.0, 0.0)


def test_gpus_not_fitted_follow_their_datasheets() -> None:
    # Same formulas and constants everywhere: only the hardware facts change. Decode of a
    # dense model is bandwidth-bound (H200 > H100 > A100), prefill compute-bound.
    def timer(gpu: str) -> AnalyticalTimer:
        return _timer("Qwen/Qwen3-32B", gpu, tensor=2, gemm_quant="bf16")

    decode = {g: timer(g).decode_ms(8, 8 * 2048, 2048, 0)
              for g in ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm")}
    assert decode["b200_sxm"] < decode["h200_sxm"] < decode["h100_sxm"] < decode["a100_sxm"]
    prefill = {g: timer(g).prefill_ms(4, 4096, 0) for g in ("a100_sxm", "h100_sxm", "b200_sxm")}
    assert prefill["b200_sxm"] < prefill["h100_sxm"] < prefill["a100_sxm"]


def test_request_latency_grows_with_the_layers_to_set_up() -> None:
    c = load_constants().with_values(**{"vllm.request_layer_us": 500.0})
    shallow = AnalyticalTimer(build_geometry(load_model("Qwen/Qwen3-32B"),
                                             load_gpu("h100_sxm"), backend="vllm"), c)
    deep = AnalyticalTimer(build_geometry(load_model("meta-llama/Meta-Llama-3.1-70B"),
                                          load_gpu("h100_sxm"), backend="vllm"), c)
    assert deep.geometry.num_layers > shallow.geometry.num_layers
    assert deep.request_ms(1024) > shallow.request_ms(1024)


def test_each_moe_layer_adds_to_a_requests_set_up() -> None:
    base = load_constants().with_values(**{"vllm.request_moe_layer_us": 0.0})
    dear = base.with_values(**{"vllm.request_moe_layer_us": 100.0})

    def extra_ms(model: str) -> float:
        geo = build_geometry(load_model(model), load_gpu("h100_sxm"), tensor=8)
        return AnalyticalTimer(geo, dear).request_ms(1024) - AnalyticalTimer(
            geo, base).request_ms(1024)

    # DeepSeek-R1: 58 of its 61 layers are MoE layers, 0.1 ms more each per request
    assert extra_ms("deepseek-ai/DeepSeek-R1") == pytest.approx(58 * 0.1)
    # a dense model has no MoE layer to set up
    assert extra_ms("meta-llama/Meta-Llama-3.1-70B") == 0.0


def test_each_mla_layer_costs_its_extra_kernels() -> None:
    # MLA runs more kernels per layer than grouped-query attention: every pass pays for
    # them (mla_layer_us), and so does each request's set-up (request_mla_layer_us)
    zero = {"vllm.mla_layer_us": 0.0, "vllm.request_mla_layer_us": 0.0}
    base = load_constants().with_values(**zero)
    dear = base.with_values(**{"vllm.mla_layer_us": 100.0,
                               "vllm.request_mla_layer_us": 1000.0})

    def extra_ms(model: str) -> tuple[float, float]:
        geo = build_geometry(load_model(model), load_gpu("h100_sxm"), tensor=8)
        a, b = AnalyticalTimer(geo, base), AnalyticalTimer(geo, dear)
        return (b.decode_ms(8, 8192, 1024, 0) - a.decode_ms(8, 8192, 1024, 0),
                b.request_ms(1024) - a.request_ms(1024))

    # DeepSeek-R1: all 61 layers are MLA, 0.1 ms more each per pass, 1 ms per request
    decode, request = extra_ms("deepseek-ai/DeepSeek-R1")
    assert decode == pytest.approx(61 * 0.1)
    assert request == pytest.approx(61 * 1.0)
    # grouped-query attention, dense or MoE, has none
    assert extra_ms("meta-llama/Meta-Llama-3.1-70B") == (0.0, 0.0)
    assert extra_ms("Qwen/Qwen3-235B-A22B") == (0.0, 0.0)


def test_the_busiest_expert_parallel_rank_sets_the_moe_time() -> None:
    # Same GPUs and experts: sharded by expert (EP8) or by slice (moe-TP8). At a few tokens
    # a pass, routing leaves some EP rank with about twice the mean touched experts, so
    # EP is slower; with thousands of tokens every rank is loaded alike.
    # (the fixed per-expert cost, which favours few whole experts per GPU, and the
    # activation copies, which favour expert sharding, are set aside)
    c = load_constants().with_values(expert_us=0.0, moe_act_passes=0.0)

    def moe(**kw: object) -> AnalyticalTimer:
        geo = build_geometry(load_model("deepseek-ai/DeepSeek-R1"), load_gpu("b200_sxm"),
                             tensor=8, **kw)  # type: ignore[arg-type]
        return AnalyticalTimer(geo, c)

    ep, mtp = moe(moe_expert=8), moe(moe_tensor=8)
    small = ep._moe_s(4) / mtp._moe_s(4)
    large = ep._moe_s(8192) / mtp._moe_s(8192)
    assert small > 1.1
    assert large < small
    assert large == pytest.approx(1.0, rel=0.1)


def test_each_gpu_moves_the_activations_of_the_token_expert_pairs_it_computes() -> None:
    # A prompt's token-expert pairs have their hidden-size activations permuted into the
    # experts' layout and combined back. With experts sliced over eight GPUs (moe-TP8)
    # every GPU computes a slice of every pair and moves all of them; with whole experts
    # spread over eight GPUs (EP8) each GPU moves only the pairs routed to it.
    base = load_constants().with_values(expert_us=0.0, moe_act_passes=0.0)
    copies = base.with_values(moe_act_passes=8.0)

    def extra_ms(tokens: int, **kw: object) -> float:
        geo = build_geometry(load_model("deepseek-ai/DeepSeek-R1"), load_gpu("b200_sxm"),
                             tensor=8, **kw)  # type: ignore[arg-type]
        return 1e3 * (AnalyticalTimer(geo, copies)._moe_s(tokens)
                      - AnalyticalTimer(geo, base)._moe_s(tokens))

    # 16,384 tokens x 8 experts x 7,168 x 2 bytes x 8 copies: 15 GB, some 2 ms at 8 TB/s
    assert 1.0 < extra_ms(16384, moe_tensor=8) < 4.0
    # twice the tokens, twice the bytes
    assert extra_ms(16384, moe_tensor=8) == pytest.approx(
        2 * extra_ms(8192, moe_tensor=8), rel=0.05)
    # EP8 moves about an eighth of the pairs (a little more on its busiest GPU)
    ratio = extra_ms(16384, moe_expert=8) / extra_ms(16384, moe_tensor=8)
    assert 1 / 8 <= ratio < 1 / 6
    # a decode step of a few tokens moves next to nothing
    assert extra_ms(8, moe_tensor=8) < 0.01


def test_a_long_prompts_all_reduce_moves_each_byte_faster_than_a_decode_steps() -> None:
    # A decode step's all-reduce of a few MB is latency-bound; a prompt's 100 MB one
    # nearly saturates NVLink. Per token, bandwidth time falls as the message grows.
    t = _timer("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", tensor=8)
    per_token = [t._comm_s(n, False) / n for n in (16, 256, 4096, 16384)]
    assert per_token == sorted(per_token, reverse=True)
    assert per_token[0] > 2 * per_token[-1]


def test_expert_parallelism_under_attention_tp_needs_no_all_to_all() -> None:
    # Under attention TP every GPU holds every token: the experts' partial outputs are
    # summed by the all-reduce a dense MLP also needs, so EP8 and moe-TP8 communicate
    # alike; attention DP spreads the tokens and adds dispatch/combine traffic.
    def comm(**kw: object) -> float:
        return _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", **kw)._comm_s(8192, True)

    assert comm(tensor=8, moe_expert=8) == pytest.approx(comm(tensor=8, moe_tensor=8))
    assert comm(tensor=1, attention_data=8, moe_expert=8) > 0.0


def test_a_token_crosses_to_each_expert_rank_once() -> None:
    # DeepSeek routes a token to 8 experts; over two expert-parallel ranks it is sent to
    # the other rank at most once, whatever how many of its experts live there.
    t = _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", tensor=1, attention_data=2,
               moe_expert=2)
    g = t.geometry
    moe_layers = sum(c.count for c in g.classes if c.moe)
    msg = 8192 * g.hidden * 2
    one_hop = msg / (g.ep_link_bw * load_constants().link_curve(msg))
    assert 0 < t._comm_s(8192, False) <= 2 * moe_layers * one_hop * (1 + 1e-9)


def test_a_lone_prefill_under_attention_dp_feeds_the_experts_its_own_tokens() -> None:
    # A prompt on one attention-DP rank: the experts see its tokens, not as many again
    # from every other rank, so more ranks do not make that prefill dearer.
    def prefill(dp: int) -> float:
        return _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", tensor=1, attention_data=dp,
                      moe_expert=8).prefill_ms(1, 8192, 0)

    assert prefill(8) == pytest.approx(prefill(2), rel=0.02)


def test_ranks_prefilling_together_feed_the_experts_all_their_tokens() -> None:
    # Eight attention-DP ranks each prefilling 2048 tokens in one pass: the experts see
    # 16384 tokens, so each rank's prefill half is dearer than a lone 2048-token prefill;
    # with its own tokens only, the group price is the lone price.
    t = _timer("deepseek-ai/DeepSeek-R1", "b200_sxm", tensor=1, attention_data=8,
               moe_expert=8)
    lone = t.prefill_ms(1, 2048, 0)
    assert t.prefill_group_ms(1, 2048, 0, 2048) == lone
    two, eight = (t.prefill_group_ms(1, 2048, 0, n * 2048) for n in (2, 8))
    assert lone <= two < eight  # two ranks' tokens still only read the experts' weights
    # no experts, nothing shared
    dense = _timer("Qwen/Qwen3-32B", "h100_sxm", attention_data=2)
    assert dense.prefill_group_ms(1, 2048, 0, 4096) == dense.prefill_ms(1, 2048, 0)


def test_sglang_prices_a_pass_with_prompt_work_as_a_whole_forward() -> None:
    # SGLang never mixes prompt work with decode steps, so its aggregated workers price
    # a prompt pass like a prefill worker does, not as the margin over a decode forward.
    def prefill(backend: str, worker_type: str) -> float:
        return _timer(backend=backend, worker_type=worker_type).prefill_ms(1, 1024, 0)

    assert prefill("sglang", "aggregated") == prefill("sglang", "prefill")
    assert prefill("vllm", "aggregated") < prefill("vllm", "prefill")


def test_sparse_attention_reads_the_indexers_top_k() -> None:
    # GLM-5's DeepSeek sparse attention: each query reads the 2,048 cached tokens its
    # lightning indexer picks, and the indexer scores every cached token with FP8 keys
    sparse = _timer("zai-org/GLM-5-FP8", "b200_sxm", tensor=8)
    geo = sparse.geometry
    assert geo.sparse_topk == 2048
    assert geo.index_bytes == 128 + 4  # one FP8 key of index_head_dim and its scale
    dense = AnalyticalTimer(attrs.evolve(geo, sparse_topk=None, index_flops=0.0,
                                         index_bytes=0.0), load_constants())

    def decode(t: AnalyticalTimer, ctx: int) -> float:
        return t.decode_ms(16, 16 * ctx, ctx, 0)

    # within the top-k every token is read anyway: the indexer only adds
    assert decode(sparse, 1024) > decode(dense, 1024)
    assert sparse.prefill_ms(1, 2048, 0) > dense.prefill_ms(1, 2048, 0)
    # beyond it, attention stops growing with the context; only the indexer's reads do
    assert decode(sparse, 65536) < decode(dense, 65536)
    assert (decode(sparse, 65536) - decode(sparse, 32768)
            < (decode(dense, 65536) - decode(dense, 32768)) / 4)
    assert sparse.prefill_ms(1, 32768, 0) < dense.prefill_ms(1, 32768, 0)


def test_a_sparse_layers_indexer_launches_a_layers_worth_of_kernels() -> None:
    base = load_constants()
    dear = base.with_values(**{"vllm.layer_us": base.backends["vllm"].layer_us + 100.0})

    def extra_ms(model: str) -> float:
        geo = build_geometry(load_model(model), load_gpu("b200_sxm"), tensor=8)
        return (AnalyticalTimer(geo, dear).decode_ms(8, 8192, 1024, 0)
                - AnalyticalTimer(geo, base).decode_ms(8, 8192, 1024, 0))

    # GLM-5: 78 layers, each with an indexer; DeepSeek-R1 (dense MLA): 61 layers
    assert extra_ms("zai-org/GLM-5-FP8") == pytest.approx(2 * 78 * 0.1)
    assert extra_ms("deepseek-ai/DeepSeek-R1") == pytest.approx(61 * 0.1)


def test_sparse_attention_without_its_indexer_is_a_diagnostic() -> None:
    model = load_model("zai-org/GLM-5-FP8")
    config = {k: v for k, v in model.config.items() if k != "index_n_heads"}
    broken = attrs.evolve(model, config=config)
    with pytest.raises(ReplayError, match=r"sparse attention \(index_topk\) without "
                                          r"index_n_heads and index_head_dim"):
        build_geometry(broken, load_gpu("b200_sxm"))
