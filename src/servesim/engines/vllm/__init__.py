"""vLLM-style continuous batching: per-rank scheduler and the aggregated replay loop."""

from __future__ import annotations

from servesim.engines.vllm.engine import AggregatedReplay, ReplayStats, Worker, replay_aggregated
from servesim.engines.vllm.scheduler import RankPass, RankScheduler, SeqState

__all__ = [
    "AggregatedReplay",
    "RankPass",
    "RankScheduler",
    "ReplayStats",
    "SeqState",
    "Worker",
    "replay_aggregated",
]
