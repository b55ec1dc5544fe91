"""TensorRT-LLM: GUARANTEED_NO_EVICT admission, nothing preempted (spec §5.4)."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import ClassVar

from servesim.backends.base import Backend


class Trtllm(Backend):
    """TensorRT-LLM's scheduler: a request is admitted only when the blocks of its whole
    sequence fit beside the blocks every admitted request may still take, so nothing is
    ever preempted; its output is clamped to what the pool holds (R2); attention-DP
    balance; ``(capacity - non_kv) x fraction`` of memory for the KV cache."""

    NAME = "trtllm"
    perf_backend = "trtllm"
    mxfp4_moe_fp8_activations = True
    LABEL = "TRT-LLM"
    DESCRIPTION = "TensorRT-LLM: GUARANTEED_NO_EVICT admission, attention-DP balance"
    default_block_size = 32
    default_memory_fraction = 0.9
    no_evict = True
    scheduler_fields: ClassVar[frozenset[str]] = frozenset({"attention_dp_balance"})

    def kv_budget(self, *, capacity: int, fraction: Fraction, memory_fraction: float,
                  weights: int, activations: int, runtime_overhead: int, comm_overhead: int,
                  cuda_graph: int) -> tuple[int, str]:
        non_kv = weights + activations + runtime_overhead + comm_overhead + cuda_graph
        kv = math.floor((capacity - non_kv) * fraction)
        return kv, f"kv_bytes {kv} = ({capacity} - non_kv {non_kv}) x {memory_fraction}"
