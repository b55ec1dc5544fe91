"""The published-throughput bench (bench/throughput.py): its data and its replay."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import throughput

from servesim.catalog import load_gpu, load_model


def test_every_published_run_names_a_catalog_model_and_gpu() -> None:
    runs = throughput.load_runs()
    assert len(runs) == 12
    for run in runs:
        load_model(run.model)
        load_gpu(run.system)
        assert run.tok_s_gpu > 0 and run.requests > 0


def _small(**changes: object) -> throughput.Run:
    run = dataclasses.replace(throughput.load_runs()[0], isl=128, osl=16, requests=1)
    return dataclasses.replace(run, **changes)


def test_requests_queued_together_share_each_pass() -> None:
    alone = throughput.replay(_small())
    together = throughput.replay(_small(requests=16))
    assert isinstance(alone, float) and isinstance(together, float)
    # sixteen decodes in one pass cost far less than sixteen passes
    assert together > 4 * alone


def test_a_run_that_cannot_be_replayed_says_why() -> None:
    reason = throughput.replay(_small(model="no-such/model"))
    assert isinstance(reason, str) and "no-such/model" in reason


def test_a_batch_cap_that_binds_lowers_the_throughput() -> None:
    free = throughput.replay(_small(requests=16))
    capped = throughput.replay(_small(requests=16), max_batch=2)
    assert isinstance(free, float) and isinstance(capped, float)
    assert capped < free / 2
