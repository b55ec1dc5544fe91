"""Request routing across a role's workers: where each built-in router sends a request,
with exact numbers under fixed timing (prefill pass 10 ms, decode pass 1 ms, 4-token
blocks)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import pytest

from servesim.engines.disagg.engine import DisaggReplay
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.engines.routing import make_router
from servesim.engines.routing.builtin import KvAware, KvAwareOptions, softmax_sample
from servesim.payload import RoleArgs, RoutingArgs

from .conftest import ListWorkload, Sim


def _routed(sim: type[Sim], kind: str, **options: Any) -> RoleArgs:
    return sim.role(replicas=2, routing=RoutingArgs(type=kind, options=options))


def _turn(rid: int, parent: RequestSpec, parent_out: int, new: int, out: int,
          session: str | None = None) -> RequestSpec:
    """A follow-up turn of ``parent``: its prompt, its output and ``new`` tokens, arriving
    when ``parent`` ends."""
    prompt = make_prompt([*parent.prompt, Segment(generated_key(parent.request_id), parent_out,
                                                  repeat=False),
                          Segment(500 + rid, new, repeat=False)])
    return RequestSpec(rid, 0.0, prompt, prompt_length(prompt), out,
                       session_id=session or parent.session_id, turn_index=parent.turn_index + 1)


def _conversation(sim: type[Sim]) -> ListWorkload:
    """Three 16-token prompts at t=0 (output 2 each: the prompt pass [0, 11] emits the first
    token, a decode pass [11, 12] the second) and, when request 0 ends at 12 ms, its second
    turn (22 tokens: the 16, the 2 generated, 4 new). Round-robin puts 0 and 2 on worker 0,
    1 on worker 1, and the second turn, the 4th arrival, on worker 1."""
    first = [sim.spec(i, sim.prompt((i + 1, 16)), 2, session_id=f"s{i}") for i in range(3)]
    return ListWorkload(first, followups={0: [_turn(100, first[0], 2, 4, 2)]})


@pytest.mark.parametrize(("kind", "worker", "reused"), [
    ("round_robin", 1, 0),
    ("kv_aware", 0, 16),  # costs: worker 0 (22 - 16) / 4 = 1.5 blocks, worker 1 22 / 4 = 5.5
])
def test_kv_aware_routing_sends_the_next_turn_to_the_worker_holding_its_prefix(
        sim: type[Sim], kind: str, worker: int, reused: int) -> None:
    records, _, _ = sim.run(_routed(sim, kind), _conversation(sim))
    turn = records[100]
    assert (records[0].decode_worker, records[1].decode_worker,
            records[2].decode_worker) == (0, 1, 0)
    assert turn.arrival_ms == 12.0
    assert turn.decode_worker == worker
    assert turn.reused_input_tokens == reused
    assert list(turn.token_times) == [23.0, 24.0]


def test_kv_aware_costs_are_dynamos_formula(sim: type[Sim]) -> None:
    """At 12 ms every request has ended: no active blocks, nothing waiting."""
    seen: list[list[float]] = []
    router = KvAware(KvAwareOptions(overlap_weight=2.0))
    original = router.route

    def route(request: RequestSpec, workers: Sequence[Any]) -> int:
        if request.request_id == 100:
            seen.append(router.costs(request, workers))
        return original(request, workers)

    router.route = route  # type: ignore[method-assign]
    replay_with(sim, _routed(sim, "kv_aware"), _conversation(sim), router)
    assert seen == [[2.0 * 1.5, 2.0 * 5.5]]


def replay_with(sim: type[Sim], role: RoleArgs, workload: ListWorkload,
                router: Any) -> dict[int, RequestRecord]:
    from servesim.engines.vllm import AggregatedReplay
    from servesim.timing import make_timer

    records: dict[int, RequestRecord] = {}
    AggregatedReplay(role, make_timer(role), workload, lambda r: records.__setitem__(
        r.request_id, r), None, router=router).run()
    return records


def test_the_decode_load_counts_active_blocks_and_queued_prompts(sim: type[Sim]) -> None:
    """Two requests at t=0 with weight 0 (load only): the first goes to worker 0, whose
    queued 16-token prompt (4 blocks) sends the second to worker 1; at 5 ms, during the
    prompt passes, each worker holds its request's 4 prompt blocks, and the third goes to
    worker 0 (equal costs: the first)."""
    costs: list[list[float]] = []
    router = KvAware(KvAwareOptions(overlap_weight=0.0))
    original = router.route

    def route(request: RequestSpec, workers: Sequence[Any]) -> int:
        costs.append(router.costs(request, workers))
        return original(request, workers)

    router.route = route  # type: ignore[method-assign]
    specs = [sim.spec(0, 16, 4), sim.spec(1, 16, 4), sim.spec(2, 16, 4, arrival=5.0)]
    records = replay_with(sim, _routed(sim, "kv_aware"), ListWorkload(specs), router)
    assert costs == [[0.0, 0.0], [4.0, 0.0], [4.0, 4.0]]
    assert [records[i].decode_worker for i in range(3)] == [0, 1, 0]


def _sessions(sim: type[Sim]) -> ListWorkload:
    """Sessions a and b, three turns each (every turn 8 new tokens, output 2), and a lone
    request c at t=0 that makes round-robin alternate the turns."""
    a0 = sim.spec(0, sim.prompt((1, 8)), 2, session_id="a")
    b0 = sim.spec(1, sim.prompt((2, 8)), 2, session_id="b")
    c0 = sim.spec(2, sim.prompt((3, 8)), 2, session_id="c")
    a1, b1 = _turn(10, a0, 2, 8, 2), _turn(11, b0, 2, 8, 2)
    a2, b2 = _turn(20, a1, 2, 8, 2), _turn(21, b1, 2, 8, 2)
    return ListWorkload([a0, b0, c0], followups={0: [a1], 1: [b1], 10: [a2], 11: [b2]})


def test_session_affinity_keeps_every_turn_of_a_session_on_one_worker(sim: type[Sim]) -> None:
    records, _, _ = sim.run(_routed(sim, "session_affinity"), _sessions(sim))
    # first turns by least outstanding requests: a -> 0, b -> 1 (0 has one), c -> 0 (a tie)
    assert {rid: r.decode_worker for rid, r in records.items()} == {
        0: 0, 10: 0, 20: 0, 1: 1, 11: 1, 21: 1, 2: 0}
    # a's third turn reuses the 16 tokens of the second's complete blocks whose KV exists
    # (its last output token's never does)
    assert records[20].reused_input_tokens == 16
    round_robin, _, _ = sim.run(_routed(sim, "round_robin"), _sessions(sim))
    assert {round_robin[rid].decode_worker for rid in (0, 10, 20)} == {0, 1}


def test_session_affinity_places_first_turns_round_robin_when_asked(sim: type[Sim]) -> None:
    role = _routed(sim, "session_affinity", fallback="round_robin")
    records, _, _ = sim.run(role, _sessions(sim))
    # a -> 0, b -> 1, c -> 0 in turn; every later turn stays
    assert {rid: r.decode_worker for rid, r in records.items()} == {
        0: 0, 10: 0, 20: 0, 1: 1, 11: 1, 21: 1, 2: 0}


@pytest.mark.parametrize(("by", "third"), [("requests", 0), ("tokens", 1)])
def test_least_loaded_picks_the_worker_with_fewer_requests_or_tokens(
        sim: type[Sim], by: str, third: int) -> None:
    """A 40-token prompt goes to worker 0, a 4-token one to worker 1; the third request
    finds one request on each (a tie: worker 0) but 40 against 4 tokens (worker 1)."""
    specs = [sim.spec(0, 40, 4), sim.spec(1, 4, 4), sim.spec(2, 8, 4)]
    records, _, _ = sim.run(_routed(sim, "least_loaded", by=by), specs)
    assert [records[i].decode_worker for i in range(3)] == [0, 1, third]


def test_softmax_sampling_draws_by_the_normalised_costs() -> None:
    # costs 0, 1, 2 over a range of 2 at temperature 1: weights 1, e^-0.5, e^-1
    weights = [1.0, math.exp(-0.5), math.exp(-1.0)]
    total = sum(weights)
    edges = [weights[0] / total, (weights[0] + weights[1]) / total]
    assert softmax_sample([0.0, 1.0, 2.0], 1.0, edges[0] - 1e-9) == 0
    assert softmax_sample([0.0, 1.0, 2.0], 1.0, edges[0] + 1e-9) == 1
    assert softmax_sample([0.0, 1.0, 2.0], 1.0, edges[1] + 1e-9) == 2
    assert softmax_sample([3.0, 3.0], 0.5, 0.49) == 0  # equal costs: uniform
    assert softmax_sample([3.0, 3.0], 0.5, 0.51) == 1


def _spread(sim: type[Sim]) -> ListWorkload:
    return ListWorkload([sim.spec(i, sim.prompt((i % 3, 12)), 3, arrival=2.0 * i)
                         for i in range(24)])


def test_temperature_sampling_is_reproducible_with_a_seed(sim: type[Sim]) -> None:
    def placements(seed: int) -> list[int | None]:
        role = _routed(sim, "kv_aware", temperature=1.0, seed=seed)
        records, _, _ = sim.run(role, _spread(sim))
        return [records[i].decode_worker for i in range(24)]

    first = placements(7)
    assert placements(7) == first
    assert set(first) == {0, 1}
    assert any(placements(seed) != first for seed in (8, 9, 10))
    greedy, _, _ = sim.run(_routed(sim, "kv_aware"), _spread(sim))
    assert [greedy[i].decode_worker for i in range(24)] != first


def test_a_role_without_routing_is_routed_round_robin(sim: type[Sim]) -> None:
    role = sim.role(replicas=3)
    assert role.routing is None
    assert type(make_router(role)).__name__ == "RoundRobin"
    records, _, _ = sim.run(role, [sim.spec(i, 8, 2) for i in range(5)])
    assert [records[i].decode_worker for i in range(5)] == [0, 1, 2, 0, 1]


def _disagg(sim: type[Sim], kind: str) -> dict[int, RequestRecord]:
    prefill = attrs.evolve(_routed(sim, kind), worker_type="prefill")
    decode = attrs.evolve(_routed(sim, kind), worker_type="decode")
    records: dict[int, RequestRecord] = {}
    DisaggReplay(prefill, decode, None, _conversation(sim),
                 lambda r: records.__setitem__(r.request_id, r)).run()
    return records


def test_prefill_and_decode_are_routed_by_their_own_routers(sim: type[Sim]) -> None:
    """The second turn reaches the prefill and the decode worker that hold its prefix
    under kv_aware routing; round-robin sends it to the other prefill worker."""
    kv = _disagg(sim, "kv_aware")
    assert (kv[100].prefill_worker, kv[100].decode_worker) == (
        kv[0].prefill_worker, kv[0].decode_worker)
    assert kv[100].reused_input_tokens == 16
    rr = _disagg(sim, "round_robin")
    assert (rr[0].prefill_worker, rr[100].prefill_worker) == (0, 1)
    assert rr[100].reused_input_tokens == 0
