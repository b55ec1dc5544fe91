"""Static batches (servesim.engines.kernel.static_batch) and RequestRecord.admitted."""

from __future__ import annotations

from servesim.engines.kernel.blocks import BlockPool
from servesim.engines.kernel.prompt_cache import PromptCache
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.static_batch import BatchMember, BatchWorker, run_static_batch

from .conftest import Sim


class Recorder:
    """Prefill 10 ms, decode 1 ms per request in the step; records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        self.calls.append(("prefill", batch, mean_isl, mean_prefix))
        return 10.0

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        self.calls.append(("decode", batch, active_kv_tokens, mean_context, total_kv_tokens))
        return float(batch)


def _member(spec: RequestSpec, cached: int = 0) -> BatchMember:
    record = RequestRecord(request_id=spec.request_id, arrival_ms=spec.arrival_ms,
                           input_length=spec.input_length,
                           requested_output_length=spec.output_length, status="incomplete")
    return BatchMember(spec, record, cached=cached)


def _batch() -> list[BatchMember]:
    # outputs 3, 1 and 0 tokens; the second found 4 prompt tokens cached
    return [_member(Sim.spec(0, 8, 3)), _member(Sim.spec(1, 16, 1), cached=4),
            _member(Sim.spec(2, 12, 0))]


def test_padded_the_whole_batch_decodes_until_the_longest_output() -> None:
    timer, batch = Recorder(), _batch()
    end, passes = run_static_batch(batch, 100.0, timer, pad=True, capacity=640)
    assert timer.calls == [("prefill", 3, 12.0, 4 / 3),
                           ("decode", 3, 36 + 3, 13.0, 640),  # step 1: prompts + 1 each
                           ("decode", 3, 36 + 6, 14.0, 640)]
    assert [list(m.record.token_times) for m in batch] == [[110.0, 113.0, 116.0], [110.0], []]
    assert [m.done_ms for m in batch] == [116.0, 110.0, 110.0]  # no token: the prefill's end
    assert (end, passes) == (116.0, 3)


def test_unpadded_a_decode_step_holds_only_the_requests_still_decoding() -> None:
    timer, batch = Recorder(), _batch()
    end, passes = run_static_batch(batch, 100.0, timer, pad=False, capacity=640)
    assert timer.calls[1:] == [("decode", 1, 8 + 1, 9.0, 640), ("decode", 1, 8 + 2, 10.0, 640)]
    assert list(batch[0].record.token_times) == [110.0, 111.0, 112.0]
    assert (end, passes) == (112.0, 3)


def test_a_batch_without_output_is_one_prefill_pass() -> None:
    batch = [_member(Sim.spec(0, 8, 0))]
    assert run_static_batch(batch, 0.0, Recorder(), pad=True, capacity=64) == (10.0, 1)
    assert batch[0].done_ms == 10.0


def test_a_batch_stamps_the_admission_of_its_requests() -> None:
    batch = _batch()
    run_static_batch(batch, 100.0, Recorder(), pad=True, capacity=640)
    assert [(m.record.first_admit_ms, m.record.first_admission_reused_tokens,
             m.record.reused_input_tokens) for m in batch] == [
        (100.0, 0, 0), (100.0, 4, 4), (100.0, 0, 0)]


def test_admitted_keeps_the_first_admission_and_the_most_reuse() -> None:
    record = _member(Sim.spec(0, 64, 1)).record
    record.admitted(5.0, 16)
    record.admitted(9.0, 48)
    record.admitted(12.0, 0)
    assert (record.first_admit_ms, record.first_admission_reused_tokens,
            record.reused_input_tokens) == (5.0, 16, 48)


def test_a_worker_publishes_its_batch_prompts_and_releases_them_when_it_ends() -> None:
    worker = BatchWorker(0, PromptCache(BlockPool(16, 4), prefix_caching=True))
    member = _member(Sim.spec(0, Sim.prompt((7, 12)), 2))
    assert worker.kv.reserve(member.spec, 14, member.lease) == 0
    end, _ = worker.start([member], 0.0, Recorder(), pad=True)
    assert (end, worker.batch) == (11.0, [member])
    assert len(worker.kv.pool.cached_identities()) == 3  # the prompt's complete blocks
    worker.finish()
    assert worker.batch is None and worker.kv.pool.num_active == 0
    assert worker.kv.pool.num_inactive == 3  # still cached for later batches
