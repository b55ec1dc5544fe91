"""Random scenarios for the engine property tests, and the checks every replay must pass.

Workloads are small: prompts drawn from a few shared keys (so prefixes and whole blocks
collide), now and then a session turn that extends a request's prompt with its output.
Roles are small vLLM pools with every scheduler switch drawn. Every field of a role has a
default strategy here; a test overrides a field with a value or a strategy of its own.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from servesim.engines.kernel.metrics import MetricsCollector, request_record_json
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.tokens import Segment, generated_key, make_prompt, prompt_length
from servesim.payload import (
    KvTransferArgs,
    RoleArgs,
    RoutingArgs,
    SlaArgs,
    SpeculationArgs,
    TimingArgs,
)

from .conftest import ListWorkload

GAPS = (0.0, 0.0, 0.5, 3.0, 20.0)
OUTPUTS = st.integers(0, 6)
TURN_OUTPUTS = st.integers(0, 3)
RATE_PAIRS = st.sampled_from([(1.0, 1.0), (0.7, 0.4), (0.0, 0.0)])
SEEDS = st.integers(0, 3)
BACKENDS = st.sampled_from(["vllm", "trtllm", "sglang"])
# the role's router: None (round-robin) half the time, else each built-in, some of them
# reading worker state (which ends steady segments: the differential tests cover that)
ROUTINGS = st.one_of(st.none(), st.sampled_from([
    RoutingArgs("least_loaded", {"by": "requests"}),
    RoutingArgs("least_loaded", {"by": "tokens"}),
    RoutingArgs("session_affinity", {"fallback": "least_loaded"}),
    RoutingArgs("kv_aware", {"overlap_weight": 1.0, "temperature": 0.0, "seed": 1}),
    RoutingArgs("kv_aware", {"overlap_weight": 4.0, "temperature": 0.5, "seed": 3}),
]))
FIXED_TIMINGS = st.builds(TimingArgs, type=st.just("fixed"),
                          prefill_ms=st.sampled_from([0.0, 2.0, 10.0]),
                          decode_ms=st.sampled_from([0.0, 1.0, 2.5]))


@st.composite
def workloads(draw: st.DrawFn, *, max_requests: int = 10, gaps: Sequence[float] = GAPS,
              max_part: int = 6, outputs: st.SearchStrategy[int] = OUTPUTS,
              turn_outputs: st.SearchStrategy[int] = TURN_OUTPUTS,
              cutoffs: Sequence[float | None] = (None,)) -> ListWorkload:
    """Up to ``max_requests`` open-loop requests; about one in four has a follow-up turn."""
    specs: list[RequestSpec] = []
    followups: dict[int, list[RequestSpec]] = {}
    arrival = 0.0
    for rid in range(draw(st.integers(1, max_requests))):
        arrival += draw(st.sampled_from(gaps))
        parts = draw(st.lists(st.tuples(st.integers(0, 2), st.integers(1, max_part)),
                              min_size=1, max_size=3))
        prompt = make_prompt([Segment(k, m, repeat=False) for k, m in parts])
        out = draw(outputs)
        specs.append(RequestSpec(rid, arrival, prompt, prompt_length(prompt), out))
        if draw(st.integers(0, 3)) == 0:  # a session turn reusing this request's output
            follow = make_prompt([*prompt, Segment(generated_key(rid), out, repeat=False),
                                  Segment(3, draw(st.integers(1, 4)), repeat=False)])
            followups[rid] = [RequestSpec(100 + rid, draw(st.sampled_from([0.0, 1.0])), follow,
                                          prompt_length(follow), draw(turn_outputs))]
    return ListWorkload(specs, followups=followups, max_time_ms=draw(st.sampled_from(cutoffs)))


def fresh(workload: ListWorkload) -> ListWorkload:
    """The same requests, for another replay (a workload records its terminals)."""
    return ListWorkload(workload.specs, followups=workload.followups,
                        max_time_ms=workload.max_time_ms)


def longest(workload: ListWorkload, room: int) -> int:
    """The longest prompt plus ``room`` (session turns repeat a prompt and its output)."""
    return max(s.input_length for s in workload.specs) + room


@st.composite
def roles(draw: st.DrawFn, worker_type: str, longest: int, *, max_batched: int = 12,
          **fields: Any) -> RoleArgs:
    """A role of the vLLM-core scheduler: vLLM, TensorRT-LLM (whose admission never
    preempts) or SGLang (separate prefill passes); a state cache is vLLM's only.
    ``fields`` override the drawn values (a value, or a strategy to draw)."""
    chunked = draw(fields.pop("enable_chunked_prefill", st.booleans()))
    if fields.get("state_cache") is not None:
        fields.setdefault("backend", "vllm")
    backend = fields.pop("backend", BACKENDS)
    if isinstance(backend, st.SearchStrategy):
        backend = draw(backend)
    strategies: dict[str, Any] = {
        "block_size": st.integers(2, 4),
        "num_gpu_blocks": st.integers(1, 16),
        "max_batched_tokens": st.integers(1, max_batched) if chunked else longest,
        "max_sequences": st.integers(1, 4),
        "preemption_mode": st.sampled_from(["lifo", "fifo"]),
        "prefix_caching": st.booleans(),
        "max_model_len": st.one_of(st.none(), st.integers(2, 24)),
        "attention_data": st.integers(1, 2),
        "prefill_schedule_interval": st.integers(1, 3),
        "attention_dp_balance": st.booleans(),
        "attention_dp_timeout_iters": st.integers(0, 4),
        "attention_dp_batching_wait_iters": st.integers(0, 3),
        "attention_dp_placement": st.sampled_from(["round_robin", "least_loaded"]),
        "replicas": st.integers(1, 2),
        "timing": FIXED_TIMINGS,
        "routing": ROUTINGS,
    }
    strategies.update(fields)
    values = {k: draw(v) if isinstance(v, st.SearchStrategy) else v
              for k, v in strategies.items()}
    return RoleArgs(worker_type=worker_type,  # type: ignore[arg-type]
                    backend=backend, model="m", hardware="h", enable_chunked_prefill=chunked,
                    **values)


def speculations(*, nextn: int = 2,
                 rates: st.SearchStrategy[tuple[float, ...]] = RATE_PAIRS,
                 seeds: st.SearchStrategy[int] = SEEDS,
                 ) -> st.SearchStrategy[SpeculationArgs]:
    """Speculative decoding, MTP or n-gram, ``nextn`` drafts with the given rates."""
    return st.builds(SpeculationArgs, kind=st.sampled_from(["mtp", "ngram"]),
                     num_speculative_tokens=st.just(nextn), acceptance_rates=rates, seed=seeds)


def kv_transfers() -> st.SearchStrategy[KvTransferArgs | None]:
    """No link (instant hand-off), or a cheap or costly one, slow or fast, either timing,
    shared by the transfers leaving a prefill worker, reaching a decode worker, or none."""
    return st.one_of(st.none(), st.builds(
        KvTransferArgs,
        bytes_per_token=st.sampled_from([1, 1_000_000]),
        bandwidth_gb_per_second=st.sampled_from([None, 1.0, 4.0, 250.0]),
        timing_mode=st.sampled_from(["full_prompt", "destination_missing"]),
        state_bytes=st.sampled_from([0, 500_000]),
        sharing=st.sampled_from(["prefill_worker", "prefill_worker", "decode_worker", "none"]),
    ))


# -- running and checking --------------------------------------------------------------------

Sink = Callable[[RequestRecord], None]


def sink_once(records: dict[int, RequestRecord]) -> Sink:
    """A sink that keeps each record by id and fails when a request ends twice."""
    def sink(record: RequestRecord) -> None:
        assert record.request_id not in records, "a request reached the sink twice"
        records[record.request_id] = record

    return sink


def state_blocks(role: RoleArgs) -> int:
    return role.state_cache.state_blocks if role.state_cache is not None else 0


def token_cap(role: RoleArgs) -> int:
    """The longest sequence (prompt plus output) the role can hold: vLLM never computes
    the last token's KV, TensorRT-LLM clamps the output to the pool (spec R2)."""
    cap = (role.num_gpu_blocks - state_blocks(role)) * role.block_size
    if role.backend != "trtllm":
        cap += 1
    return cap if role.max_model_len is None else min(cap, role.max_model_len)


