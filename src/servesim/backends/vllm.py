"""vLLM: admits what fits now and preempts the latest-admitted request (spec §5)."""

from __future__ import annotations

from typing import ClassVar

from servesim.backends.base import Backend


class Vllm(Backend):
    """vLLM's scheduler: one mixed pass of prompt chunks and decode steps; preemption by
    recompute, newest first; prefills spaced over attention-DP ranks by
    ``prefill_schedule_interval``; state caches and n-gram speculation."""

    NAME = "vllm"
    perf_backend = "vllm"
    LABEL = "vLLM"
    DESCRIPTION = "vLLM: mixed passes, admits what fits, preempts the newest request"
    default_block_size = 64
    default_memory_fraction = 0.9
    context_max_from_model = True
    scheduler_fields: ClassVar[frozenset[str]] = frozenset({"prefill_schedule_interval"})
    state_cache = True
    ngram_speculation = True
