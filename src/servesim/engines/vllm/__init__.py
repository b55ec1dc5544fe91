"""The aggregated replay: a pool of continuous-batching workers (the ``vllm`` engine)."""

from __future__ import annotations

from servesim.engines.ranks.scheduler import RankPass, RankScheduler, SeqState
from servesim.engines.vllm.engine import AggregatedReplay, ReplayStats, Worker, replay_aggregated

__all__ = [
    "AggregatedReplay",
    "RankPass",
    "RankScheduler",
    "ReplayStats",
    "SeqState",
    "Worker",
    "replay_aggregated",
]