def never_fits(role: RoleArgs, prompt: int) -> bool:
    too_long = role.max_model_len is not None and prompt >= role.max_model_len
    return too_long or -(-prompt // role.block_size) + state_blocks(role) > role.num_gpu_blocks


def check_records(records: Mapping[int, RequestRecord], workload: ListWorkload,
                  *roles: RoleArgs) -> None:
    """Every request (released turns included) ends once, rejected only if it never fits
    one of ``roles``, else with exactly the tokens the last role (the decoder) allows."""
    released = sum(len(workload.followups.get(r, [])) for r in records)
    assert len(records) == len(workload.specs) + released
    for r in records.values():
        assert r.status in ("completed", "rejected")
        fits = [not never_fits(role, r.input_length) for role in roles]
        if r.status == "rejected":
            assert not all(fits)
            assert len(r.token_times) == 0
            continue
        assert all(fits)
        expected = max(0, min(r.requested_output_length, token_cap(roles[-1]) - r.input_length))
        assert len(r.token_times) == expected
        assert list(r.token_times) == sorted(r.token_times)
        if r.token_times:
            assert r.arrival_ms <= r.token_times[0] and r.token_times[-1] == r.terminal_ms
        assert r.first_admit_ms is not None and r.arrival_ms <= r.first_admit_ms
        assert r.reused_input_tokens <= r.input_length
        assert r.first_admission_reused_tokens <= r.reused_input_tokens


def check_drained(replay: Any) -> None:
    """After the run no rank has work and every block is free or inactive cached."""
    for worker in replay.workers:
        for rank in worker.ranks:
            rank.pool.check()
            assert not rank.has_work and rank.pool.num_active == 0
            assert rank.pool.num_inactive + rank.pool.num_free == rank.pool.num_blocks


def record_key(r: RequestRecord) -> tuple[Any, ...]:
    return (r.request_id, r.status, tuple(r.token_times), r.first_admit_ms, r.terminal_ms,
            r.reused_input_tokens, r.first_admission_reused_tokens, r.num_preemptions,
            r.prefill_worker, r.decode_worker, r.arrival_ms)


def _report(records: Iterable[RequestRecord]) -> str:
    collector = MetricsCollector(SlaArgs(ttft_ms=50.0, itl_ms=3.0, e2e_ms=400.0))
    for record in records:
        collector.add(record)
    return json.dumps(collector.report(wall_time_ms=0.0, gpu_seconds=1.0), sort_keys=True)


def replayed(make: Callable[[Sink], Any], *, fast_decode: bool = True
             ) -> tuple[tuple[Any, ...], Any]:
    """Run the replay ``make`` builds around a sink that keeps each record once; return
    what two replays of one scenario must agree on (every record, the metrics report, the
    run totals, the final pools) and the replay. ``fast_decode=False`` turns the inlined
    decode step of every vLLM rank off (the general path)."""
    records: dict[int, RequestRecord] = {}
    replay = make(sink_once(records))
    if not fast_decode:
        for worker in replay.workers:
            for rank in worker.ranks:
                rank.fast_decode = False
    stats = replay.run()
    report = _report(records.values())
    # ITL counted per pass (records know their worker's pass ends) or per token: the same
    assert report == _report(r.evolve(pass_ends=None) for r in records.values())
    lines = [json.dumps(request_record_json(r), sort_keys=True) for r in records.values()]
    pools = [(rank.pool.num_active, rank.pool.num_inactive, rank.pool.num_free,
              sorted(rank.pool.cached_identities()), rank._pass_id)
             for worker in replay.workers for rank in worker.ranks]
    return ([record_key(r) for r in records.values()], report, lines, stats, pools), replay
