"""The invariant auditor and the watchdog: on in the suite, and each check can fail.

Every test here corrupts one piece of scheduler, pool or loop state from the outside (a
replay whose pass hooks misbehave, or a sink that does) and expects the auditor's
``invariant-violated`` error naming the invariant, the rank and the request.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.audit import (
    ENV_VAR,
    ReplayGuard,
    check_invariants,
    invariant_checks_enabled,
)
from servesim.engines.kernel.blocks import Lease, _Extent
from servesim.engines.kernel.requests import RequestRecord
from servesim.engines.vllm import AggregatedReplay, RankPass, RankScheduler
from servesim.errors import ReplayError
from servesim.payload import KvTransferArgs, RoleArgs
from servesim.timing import make_timer

from .conftest import ListWorkload, Sim

Corrupt = Callable[[RankScheduler, RankPass], object]


def test_the_suite_runs_every_replay_under_the_auditor() -> None:
    assert os.environ.get(ENV_VAR) == "1"
    assert invariant_checks_enabled()
    with check_invariants(False):
        assert not invariant_checks_enabled()
    assert invariant_checks_enabled()


class _CorruptedReplay(AggregatedReplay):
    """A stepwise replay (a bulk advance skips passes) whose rank 0 state is corrupted once,
    after the first of its passes for which ``corrupt`` returns anything but False. The
    hook is on the replay, not the rank: a compiled scheduler's methods cannot be patched."""

    corrupt: Corrupt | None = None

    def _run_ranks(self, worker: Any) -> tuple[list[RankPass], float, bool]:
        rank = worker.ranks[0]
        ran = rank.has_work  # then its pass is the first result
        results, duration, progressed = super()._run_ranks(worker)
        if self.corrupt is not None and ran and self.corrupt(rank, results[0]) is not False:
            self.corrupt = None
        return results, duration, progressed


def _aggregated(sim: type[Sim], corrupt: Corrupt, *, role: RoleArgs | None = None,
                outs: tuple[int, ...] | list[int] = (4, 4, 4)) -> AggregatedReplay:
    role = role or sim.role()
    specs = [sim.spec(i, 12, out) for i, out in enumerate(outs)]
    records: list[RequestRecord] = []
    run = _CorruptedReplay(role, make_timer(role), ListWorkload(specs), records.append, None,
                           bulk_decode=False)
    run.corrupt = corrupt
    return run


def _violation(run: Any) -> str:
    with check_invariants(), pytest.raises(ReplayError) as info:
        run.run()
    (diag,) = info.value.diagnostics
    assert diag.code == "invariant-violated"
    assert diag.hint and "bug in servesim" in diag.hint
    return diag.message


def _first_running(rank: RankScheduler) -> Any:
    return next(iter(rank.running))


def _add_reference(rank: RankScheduler) -> None:
    """Corrupt the pool: one more reference to the first running request's first block."""
    where = rank.pool._locate(_first_running(rank).lease.blocks()[0])
    assert where is not None
    ext, offset = where
    ext.ref.shift(offset, offset + 1, 1)


