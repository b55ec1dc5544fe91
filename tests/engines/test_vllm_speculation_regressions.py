"""Regressions found by the speculative / state-cache property tests, pinned as plain
examples (same replay and checks as ``test_vllm_speculation_properties``)."""

from __future__ import annotations

import pytest

from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, make_prompt, prompt_length
from servesim.payload import RoleArgs, SpeculationArgs, StateCacheArgs, TimingArgs

from .conftest import ListWorkload
from .strategies import check_drained, check_records, sink_once
from .test_vllm_speculation_properties import _replay


def _spec(rid: int, parts: list[tuple[int, int]], out: int) -> RequestSpec:
    prompt = make_prompt([Segment(key, n, repeat=False) for key, n in parts])
    return RequestSpec(rid, 0.0, prompt, prompt_length(prompt), out)


@pytest.mark.parametrize("prefill_ms", [0.0, 2.0])
def test_lookahead_that_cannot_fit_does_not_livelock(prefill_ms: float) -> None:
    """MTP with one draft, a 2-block state cache, a 12-block pool and FIFO preemption:
    requests 2 and 4 cannot both hold their bursts. The burst reservation comes after the
    pass's admissions; it used to preempt FIFO, so the running request ready to burst was
    retracted for the newcomer admitted (only partly prefilled) in the same pass, and the
    two swapped places forever (5000+ passes, or replay-stuck with zero step times). The
    reservation preempts LIFO (spec §5.7): the newcomer yields and request 2 finishes."""
    role = RoleArgs(
        worker_type="aggregated", backend="vllm", model="m", hardware="h",
        max_batched_tokens=8, max_sequences=3, enable_chunked_prefill=True,
        preemption_mode="fifo", block_size=2, prefix_caching=False, kv_bytes_per_token=1,
        num_gpu_blocks=12,
        state_cache=StateCacheArgs(bytes_per_request=4, state_blocks=2,
                                   allocated_bytes_per_request=4, source="overridden"),
        timing=TimingArgs(type="fixed", prefill_ms=prefill_ms, decode_ms=0.0),
        speculation=SpeculationArgs(kind="mtp", num_speculative_tokens=1,
                                    acceptance_rates=(1.0,), seed=0))
    workload = ListWorkload(
        [_spec(0, [(0, 1)], 0), _spec(1, [(0, 1)], 0), _spec(2, [(0, 4)], 6),
         _spec(3, [(0, 1)], 0), _spec(4, [(0, 1), (0, 1), (0, 4)], 4)],
        followups={2: [_spec(102, [(0, 4), (-3, 6), (3, 1)], 0)]})
    records: dict[int, RequestRecord] = {}
    replay = _replay(role, workload)(sink_once(records))  # fails past 5000 passes
    replay.run()
    check_records(records, workload, role)
    check_drained(replay)
