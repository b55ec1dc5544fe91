"""The host (G2) tier in replays: an offload case computed by hand under fixed timing, and
differential tests of the bulk decode advance against the stepwise replay with host tiers
on aggregated and P/D roles."""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.audit import check_invariants
from servesim.engines.vllm import AggregatedReplay
from servesim.payload import HostOffloadArgs, RoleArgs, TimingArgs
from servesim.timing import make_timer

from .conftest import ListWorkload
from .strategies import fresh, kv_transfers, longest, replayed
from .test_bulk_decode import ROOM, WORKLOADS, bulk_roles

# A block of 4 tokens at 250 kB per token is 1 MB: 1 ms alone on a 1 GB/s host link.
HOST = HostOffloadArgs(capacity_blocks=16, bandwidth_gb_per_second=1.0)


def offload_case(sim: Any, host: HostOffloadArgs | None) -> tuple[dict, Any]:
    """A GPU pool of 4 blocks of 4 tokens. Request 0 (t=0) computes the 8-token prefix P
    (2 blocks); request 1 (t=50, 16 unrelated tokens) needs the whole pool and evicts P;
    request 2 (t=100) is P plus 4 new tokens."""
    role = sim.role(num_gpu_blocks=4, kv_bytes_per_token=250_000, host_offload=host)
    prefix = ((7, 4), (8, 4))
    workload = [sim.spec(0, sim.prompt(*prefix), 1),
                sim.spec(1, 16, 1, arrival=50.0),
                sim.spec(2, sim.prompt(*prefix, (9, 4)), 1, arrival=100.0)]
    with check_invariants():
        records, stats, _ = sim.run(role, workload)
    return records, stats


def test_an_evicted_prefix_is_loaded_back_from_host(sim: Any) -> None:
    base, base_stats = offload_case(sim, None)
    records, stats = offload_case(sim, HOST)
    # Without the host tier request 2 computes all 12 tokens from its arrival.
    assert base[2].first_admission_reused_tokens == 0
    assert base[2].first_admit_ms == 100.0
    assert "g2_onboarded_blocks" not in base_stats.host
    # With it: at 100 ms its prefix misses the GPU and is found on host (written back at
    # 50 ms, when request 1 evicted it: 2 blocks, 2 ms). The load (2 MB) arrives at 102 ms
    # and lands in 2 blocks; request 2 is admitted at 102 ms with its 8 prefix tokens on
    # the GPU and computes the last 4 in a third block. The landing evicts 2 of request
    # 1's cached blocks and the admission its third; both write-backs start at 102 ms and
    # share the link: the 1-block one ends at 104 ms (2 ms), the 2-block one at 105 ms.
    r = records[2]
    assert r.first_admit_ms == 102.0
    assert r.first_admission_reused_tokens == 8
    assert r.token_times[0] - r.first_admit_ms == base[2].token_times[0] - 100.0
    host = stats.host
    assert host["g2_prefix_hit_tokens"] == 8
    assert host["g1_prefix_hit_tokens"] == 0
    assert host["g2_prefix_hit_ratio"] == 8 / (8 + 16 + 12)
    assert (host["g2_onboardings"], host["g2_onboarded_blocks"]) == (1, 2)
    assert host["g2_onboard_ms_total"] == host["g2_onboard_ms_mean"] == 2.0
    assert host["g2_written_back_blocks"] == 5
    assert host["g2_write_back_ms_total"] == 2.0 + 3.0 + 2.0
    assert host["g2_host_evicted_blocks"] == 0
    # the other requests are untouched
    for rid in (0, 1):
        assert records[rid].token_times == base[rid].token_times


def test_a_full_host_pool_evicts_its_least_recent_blocks(sim: Any) -> None:
    # Room for 2 host blocks: P's. Request 2's load reads them at 100 ms (first block,
    # then second); request 1's last block reaches host at 104 ms and evicts P's first
    # (the least recently used), its other two at 105 ms evict P's second and that one.
    small = attrs.evolve(HOST, capacity_blocks=2)
    records, stats = offload_case(sim, small)
    assert records[2].first_admission_reused_tokens == 8
    assert stats.host["g2_host_evicted_blocks"] == 3
    # With one block, P's second block never fits beside its first: only 4 tokens load.
    records, stats = offload_case(sim, attrs.evolve(HOST, capacity_blocks=1))
    assert records[2].first_admission_reused_tokens == 4
    assert stats.host["g2_onboarded_blocks"] == 1


# Passes that take time: a pass of no time that preempts what it admits (a speculative
# burst that does not fit beside a load's blocks) would repeat at one instant while the
# load waits for the clock (the watchdog reports such cycles; see its hint).
TIMINGS = st.sampled_from([TimingArgs(type="fixed", prefill_ms=10.0, decode_ms=1.0),
                           TimingArgs(type="fixed", prefill_ms=2.0, decode_ms=0.5),
                           TimingArgs(type="polynomial")])


def _host_role(data: st.DataObject, worker_type: str, room: int, **kw: Any) -> RoleArgs:
    role = data.draw(bulk_roles(worker_type, room, state=False, backend="vllm", **kw))
    role = attrs.evolve(role, timing=data.draw(TIMINGS))
    host = HostOffloadArgs(capacity_blocks=data.draw(st.integers(1, 60)),
                           bandwidth_gb_per_second=data.draw(st.sampled_from([1.0, 8.0])))
    # 1 MB per token: a 4-token block takes 4 ms alone at 1 GB/s
    return attrs.evolve(role, prefix_caching=True, kv_bytes_per_token=1_000_000,
                        host_offload=host)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_with_a_host_tier(data: st.DataObject) -> None:
    workload = data.draw(WORKLOADS)
    role = _host_role(data, "aggregated", longest(workload, ROOM))

    def run(bulk: bool) -> tuple[Any, Any]:
        return replayed(lambda sink: AggregatedReplay(
            role, make_timer(role), fresh(workload), sink, None, bulk_decode=bulk))

    (bulk, replay), (step, _) = run(True), run(False)
    assert bulk == step
    event(f"loads: {'some' if bulk[3].host['g2_onboardings'] else 'none'}")
    event(f"bulk passes: {'some' if replay.bulk_passes else 'none'}")


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_bulk_decode_matches_the_stepwise_replay_with_host_tiers_disaggregated(
        data: st.DataObject) -> None:
    workload: ListWorkload = data.draw(WORKLOADS)
    room = longest(workload, ROOM)
    prefill = _host_role(data, "prefill", room)
    decode = _host_role(data, "decode", room)
    which = data.draw(st.sampled_from(["both", "prefill", "decode"]))
    if which == "prefill":
        decode = attrs.evolve(decode, host_offload=None)
    elif which == "decode":
        prefill = attrs.evolve(prefill, host_offload=None)
    kv = data.draw(kv_transfers())

    def run(bulk: bool) -> tuple[Any, Any]:
        return replayed(lambda sink: DisaggReplay(prefill, decode, kv, fresh(workload), sink,
                                                  bulk_decode=bulk))

    (bulk, replay), (step, _) = run(True), run(False)
    assert bulk == step
    event(f"loads: {'some' if bulk[3].host['g2_onboardings'] else 'none'}")
    event(f"bulk passes: {'some' if replay.bulk_passes else 'none'}")