def test_an_extra_block_reference_is_named_with_its_rank_and_request(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        _add_reference(rank)

    assert _violation(_aggregated(sim, corrupt)) == (
        "invariant 'block-refcount' violated on worker 0 rank 0: request 0: block 0 has 2 "
        "references, the requests on the rank hold 1")


def test_a_lease_the_pool_does_not_know_is_caught(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        _first_running(rank).lease.append(_Extent(0, 63), 0, 1)  # never handed out

    message = _violation(_aggregated(sim, corrupt))
    assert message.startswith("invariant 'block-refcount' violated on worker 0 rank 0: "
                              "request 0: block 63 has 0 references")


def test_pool_totals(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        rank.pool._num_active -= 1  # a block the pool lost count of

    assert _violation(_aggregated(sim, corrupt)) == (
        "invariant 'pool-totals' violated on worker 0 rank 0: 8 blocks counted active and 0 "
        "cached, but 9 are active and 0 cached")


def test_a_request_in_two_queues(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        rank.waiting.append(_first_running(rank))

    assert _violation(_aggregated(sim, corrupt)) == (
        "invariant 'one-queue' violated on worker 0 rank 0: request 0: in both the waiting "
        "and the running queue")


def test_a_request_on_two_ranks(sim: type[Sim]) -> None:
    role = sim.role(attention_data=2)

    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        run.workers[0].ranks[1].running[_first_running(rank)] = None

    run = _aggregated(sim, corrupt, role=role)
    assert _violation(run) == ("invariant 'one-rank' violated on worker 0 rank 1: request 0: "
                               "also queued on worker 0 rank 0")


def test_a_lost_request(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        seq = _first_running(rank)
        del rank.running[seq]
        rank.pool.release(seq.lease)

    assert _violation(_aggregated(sim, corrupt)) == (
        "invariant 'request-located' violated on the event loop: request 0: live but in no "
        "queue, pass or handoff")


def test_queue_and_status_disagree(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        _first_running(rank).status = 0

    assert _violation(_aggregated(sim, corrupt)) == (
        "invariant 'queue-status' violated on worker 0 rank 0: request 0: in the running "
        "queue with status 0")


def test_a_finished_request_left_in_a_queue(sim: type[Sim]) -> None:
    finished: list[Any] = []

    def corrupt(rank: RankScheduler, out: RankPass) -> bool:
        if finished:  # a pass after the one that finished it: it is terminal by now
            finished[0].status = 0
            rank.waiting.append(finished[0])
            return True
        finished.extend(out.finished)
        return False

    message = _violation(_aggregated(sim, corrupt, outs=[2, 40, 40]))
    assert message == ("invariant 'terminal-once' violated on worker 0 rank 0: request 0: "
                       "still in the waiting queue but no longer live (already terminal, or "
                       "never arrived)")


def test_a_request_that_reaches_the_sink_twice(sim: type[Sim]) -> None:
    role = sim.role()

    class Twice(AggregatedReplay):
        def _terminal(self, spec: Any, status: Any, time_ms: float) -> None:
            record = self.live[spec.request_id]
            super()._terminal(spec, status, time_ms)
            self.sink(record)

    run = Twice(role, make_timer(role), ListWorkload([sim.spec(0, 8, 2)]), lambda record: None,
                None)
    assert _violation(run) == ("invariant 'terminal-once' violated on the sink: request 0: "
                               "reached the sink twice")


def test_token_counts_and_times_in_the_records(sim: type[Sim]) -> None:
    role = sim.role()

    class ExtraToken(AggregatedReplay):
        def _end_pass(self, worker: Any) -> None:
            for res in worker.pending:
                for seq in res.emitted:
                    seq.record.token_times.append(0.5)  # before the pass end, then the real one
            super()._end_pass(worker)

    run = ExtraToken(role, make_timer(role), ListWorkload([sim.spec(0, 8, 2)]),
                     lambda record: None, None, bulk_decode=False)  # a pass per token
    assert _violation(run) == ("invariant 'monotonic-time' violated on the sink: request 0: "
                               "token times go back")


def test_virtual_time_never_goes_back() -> None:
    guard = ReplayGuard(object(), audit=False)
    guard.instant(5.0)
    with pytest.raises(ReplayError) as info:
        guard.instant(4.0)
    assert str(info.value.diagnostics[0].message) == (
        "invariant 'monotonic-time' violated on the event loop: virtual time went back from "
        "5.0 to 4.0 ms")


def test_a_disaggregated_source_that_is_never_released(sim: type[Sim]) -> None:
    prefill = sim.role(worker_type="prefill")
    decode = sim.role(worker_type="decode")
    specs = [sim.spec(i, 12, 3) for i in range(2)]

    class Leaky(DisaggReplay):
        def _complete_transfer(self, flight: Any) -> None:
            flight.source.lease = Lease()  # the source is released, its blocks stay referenced
            super()._complete_transfer(flight)

    run = Leaky(prefill, decode, None, ListWorkload(specs), lambda r: None)
    assert _violation(run) == (
        "invariant 'block-refcount' violated on prefill worker 0 rank 0: block 0 has 1 "
        "references, the requests on the rank hold 0")


def test_without_the_auditor_the_corruption_goes_unnoticed(sim: type[Sim]) -> None:
    def corrupt(rank: RankScheduler, _: RankPass) -> None:
        _add_reference(rank)

    with check_invariants(False):
        stats = _aggregated(sim, corrupt).run()
    assert stats.completed == 3


# -- the watchdog (always on) ---------------------------------------------------------------

def test_zero_time_passes_that_change_nothing_end_with_the_stuck_requests(
        sim: type[Sim]) -> None:
    role = sim.role()

    class Stuck(AggregatedReplay):
        # A scheduler bug: a pass that claims progress, takes no time and changes nothing.
        def _run_ranks(self, worker: Any) -> tuple[list[RankPass], float, bool]:
            claimed = RankPass()
            claimed.progressed = True
            return [claimed], 0.0, True

    run = Stuck(role, make_timer(role), ListWorkload([sim.spec(0, 8, 2), sim.spec(1, 8, 2)]),
                lambda r: None, None)
    with check_invariants(False), pytest.raises(ReplayError) as info:
        run.run()
    (diag,) = info.value.diagnostics
    assert diag.code == "replay-stuck"
    assert diag.message == ("the replay repeats the same state at virtual time 0.0 ms without "
                            "emitting a token or finishing a request; stuck requests: 0, 1")


def test_long_zero_time_runs_that_progress_are_not_stuck(sim: type[Sim]) -> None:
    from servesim.payload import TimingArgs

    role = sim.role(timing=TimingArgs(type="fixed", prefill_ms=0.0, decode_ms=0.0),
                    num_gpu_blocks=4096)
    records, stats, _ = sim.run(role, [sim.spec(i, 40, 300) for i in range(4)])
    assert stats.end_ms == 0.0
    assert [r.output_length for r in records.values()] == [300] * 4


@pytest.mark.parametrize("flag", [True, False])
def test_the_cli_flag_turns_the_auditor_on(flag: bool, monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    from servesim.cli import main
    from servesim.engines.kernel import audit

    monkeypatch.delenv(ENV_VAR)
    seen: list[bool] = []
    init = audit.ReplayGuard.__init__

    def record(self: ReplayGuard, replay: Any, audit_on: bool) -> None:
        seen.append(audit_on)
        init(self, replay, audit_on)

    monkeypatch.setattr(audit.ReplayGuard, "__init__", record)
    config = Path(__file__).resolve().parents[2] / "examples" / "configs" / "qwen3_32b_h200.toml"
    argv = ["replay", str(config), "--quiet", "-o", str(tmp_path / "r.json")]
    assert main([*argv, "--check-invariants"] if flag else argv) == 0
    assert seen == [flag]


def _overlapping_transfers(sim: type[Sim], corrupt: Callable[[Any], None]) -> DisaggReplay:
    """Two transfers on prefill worker 0's link: 32 ms alone each (32 tokens x 1e6 B at
    1 GB/s), starting at 10 and 20 ms; ``corrupt(link)`` runs once the second started."""
    prefill = sim.role(worker_type="prefill", max_sequences=1)
    decode = sim.role(worker_type="decode")
    specs = [sim.spec(i, 32, 2) for i in range(2)]
    kv = KvTransferArgs(bytes_per_token=1_000_000, bandwidth_gb_per_second=1.0)

    class Corrupted(DisaggReplay):
        def _start_transfer(self, flight: Any) -> None:
            super()._start_transfer(flight)
            if flight.spec.request_id == 1:
                corrupt(self.kv_links.busy[0])

    return Corrupted(prefill, decode, kv, ListWorkload(specs), lambda r: None)


def test_a_link_that_moves_more_than_its_bandwidth(sim: type[Sim]) -> None:
    def corrupt(link: Any) -> None:
        link.level += 1e6  # a megabyte from nowhere for each of the two transfers

    assert _violation(_overlapping_transfers(sim, corrupt)) == (
        "invariant 'link-bandwidth' violated on the KV link of prefill worker 0: 12000000 "
        "bytes moved in 10 ms at 1 GB/s (10000000 bytes while busy)")


def test_a_link_that_loses_bytes(sim: type[Sim]) -> None:
    def corrupt(link: Any) -> None:
        link.started += 1

    assert _violation(_overlapping_transfers(sim, corrupt)) == (
        "invariant 'link-bytes' violated on the KV link of prefill worker 0: 64000001 bytes "
        "started, 0 sent and 64000000 in flight")
