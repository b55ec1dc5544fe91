"""The rank scheduler of every built-in engine: continuous batching on one attention-DP rank.

It serves every backend (vLLM, SGLang, TensorRT-LLM: the role's policy flags) and both
roles of a P/D deployment (:mod:`servesim.engines.disagg.ranks` specialises it).

One :meth:`RankScheduler.execute_pass` is one engine iteration:

1. running requests, in admission order, take chunks of the per-pass token budget
   (a decoding request needs one token, a prefilling one a prompt chunk); an allocation
   failure preempts the most recently admitted request (LIFO; FIFO on request);
2. only if nothing was preempted, waiting requests are admitted FCFS with head-of-line
   blocking, each after a prefix-cache probe and the admission check (vLLM: the known
   sequence fits now; TensorRT-LLM's GUARANTEED_NO_EVICT: the whole sequence, prompt
   plus output, fits beside what the admitted requests may still take, so a TensorRT-LLM
   rank never preempts);
3. requests whose computed length caught up with their sequence emit one token.

SGLang (spec §5.10) runs prompt work and decode steps in separate passes: a pass extends
prompts (chunk continuations and admissions) whenever one can run, the decoding requests
wait it out, and the first tokens it completes come out of it without decode time or
speculative drafts; otherwise the pass decodes.

A decoded token is appended to the sequence at once but its KV is computed by the next
pass, so a decoding request always has ``length - computed == 1`` ("dangling" token).
Token times are not known here (a worker's pass ends at its slowest rank); the caller
stamps the tokens listed in :class:`RankPass` when the pass ends.

Speculative decoding (spec §5.7): before any token is sampled, every ready request
reserves the blocks of its longest possible burst (preempting LIFO on failure); each then
emits a sampled burst of tokens sharing the pass's timestamp, and the accepted drafts'
KV counts as computed (one dangling token remains). State cache (spec §5.8, bookkeeping
in :mod:`servesim.engines.kernel.state`): a request that computes tokens also owns a
working state from the same pool; prefix reuse resumes only at a boundary with a
complete state snapshot, and prefill chunks are cut so that checkpoints land on
aligned boundaries.

Host (G2) tier (:mod:`servesim.engines.kernel.host_tier`, when the role configures one):
the blocks a pass evicts are written back to host, one transfer per pass started as the
pass is scheduled (blocks evicted between passes, by a load landing or a P/D
reservation, at once). A waiting head that would be admitted and whose prefix continues on host
past its GPU hits (up to the blocks the recompute rule lets it reuse) is not scheduled:
it leaves the queue (the requests behind it go on) while the host run crosses the link.
When it arrives, the run lands in fresh blocks behind the GPU prefix (evicting cached
ones; no block is held during the transfer, as if it were staged in a host buffer), is
published and released (cached, the most recently used), and the request returns to the
head of the queue, to be admitted as any request whose prefix is on the GPU; its first
admission reports the loaded part as G2 hits. It loads at most once per admission: what
is evicted again before it is admitted (a preempted request jumped ahead), or finds no
block to land in, it computes.
Steady decode segments stop before a block crossing that would evict (the write-back
starts with the pass that evicts).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from servesim import backends
from servesim.backends import Backend
from servesim.engines.kernel.blocks import NO_BLOCKS, BlockPool, Lease
from servesim.engines.kernel.host_tier import HostTier
from servesim.engines.kernel.rank import FINISHED, RUNNING, WAITING
from servesim.engines.kernel.requests import RequestRecord, RequestSpec
from servesim.engines.kernel.speculation import BurstSampler
from servesim.engines.kernel.state import RequestState, StateCache
from servesim.engines.kernel.tokens import (
    BlockIds,
    Prompt,
    Segment,
    block_hashes,
    block_ids,
    distinct_content,
    extend_run,
    generated_key,
    segment,
)
from servesim.engines.kernel.turns import TurnIds
from servesim.engines.ranks.token_ratio import CLIP_MAX_NEW_TOKENS, NewTokenRatio
from servesim.errors import ReplayError
from servesim.payload import RoleArgs
from servesim.timing.base import StepTimer

_SCHEDULED: Final = 0
_BLOCKED: Final = 1
_PREEMPTED_SELF: Final = 2
# The status of a request whose prefix blocks are being loaded from the host tier.
LOADING: Final = 3


def _prompt_left(seq: SeqState) -> bool:
    """Whether ``seq`` has prompt tokens to compute: its prompt, or after a preemption the
    prompt and the tokens it had generated (all but the dangling last one)."""
    return seq.num_computed < max(seq.prompt_len, seq.prompt_len + seq.generated - 1)


def _plain_write(rs: RequestState | None) -> bool:
    """The next write to this working state needs no blocks (it exists, unpublished)."""
    return rs is not None and bool(rs.working) and rs.published_at < 0


def partial_identity(prompt: Prompt, lo: int, hi: int, previous: int) -> int:
    """Chained identity of tokens ``[lo, hi)`` (``hi - lo`` shorter than a block)."""
    span: list[Segment] = []
    pos = 0
    for seg in prompt:
        a, b = max(lo, pos), min(hi, pos + seg.length)
        if a < b:
            offset = 0 if seg.repeat else seg.offset + a - pos
            span.append(Segment(seg.key, b - a, seg.repeat, offset))
        pos += seg.length
        if pos >= hi:
            break
    return block_hashes(span, hi - lo, previous=previous)[0]


@dataclass(slots=True, eq=False, init=False)
class SeqState:
    """Scheduler state of one request on one rank. ``__init__`` is written out so that
    the compiled build runs it natively, not the generated (interpreted) one."""

    spec: RequestSpec
    record: RequestRecord
    prompt_len: int
    max_output: int
    # Total-length cap: max_model_len, and the pool itself (a sequence of N*B + 1 tokens is
    # the longest one rank can hold, because the last token's KV is never computed).
    len_cap: int
    # Generation is complete once the sequence reaches this length: the requested output
    # or the length cap, whichever comes first (R4).
    stop_len: int
    generated: int
    num_computed: int
    status: int
    admitted: bool
    lease: Lease
    # Chained identities of complete blocks of prompt + generated tokens, grown lazily.
    hashes: BlockIds
    # Where the last walk of the prompt for them ended (``block_ids``' cursor; a segment
    # index at most ``len(spec.prompt)``, so it stays valid as the output grows).
    cursor: tuple[int, int]
    num_published: int  # leading lease blocks that are cache-visible
    # Blocks that answered the first identities (a session's previous turn's, on this
    # rank): lookups resume after them while they still do (BlockPool.lookup).
    known: Lease | None
    # What this request took in the current pass, so a later preemption can refund it.
    pass_id: int
    pass_tokens: int
    pass_isl: int  # -1: no prefill entry this pass
    pass_prefix: int
    # State-cache holdings (working state, checkpoints); None without a state cache.
    state: RequestState | None
    # Block positions loaded from the host tier for its next admission; None: nothing
    # loaded since its last admission.
    loaded: tuple[int, int] | None

    def __init__(self, spec: RequestSpec, record: RequestRecord, prompt_len: int,
                 max_output: int, len_cap: int, stop_len: int,
                 state: RequestState | None = None) -> None:
        self.spec = spec
        self.record = record
        self.prompt_len = prompt_len
        self.max_output = max_output
        self.len_cap = len_cap
        self.stop_len = stop_len
        self.generated = 0
        self.num_computed = 0
        self.status = WAITING
        self.admitted = False
        self.lease = Lease()
        self.hashes = BlockIds()
        self.cursor = (0, 0)
        self.num_published = 0
        self.known = None
        self.pass_id = -1
        self.pass_tokens = 0
        self.pass_isl = -1
        self.pass_prefix = 0
        self.state = state
        self.loaded = None

    @property
    def length(self) -> int:
        return self.prompt_len + self.generated

    @property
    def generation_complete(self) -> bool:
        return self.prompt_len + self.generated >= self.stop_len


def output_reserve(seq: SeqState, ahead: int = 0) -> int:
    """The output tokens ``seq`` may still generate (after ``ahead`` more decode steps),
    clipped as SGLang estimates them."""
    return min(seq.stop_len - seq.prompt_len - seq.generated - ahead, CLIP_MAX_NEW_TOKENS)


@dataclass(slots=True, eq=False, init=False)
class RankPass:
    """What one rank did in one pass; token times are stamped by the caller.
    ``__init__`` is written out so that the compiled build runs it natively."""

    prefill_ms: float
    decode_ms: float
    # what the prefill half was priced from: (batch, mean_isl, mean_prefix), and the
    # prompt tokens computed (a worker re-prices it with its ranks' tokens together)
    prefill_args: tuple[int, int, int] | None
    prefill_tokens: int
    # One entry per emitted token: a speculative burst lists its request once per token.
    emitted: list[SeqState]
    finished: list[SeqState]  # completed at the end of the pass
    rejected: list[SeqState]  # terminal at the start of the pass
    progressed: bool

    def __init__(self) -> None:
        self.prefill_ms = 0.0
        self.decode_ms = 0.0
        self.prefill_args = None
        self.prefill_tokens = 0
        self.emitted = []
        self.finished = []
        self.rejected = []
        self.progressed = False

    @property
    def duration_ms(self) -> float:
        # Prefill and decode halves of a pass run one after the other.
        return self.prefill_ms + self.decode_ms


class RankScheduler:
    """The scheduler of one attention-DP rank, with its own block pool (a
    :class:`servesim.engines.kernel.rank.Rank`)."""

    def __init__(self, role: RoleArgs, timer: StepTimer, rank_offset: int = 0,
                 policy: Backend | None = None) -> None:
        """``rank_offset`` (the rank's global index) offsets the speculation seed."""
        self.role = role
        self.timer = timer
        self.block_size = role.block_size
        self.pool = BlockPool(role.num_gpu_blocks, role.block_size)
        self.max_batched_tokens = role.max_batched_tokens
        self.max_sequences = role.max_sequences
        self.chunked = role.enable_chunked_prefill
        self.caching = role.prefix_caching
        # the identities each session's next turn takes over (prefix caching on)
        self.turns: TurnIds | None = TurnIds() if role.prefix_caching else None
        self.lifo = role.preemption_mode == "lifo"
        self.max_model_len = role.max_model_len
        self.total_kv_tokens = role.num_gpu_blocks * role.block_size
        sc = role.state_cache
        self.state: StateCache | None = None
        self.state_blocks = 0
        if sc is not None:
            self.state = StateCache(self.pool, sc.state_blocks, role.prefix_match_unit)
            self.state_blocks = sc.state_blocks
        # Chunks are cut at checkpoint boundaries only where checkpoints are kept.
        self.align = self.state is not None and self.caching and self.chunked
        self.unit = role.prefix_match_unit or role.block_size
        spec = role.speculation
        # A prefill worker's one token comes out of the prefill forward: no bursts there.
        self.sampler: BurstSampler | None = None
        if spec is not None and role.worker_type != "prefill":
            self.sampler = BurstSampler(spec.acceptance_rates, spec.seed, rank_offset)
        self.mtp = spec is not None and spec.kind == "mtp"
        # The backend's policy (servesim.backends), copied into plain attributes the loop
        # reads. no_evict: TensorRT-LLM's GUARANTEED_NO_EVICT capacity policy (spec §5.4): a
        # request is admitted only when the blocks of its whole sequence fit beside the
        # blocks every admitted request may still take, so nothing is ever preempted; its
        # output is clamped to what the pool holds (R2). vLLM admits what fits now and
        # preempts. SGLang (spec §5.10) runs prompt work and decode steps in separate
        # passes, admits a prompt only beside a share of the running requests' remaining
        # output (new_token_ratio), and retracts the requests with the least output when a
        # decode step does not fit.
        policy = policy or backends.policy_of(role.backend)  # the built-in, by default
        self.no_evict = policy.no_evict
        self.separate_prefill = policy.separate_prefill
        self.ratio: NewTokenRatio | None = None
        if policy.new_token_ratio:
            self.ratio = NewTokenRatio.for_rank(role.attention_data)
        # The working state takes its blocks beside the tokens; vLLM's last token needs no
        # KV (it is never computed).
        self.len_cap = (role.num_gpu_blocks - self.state_blocks) * role.block_size
        if not self.no_evict:
            self.len_cap += 1
        if role.max_model_len is not None:
            self.len_cap = min(self.len_cap, role.max_model_len)
        self.waiting: deque[SeqState] = deque()
        # Admission order with O(1) removal of any member: a dict used as an ordered set.
        self.running: dict[SeqState, None] = {}
        self._pass_id = 0
        self._budget = 0
        self._batch = 0
        self._isl = 0
        self._prefix = 0
        self._preemptions = 0
        self.prefill_interval = role.prefill_schedule_interval
        self.least_loaded = role.attention_dp_placement == "least_loaded"
        # TensorRT-LLM's attention-DP balance, (timeout_iters, batching_wait_iters): the
        # worker holds prompt work until every rank has some (kernel ``_hold_prompts``).
        self.balance: tuple[int, int] | None = None
        if role.attention_dp_balance and role.attention_data > 1:
            self.balance = (role.attention_dp_timeout_iters,
                            role.attention_dp_batching_wait_iters)
        self._prefill_capacity_bound = False
        # the host (G2) tier (attach_host) and the requests loading from it
        self.host: HostTier | None = None
        self.loading: dict[SeqState, None] = {}
        # The inlined decode step in execute_pass; off = every step through _schedule
        # (differential tests prove both give identical replays).
        self.fast_decode = True

    def attach_host(self, host: HostTier | None) -> None:
        """Put the host tier ``host`` (None: none) behind this rank's block pool."""
        self.host = host
        self.pool.on_evict = host.evicted if host is not None else None

    # -- intake -------------------------------------------------------------------------

    def new_seq(self, spec: RequestSpec, record: RequestRecord) -> SeqState:
        return SeqState(
            spec=spec,
            record=record,
            prompt_len=spec.input_length,
            max_output=spec.output_length,
            len_cap=self.len_cap,
            stop_len=min(spec.input_length + spec.output_length, self.len_cap),
            state=RequestState() if self.state is not None else None,
        )

    def submit(self, seq: SeqState) -> None:
        self.waiting.append(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def num_requests(self) -> int:
        return len(self.running) + len(self.waiting)

    @property
    def load(self) -> int:
        """The requests this rank has taken on, as least-loaded placement counts them."""
        return self.num_requests + len(self.loading)

    # -- one pass -------------------------------------------------------------------------

    def execute_pass(self, now: float, wave_step: int = 0, dp_size: int = 1,
                     hold: bool = False) -> RankPass:
        """Schedule and account one pass starting at ``now``.

        ``wave_step`` counts the passes of this rank's DP group since it last drained;
        with ``dp_size > 1`` and ``prefill_schedule_interval = N``, new prefill work is
        admitted only when ``wave_step % N == 0`` (decodes always continue). ``hold``:
        the DP group's balance holds prompt work in this pass, as off the cadence.
        """
        self._pass_id += 1
        self._budget = self.max_batched_tokens
        self._batch = self._isl = self._prefix = 0
        out = RankPass()
        scheduled: list[SeqState] = []
        preempted_before = self._preemptions
        off_cadence = (
            dp_size > 1
            and wave_step % self.prefill_interval != 0
            and not self._prefill_capacity_bound
            and any(s.num_computed >= s.prompt_len for s in self.running)
        )
        defer = hold or off_cadence
        # SGLang: a pass either extends prompts (chunk continuations and admissions; the
        # decoding requests wait) or decodes, and it extends whenever there is prompt work.
        extend = self.separate_prefill and not defer and (
            any(_prompt_left(s) for s in self.running)
            or not self._waiting_blocked())
        if self.ratio is not None and not extend and self.running:
            self._check_decode_memory()
        # Phase A: running requests. A snapshot, because preemption removes members;
        # a preempted one is skipped by its status.
        pass_id, bs, caching, fast = self._pass_id, self.block_size, self.caching, self.fast_decode
        stateless = self.state is None
        budget = self._budget
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.status != RUNNING:
                continue
            c = seq.num_computed
            if defer and c < seq.prompt_len:
                continue  # prompt chunks wait for the group's next prefill wave
            if extend and c >= seq.prompt_len and c + 1 >= seq.prompt_len + seq.generated:
                continue  # a decoding request waits out an extend pass
            if fast and c + 1 == seq.prompt_len + seq.generated and c >= seq.prompt_len and (
                c < seq.lease.size * bs
            ) and (stateless or _plain_write(seq.state)):
                # Fast path for the common case, equivalent to _schedule: a decode step
                # (one dangling token, prompt done) whose token fits the lease's last block
                # (and, with a state cache, whose working state needs no new blocks).
                c += 1
                seq.num_computed = c
                if caching and c % bs == 0:
                    self._publish(seq, c // bs)
                budget -= 1
                seq.pass_id = pass_id
                seq.pass_tokens = 1
                seq.pass_isl = -1
                scheduled.append(seq)
                continue
            self._budget = budget
            outcome = self._schedule(seq, scheduled, now, cached=0, reuse=NO_BLOCKS)
            budget = self._budget  # preemption may have refunded tokens
            if outcome == _BLOCKED:
                break
        self._budget = budget
        preempted_any = self._preemptions != preempted_before
        # Phase B: waiting requests, FCFS; nothing is admitted in a pass that preempted.
        # An SGLang decode pass admits no prompt: one its decode step made admissible (a
        # decayed ratio) waits for the next pass, an extend pass.
        if not preempted_any:
            self._admit_waiting(scheduled, out, now, defer,
                                prompts=extend or not self.separate_prefill)
            if not off_cadence:
                # Requests left waiting for capacity let the next pass admit again even off
                # the prefill cadence (a pass the balance held counts as on it, as a steady
                # pass does).
                self._prefill_capacity_bound = bool(self.waiting)
        if self.sampler is not None and not extend:
            before = self._preemptions
            self._reserve_bursts(scheduled)
            preempted_any = preempted_any or self._preemptions != before
        if scheduled or out.rejected or preempted_any:
            out.progressed = True
        if self._batch:
            b = self._batch
            out.prefill_args = args = (b, self._isl // b, self._prefix // b)
            out.prefill_tokens = self._isl - self._prefix
            out.prefill_ms = self.timer.prefill_ms(*args)
        self._emit_ready_tokens(scheduled, out, decode=not extend)
        self._write_back()
        return out

    def balance_load(self) -> tuple[bool, int]:
        """What this rank reports to its DP group's attention-DP balance before a pass:
        whether it has prompt work to schedule (a prompt chunk of a running request, or a
        waiting head it would admit), and how many of its running requests decode."""
        prompt_work = False
        decoding = 0
        for seq in self.running:
            if _prompt_left(seq):
                prompt_work = True
            else:
                decoding += 1
        return prompt_work or not self._waiting_blocked(), decoding

    # -- bulk advance of steady decode (spec §5.6; ARCHITECTURE "Replay kernel and speed") --

    def steady_plan(self) -> tuple[int, int, int] | None:
        """``(max_steps, batch, active_kv_tokens)`` if the next passes are homogeneous decode
        steps, else None.

        Steady: every running request is decoding (one dangling token, prompt done), the
        whole batch fits the token budget, there are no speculative bursts and no state
        cache, and nothing can be admitted: no waiting request, or the sequence cap is
        reached, or the waiting head is blocked on blocks. A blocked head stays blocked
        while no request finishes: blocks only get scarcer, and a decode step publishes
        only blocks holding its own generated tokens, which no other prompt contains.
        ``max_steps`` ends with the pass in which the first request completes; block
        crossings are bounded separately (:meth:`steady_block_limit`).
        """
        if self.sampler is not None or self.state is not None:
            return None
        running = self.running
        n = len(running)
        if n == 0 or n > self.max_batched_tokens or not self._intake_blocked():
            return None
        steps = self.len_cap
        active = 0
        for seq in running:
            c = seq.num_computed
            length = seq.prompt_len + seq.generated
            if c + 1 != length or c < seq.prompt_len:
                return None
            left = seq.stop_len - length
            if left < steps:
                steps = left
            active += length
        if self.ratio is not None and self.waiting and n < self.max_sequences:
            steps = self._head_blocked_steps(steps)
        return steps, n, active

    def _head_blocked_steps(self, steps: int) -> int:
        """SGLang: how many of the next ``steps`` steady passes (at least one) start with
        the waiting head still blocked, as :meth:`_intake_blocked` found it now.

        The decaying ``new_token_ratio`` and the shrinking remaining outputs release
        reserved tokens while decode steps take free ones, so a blocked head may become
        admissible, at the start of a pass (a decode pass admits no prompt). Pass
        ``k + 1`` sees ``k`` more decode steps; its condition is bounded by today's free
        tokens and pass ``k + 1``'s ratio and remaining outputs, which only fall (a step
        that evicts the head's cached prefix adds more to its prompt than to the free
        tokens). The bound uses the scheduler's own float expressions, so a blocked bound
        means a blocked pass.
        """
        assert self.ratio is not None
        seq, bs = self.waiting[0], self.block_size
        length = seq.prompt_len + seq.generated
        cached, reuse = self._prefix_cost(seq, length)
        extend = length - cached
        if not self._fits_budget(extend, self.max_batched_tokens):
            return 1  # blocked by the budget: an evicted prefix may change that
        need = extend + output_reserve(seq)
        pool = self.pool
        available = (pool.num_available - len(reuse) + pool.count_active(reuse)) * bs

        def blocked(k: int) -> bool:
            return not need < available - self._output_reserved(k)

        lo, hi = 0, steps - 1  # blocked(0); find the last blocked k below steps
        if blocked(hi):
            return steps
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if blocked(mid):
                lo = mid
            else:
                hi = mid
        return lo + 1

    def _intake_blocked(self) -> bool:
        """The next pass admits and rejects nothing, and neither do later ones as long as no
        request finishes (see :meth:`steady_plan`); pure apart from hash memoization."""
        return self._waiting_blocked()

    def _waiting_blocked(self) -> bool:
        """:meth:`_intake_blocked` for the ordinary waiting queue (prompt work)."""
        waiting = self.waiting
        if not waiting or len(self.running) >= self.max_sequences:
            return True
        seq = waiting[0]
        if seq.status != WAITING:
            return False  # not a state a pass leaves behind: let the stepwise pass see it
        if self.max_model_len is not None and seq.prompt_len >= self.max_model_len:
            return False
        length = seq.prompt_len + seq.generated
        if -(-length // self.block_size) + self.state_blocks > self.pool.num_blocks:
            return False
        cached, reuse = self._prefix_cost(seq, length)
        return not self._admits(seq, length, cached, reuse, self.max_batched_tokens,
                                self._output_reserved())

    def _admits(self, seq: SeqState, length: int, cached: int, reuse: Lease,
                budget: int, reserved: float) -> bool:
        """Whether the pool takes waiting ``seq`` (``length`` tokens, ``cached`` of them in
        the cached blocks ``reuse``) beside the admitted requests (spec §5.4, §5.10).

        vLLM: the blocks it would add to the active set now must be available (inactive
        cached blocks count, they are evicted on demand). GUARANTEED_NO_EVICT: the blocks
        of its whole sequence must be, beyond those the admitted requests may still take.
        Either way a blocked head stays blocked while no request finishes: decode steps
        take blocks out of the available ones (and, without eviction, out of the promised
        ones too) and publish only blocks of their own output.

        SGLang: a prompt within the chunk size must fit the pass's remaining token
        ``budget`` whole (a longer one takes the rest of it as a chunk), and its remaining
        prompt plus its clipped output must stay below the available tokens less the
        ``reserved`` output tokens (:meth:`_output_reserved`, plus the whole output of the
        requests admitted earlier in the pass). The whole prompt counts even when only a
        chunk runs now, as in SGLang's ``add_one_req``: a prompt admitted on its first chunk
        alone might not finish beside the running requests, and would be preempted at a
        continuation and readmitted, forever, while the decodes it stalls never run. A
        rank with nothing running admits by vLLM's rule, or a head that never meets these
        conditions would wait forever.
        (SGLang's max_prefill_tokens bound, 16384, is not applied: it only binds when the
        token budget is set above it.)
        """
        pool = self.pool
        active_reused = pool.count_active(reuse)
        if self.ratio is not None and self.running:
            bs = self.block_size
            extend = length - cached
            if not self._fits_budget(extend, budget):
                return False
            # Matching the prefix locks its inactive blocks: they stop being evictable.
            available = (pool.num_available - len(reuse) + active_reused) * bs
            return extend + output_reserve(seq) < available - reserved
        if self.no_evict:
            need = -(-seq.stop_len // self.block_size) - active_reused
            return need <= pool.num_available - self._promised()
        total_blocks = -(-length // self.block_size) + self.state_blocks
        return total_blocks - active_reused <= pool.num_available

    def _fits_budget(self, extend: int, budget: int) -> bool:
        """SGLang: a prompt with ``extend`` tokens to compute can start in a pass with
        ``budget`` tokens left: whole (its pages) within the chunk size, else as a chunk of
        the budget's whole pages."""
        bs = self.block_size
        if extend <= self.max_batched_tokens:
            return -(-extend // bs) * bs <= budget
        return budget // bs > 0

    def _output_reserved(self, ahead: int = 0) -> float:
        """SGLang: the output tokens its admission keeps free for the running requests,
        their ``new_token_ratio`` share of what each may still generate (0 elsewhere);
        ``ahead``: as it will be after that many more decode steps of all of them."""
        if self.ratio is None:
            return 0.0
        return self.ratio.after(ahead) * sum(output_reserve(seq, ahead)
                                             for seq in self.running)

    def _check_decode_memory(self) -> None:
        """SGLang's check before a decode pass (spec §5.10): while the blocks its decode
        steps open exceed the available ones, retract the running request with the least
        output, keeping one; a retraction re-estimates ``new_token_ratio`` from the
        requests left, a pass without one decays it."""
        assert self.ratio is not None
        bs, running, pool = self.block_size, self.running, self.pool

        def opens_block(seq: SeqState) -> bool:
            c = seq.num_computed
            return c >= seq.prompt_len and c + 1 == seq.prompt_len + seq.generated and (
                c == seq.lease.size * bs)

        needed = sum(map(opens_block, running))
        retracted = False
        while needed > pool.num_available and len(running) > 1:
            victim = self._victim()
            needed -= opens_block(victim)
            self._preempt(victim)
            retracted = True
        if retracted:
            self.ratio.retracted(sum(seq.generated for seq in running),
                                 sum(seq.stop_len - seq.prompt_len for seq in running),
                                 len(running))
        else:
            self.ratio.decoded()

    def _promised(self) -> int:
        """Blocks the admitted requests may still take before they complete (no-evict)."""
        bs = self.block_size
        return sum(-(-seq.stop_len // bs) - seq.lease.size for seq in self._admitted())

    def _admitted(self) -> Iterable[SeqState]:
        """The requests this rank has taken on (holding blocks or promised some)."""
        return self.running

    def _steady_crossings(self) -> list[int]:
        """Per running request, the first steady step that needs a new block."""
        bs = self.block_size
        return [seq.lease.size * bs - seq.num_computed + 1 for seq in self.running]

    def steady_block_limit(self, steps: int) -> int:
        """The most steady steps (at most ``steps``) whose block allocations all succeed.

        A decode step crossing into a new block allocates it; with no request finishing
        and nothing admitted, the ``num_available`` blocks bound the crossings, so none of
        these allocations can fail or preempt.
        """
        bs = self.block_size
        firsts = self._steady_crossings()
        # with a host tier, an eviction starts a write-back: the segment stops before it
        available = self.pool.num_available if self.host is None else self.pool.num_free

        def needed(k: int) -> int:
            return sum(1 + (k - j) // bs for j in firsts if j <= k)

        if needed(steps) <= available:
            return steps
        lo, hi = 0, steps  # needed(lo) <= available < needed(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if needed(mid) <= available:
                lo = mid
            else:
                hi = mid
        return lo

    def advance_steady(self, steps: int, wave_step: int, dp_size: int,
                       waiting: bool) -> RankPass | None:
        """Apply ``steps`` steady decode passes at once (:meth:`steady_plan` said they are).

        The result is what ``steps`` calls of :meth:`execute_pass` would leave: every request
        computed and generated ``steps`` more tokens; block allocations at crossings and
        publications of completed blocks happen step by step in running order, exactly as
        the passes would run them; requests that got their last token in the last pass
        finish (the pass's ``finished``, returned when there are any). ``waiting``: whether
        the waiting queue was non-empty when the passes started (requests may have joined
        it since). The caller stamps the tokens and prices the steps.
        """
        bs, caching, pool = self.block_size, self.caching, self.pool
        running = list(self.running)
        # Each event (step j, position i, kind: 0 alloc, 1 publish) as one integer that
        # sorts as the tuple would: ints sort natively, tuples element by element.
        shift = len(running).bit_length() + 1
        events: list[int] = []
        for i, j in enumerate(self._steady_crossings()):
            while j <= steps:
                events.append((j << shift) | (i << 1))
                j += bs
        if caching:
            for i, seq in enumerate(running):
                j = bs - seq.num_computed % bs
                while j <= steps:
                    events.append((j << shift) | (i << 1) | 1)
                    j += bs
        computed = [seq.num_computed for seq in running]
        generated = [seq.generated for seq in running]
        if events:
            events.sort()
            position = (1 << (shift - 1)) - 1
            for event in events:
                j, i = event >> shift, (event >> 1) & position
                seq = running[i]
                # the state the stepwise pass j sees: j - 1 tokens generated so far
                seq.generated = generated[i] + j - 1
                end = computed[i] + j
                seq.num_computed = end
                if not (event & 1):
                    ok = pool.allocate(seq.lease, seq.lease.size + 1)
                    assert ok, "a steady block crossing failed to allocate"
                if caching:
                    self._publish(seq, end // bs)
        for i in range(len(running)):
            seq = running[i]
            seq.num_computed = computed[i] + steps
            seq.generated = generated[i] + steps
        self._pass_id += steps
        if self.ratio is not None:
            self.ratio.decoded(steps)
        # The cadence flag: a non-deferred pass sets it to "requests left waiting".
        flag = self._prefill_capacity_bound
        interval = self.prefill_interval
        for j in range(min(steps, interval)):
            if dp_size <= 1 or (wave_step + j) % interval == 0 or flag:
                self._prefill_capacity_bound = waiting
                break
        # In running order, as the last pass's emission would finish them.
        done = [seq for seq in running if seq.prompt_len + seq.generated >= seq.stop_len]
        if not done:
            return None
        out = RankPass()
        for seq in done:
            self._finish(seq, out)
        return out

    def _admit_waiting(
        self, scheduled: list[SeqState], out: RankPass, now: float, defer: bool,
        prompts: bool = True,
    ) -> None:
        """Admit waiting requests, FCFS with head-of-line blocking (none without
        ``prompts``; under ``defer``, only those with at most one token to compute)."""
        if not prompts:
            return
        waiting, running, pool, bs = self.waiting, self.running, self.pool, self.block_size
        state_blocks = self.state_blocks
        reserved = self._output_reserved()
        while waiting and len(running) < self.max_sequences:
            seq = waiting[0]
            if self.max_model_len is not None and seq.prompt_len >= self.max_model_len:
                self._reject(seq, out)
                continue
            length = seq.prompt_len + seq.generated
            # A working state (fresh, or a private copy of a restored snapshot) comes along.
            total_blocks = -(-length // bs) + state_blocks
            if total_blocks > pool.num_blocks:
                self._reject(seq, out)
                continue
            cached, reuse = self._prefix_cost(seq, length)
            if not self._admits(seq, length, cached, reuse, self._budget, reserved):
                break  # head-of-line blocking: nothing behind it is admitted
            if defer and length - cached > 1:
                break
            if self.host is not None and not seq.loaded and self._load_from_host(seq, length):
                out.progressed = True
                continue
            outcome = self._schedule(seq, scheduled, now, cached=cached, reuse=reuse)
            if outcome != _SCHEDULED:
                break
            if self.ratio is not None and seq.num_computed == length:
                reserved += output_reserve(seq)  # its whole output, this pass
            if seq.pass_tokens == 0 and self._budget == 0:
                break

    def _prefix_cost(self, seq: SeqState, length: int) -> tuple[int, Lease]:
        """Cached tokens a (re)admission may reuse, and the blocks that hold them."""
        if not self.caching:
            return 0, NO_BLOCKS
        bs = self.block_size
        full = length // bs
        self._ensure_hashes(seq, full)
        hits = self.pool.lookup(seq.hashes, full, seq.known)
        cached = len(hits) * bs
        needs_token = not seq.generation_complete
        if needs_token:
            # vLLM recompute rule: a request that still needs logits recomputes at least
            # its last token, so a block-aligned full hit gives back its last block.
            cached = min(cached, (length - 1) // bs * bs)
            if self.mtp and cached:
                # The MTP drafter needs the hidden states of the last reused block.
                cached -= bs
        if self.state is not None:
            cached = self._state_hit(seq, length, len(hits), cached, needs_token)
        keep = cached // bs
        return cached, hits if keep == len(hits) else hits.head(keep)

    def _load_from_host(self, seq: SeqState, length: int) -> bool:
        """Start loading the blocks of ``seq``'s prefix that follow its GPU hits from the
        host tier, if it holds any (up to the last block the recompute rule lets it
        reuse): ``seq`` leaves the queue until they arrive (see the module docstring)."""
        host, pool, bs = self.host, self.pool, self.block_size
        assert host is not None
        bound = length // bs if seq.generation_complete else (length - 1) // bs
        hits = pool.lookup(seq.hashes, bound)
        start = len(hits)
        if start >= bound:
            return False
        count = host.pool.match(seq.hashes, start, bound)
        if not count:
            return False
        self.waiting.popleft()
        seq.status = LOADING
        seq.loaded = (start, start + count)
        self.loading[seq] = None
        host.load(seq.spec.request_id, count, lambda: self._loaded(seq))
        return True

    def _loaded(self, seq: SeqState) -> None:
        """The blocks ``seq`` loaded from host arrived: they land in fresh blocks behind
        its GPU prefix and become cache-visible (the most recently released), and it
        returns to the head of the queue. If its prefix left the GPU meanwhile, or no block
        can be taken, they are dropped (it computes them)."""
        assert seq.loaded is not None
        start, end = seq.loaded
        pool, lease = self.pool, Lease()
        hits = pool.lookup(seq.hashes, start)
        if len(hits) == start and pool.allocate(lease, end, hits):
            pool.publish(lease, seq.hashes, start, end)
            pool.release(lease)
            self._write_back()  # what the landing evicted, from now
        del self.loading[seq]
        seq.status = WAITING
        self.waiting.appendleft(seq)

    def _write_back(self) -> None:
        """Start copying the blocks evicted since the last write-back to the host tier."""
        if self.host is not None:
            self.host.flush()

    def _state_hit(
        self, seq: SeqState, length: int, hit_blocks: int, token_bound: int, needs_token: bool
    ) -> int:
        """Joint hit: the largest checkpoint boundary with token KV and a complete state.

        Token hits alone are never a state hit. A request that needs a token is capped at
        its logits boundary ``floor((len - 1) / unit) * unit``; with MTP also at the
        block-reduced token bound (a sparser checkpoint below it is not rewound further).
        """
        assert self.state is not None
        unit = self.unit
        bound = (length - 1) // unit * unit if needs_token else length
        if self.mtp and needs_token:
            bound = min(bound, token_bound)
        if bound <= 0:
            return 0
        return self.state.joint_hit(hit_blocks, bound,
                                    lambda boundary: self._prefix_identity(seq, boundary))

    def _schedule(
        self,
        seq: SeqState,
        scheduled: list[SeqState],
        now: float,
        *,
        cached: int,
        reuse: Lease,
    ) -> int:
        from_waiting = seq.status == WAITING
        start = seq.num_computed + cached
        length = seq.prompt_len + seq.generated
        prompt_remaining = seq.prompt_len - min(start, seq.prompt_len)
        if prompt_remaining > 0 and not self.chunked and prompt_remaining > self._budget:
            if prompt_remaining > self.max_batched_tokens:
                raise self._unschedulable(seq, prompt_remaining)
            return _BLOCKED
        desired = min(length - start, self._budget)
        if desired == 0 and length > start:
            return _BLOCKED
        if self.align:
            desired = self._aligned_chunk(start, desired, length)
        end = start + desired
        target_blocks = -(-end // self.block_size)
        pool = self.pool
        if self.state is None:
            while not pool.allocate(seq.lease, target_blocks, reuse):
                if from_waiting:
                    # Admission already checked the blocks fit; never preempt running work
                    # for a request that is not running yet.
                    return _BLOCKED
                victim = self._victim()
                self._preempt(victim)
                if victim is seq:
                    return _PREEMPTED_SELF
        else:
            peak = target_blocks
            if self.sampler is not None and end == length:
                # the burst reservation of this pass comes on top (see _reserve_bursts)
                widest = self.sampler.num_speculative_tokens + 1
                peak = max(peak, -(-min(end + widest, seq.stop_len - 1) // self.block_size))
            outcome = self._allocate_with_state(seq, target_blocks, peak, reuse, desired > 0,
                                                from_waiting)
            if outcome != _SCHEDULED:
                return outcome
        seq.num_computed = end
        if self.caching:
            if len(reuse) > seq.num_published:
                # The reused blocks answer their identities already: publish what follows.
                seq.num_published = len(reuse)
            self._publish(seq, end // self.block_size)
        self._budget -= desired
        seq.pass_id = self._pass_id
        seq.pass_tokens = desired
        # A prefill entry for the timing model: everything but a one-token decode step
        # (prompt chunks, and recomputation of a preempted request's sequence).
        if desired and start < max(seq.prompt_len, length - 1):
            seq.pass_isl = end
            seq.pass_prefix = start
            self._batch += 1
            self._isl += end
            self._prefix += start
        else:
            seq.pass_isl = -1
        if from_waiting:
            self.waiting.popleft()
            self.running[seq] = None
            seq.status = RUNNING
            rec = seq.record
            reused = min(cached, seq.prompt_len)
            if not seq.admitted:
                seq.admitted = True
                rec.first_admit_ms = now
                rec.first_admission_reused_tokens = reused
                if self.host is not None:
                    self._count_host_hit(seq, reused)
            seq.loaded = None
            if reused > rec.reused_input_tokens:
                rec.reused_input_tokens = reused
        scheduled.append(seq)
        return _SCHEDULED

    def _count_host_hit(self, seq: SeqState, reused: int) -> None:
        """A first admission's reuse, and the part of it loaded from host."""
        assert self.host is not None
        loaded = 0
        if seq.loaded is not None:
            lo, hi = seq.loaded
            loaded = max(0, min(reused, hi * self.block_size) - lo * self.block_size)
        self.host.admitted(seq.prompt_len, reused, loaded)

    def _aligned_chunk(self, start: int, desired: int, length: int) -> int:
        """Cut a chunk so that the step ends on a checkpoint boundary (spec §5.8).

        The chunk that completes the sequence first stops at its last unit boundary (so a
        checkpoint lands there) and the final partial unit follows in the next step; a
        chunk cut short by the token budget ends on a block boundary, else on a unit
        boundary, else (the budget holds less than one unit) where the budget ends.
        """
        end = start + desired
        unit = self.unit
        if end == length:
            cut = length // unit * unit
            return cut - start if start < cut < length else desired
        for step in (self.block_size, unit):
            cut = end // step * step
            if cut > start:
                return cut - start
        return desired

    def _allocate_with_state(
        self, seq: SeqState, target_blocks: int, peak_blocks: int,
        reuse: Lease, writes: bool, from_waiting: bool,
    ) -> int:
        """Grow the token lease and make the working state writable, all or nothing.

        ``peak_blocks`` is the most token blocks the request holds during this pass; a
        published checkpoint is preserved only if the pool could ever hold it beside them.
        """
        state, pool, rs = self.state, self.pool, seq.state
        assert state is not None and rs is not None
        while True:
            extra, preserve = state.write_cost(rs, peak_blocks) if writes else (0, False)
            fresh = target_blocks - seq.lease.size - len(reuse)
            fits = pool.fits(max(fresh, 0) + extra, reuse)
            if not fits and preserve and not self.lifo and pool.fits(max(fresh, 0), reuse):
                # FIFO retracts the oldest request, often the requester itself: there the
                # checkpoint copy is dropped rather than paid for with a preemption.
                fits, preserve = True, False
            if fits:
                ok = pool.allocate(seq.lease, target_blocks, reuse)
                assert ok
                if writes:
                    state.begin_write(rs, preserve)
                return _SCHEDULED
            if from_waiting:
                return _BLOCKED
            victim = self._victim()
            self._preempt(victim)
            if victim is seq:
                return _PREEMPTED_SELF

    def _reserve_bursts(self, scheduled: list[SeqState]) -> None:
        """Reserve blocks for every ready request's longest burst before sampling.

        A burst of ``k`` tokens leaves ``len + k - 1`` tokens computed and the next step
        computes one more, so a request reserves ``len + nextn + 1`` tokens, never beyond
        the last token that ever needs KV (``stop_len - 1``). A failure preempts the
        latest admitted request (LIFO whatever ``preemption_mode``, spec §5.7) until the
        reservation fits or the request itself was preempted. The reservation comes after
        this pass's admissions, so a FIFO victim would be the oldest running request,
        retracted for a newcomer that may not even be ready: two requests that cannot
        both hold their bursts would then retract each other forever.
        """
        assert self.sampler is not None
        pool, bs, pass_id = self.pool, self.block_size, self._pass_id
        widest = self.sampler.num_speculative_tokens + 1
        for seq in scheduled:
            if seq.pass_id != pass_id or seq.status != RUNNING:
                continue
            length = seq.prompt_len + seq.generated
            if seq.num_computed != length or length >= seq.stop_len:
                continue
            tokens = min(length + widest, seq.stop_len - 1)
            target = -(-tokens // bs)
            lease = seq.lease
            while lease.size < target and not pool.allocate(lease, target):
                victim = self._victim(lifo=True)
                self._preempt(victim)
                if victim is seq:
                    break

    def _segments(self, seq: SeqState) -> Prompt:
        """The request's tokens: its prompt, then its generated output."""
        prompt = seq.spec.prompt
        if seq.generated:
            prompt = (*prompt, Segment(generated_key(seq.spec.request_id), seq.generated, False))
        return prompt

    def _prefix_identity(self, seq: SeqState, tokens: int) -> int:
        """Identity of the first ``tokens`` tokens (a block chain hash when block-aligned)."""
        bs = self.block_size
        full = tokens // bs
        self._ensure_hashes(seq, full)
        previous = seq.hashes[full - 1] if full else 0
        if tokens == full * bs:
            return previous
        return partial_identity(self._segments(seq), full * bs, tokens, previous)

    def _end_state_step(self, seq: SeqState) -> None:
        """The pass wrote ``seq``'s working state: publish or release its checkpoints."""
        assert self.state is not None and seq.state is not None
        computed = seq.num_computed
        if not (self.caching and computed % self.unit == 0 and computed > 0):
            if seq.state.retained:  # else nothing is held: nothing to do (the common case)
                self.state.end_step(seq.state, computed, None)
            return
        self.state.end_step(seq.state, computed, self._prefix_identity(seq, computed))

    def _publish(self, seq: SeqState, full: int) -> None:
        """Blocks completed by this step become cache-visible now, also to later requests
        of the same pass (vLLM ``allocate_slots`` semantics)."""
        if full > seq.num_published:
            self._ensure_hashes(seq, full)
            self.pool.publish(seq.lease, seq.hashes, seq.num_published, full)
            seq.num_published = full

    def _victim(self, lifo: bool = False) -> SeqState:
        """The request to preempt: the latest admitted (LIFO, or with ``lifo``) or the
        earliest (FIFO); SGLang retracts the one with the least output (the longest prompt
        among equals, then the latest admitted)."""
        running = self.running
        if self.ratio is not None:
            return min(reversed(running), key=lambda seq: (seq.generated, -seq.prompt_len))
        return next(reversed(running)) if lifo or self.lifo else next(iter(running))

    def _preempt(self, victim: SeqState) -> None:
        """Recompute-style preemption: drop all KV (it stays cached) and requeue at front."""
        assert not self.no_evict, "GUARANTEED_NO_EVICT admitted more than the pool holds"
        del self.running[victim]
        if victim.pass_id == self._pass_id:
            # Scheduled earlier in this pass: give its tokens back to the budget.
            self._budget += victim.pass_tokens
            if victim.pass_isl >= 0:
                self._batch -= 1
                self._isl -= victim.pass_isl
                self._prefix -= victim.pass_prefix
            victim.pass_id = -1
        self.pool.release(victim.lease)
        if self.state is not None and victim.state is not None:
            self.state.release(victim.state, done=False)
        victim.num_published = 0
        victim.num_computed = 0
        victim.status = WAITING
        victim.record.num_preemptions += 1
        if self.ratio is not None:
            self.waiting.append(victim)  # SGLang requeues retracted requests at the back
        else:
            self.waiting.appendleft(victim)
        self._preemptions += 1

    def _emit_ready_tokens(self, scheduled: list[SeqState], out: RankPass,
                           decode: bool = True) -> None:
        """Emit the tokens of the pass. Without ``decode`` (an SGLang extend pass) the
        tokens come out of the prompt forward: no decode time, one token each."""
        if self.state is not None or self.sampler is not None:
            self._emit_general(scheduled, out, decode)
            return
        ready: list[SeqState] = []
        active = 0
        pass_id = self._pass_id
        for seq in scheduled:
            if seq.pass_id != pass_id or seq.status != RUNNING:
                continue  # preempted after being scheduled
            length = seq.prompt_len + seq.generated
            if seq.num_computed != length:
                continue  # mid-prefill chunk
            if length >= seq.stop_len:
                self._finish(seq, out)  # e.g. zero-output: terminal without a token
            else:
                ready.append(seq)
                active += length
        if ready:
            n = len(ready)
            if decode:
                out.decode_ms = self.timer.decode_ms(n, active, active // n,
                                                     self.total_kv_tokens)
            out.emitted = ready  # each gets exactly one token
            for seq in ready:
                g = seq.generated + 1
                seq.generated = g
                if seq.prompt_len + g >= seq.stop_len:
                    self._finish(seq, out)

    def _emit_general(self, scheduled: list[SeqState], out: RankPass, decode: bool) -> None:
        """:meth:`_emit_ready_tokens` with speculative bursts and state-cache steps."""
        ready: list[SeqState] = []
        active = 0
        pass_id = self._pass_id
        stateful = self.state is not None
        for seq in scheduled:
            if seq.pass_id != pass_id or seq.status != RUNNING:
                continue  # preempted after being scheduled
            length = seq.prompt_len + seq.generated
            if seq.num_computed != length:
                if stateful and seq.pass_tokens:
                    self._end_state_step(seq)  # mid-prefill chunk
                continue
            if length >= seq.stop_len:
                if stateful and seq.pass_tokens:
                    self._end_state_step(seq)
                self._finish(seq, out)  # e.g. zero-output: terminal without a token
            else:
                ready.append(seq)
                active += length
        if not ready:
            return
        n = len(ready)
        sampler = None
        if decode:
            out.decode_ms = self.timer.decode_ms(n, active, active // n, self.total_kv_tokens)
            sampler = self.sampler
        caching, bs = self.caching, self.block_size
        emitted: list[SeqState] = []
        for seq in ready:
            length = seq.prompt_len + seq.generated
            burst = 1 if sampler is None else sampler.sample(seq.stop_len - length)
            seq.generated += burst
            if burst > 1:
                # The accepted drafts were verified in this forward: their KV exists.
                seq.num_computed = length + burst - 1
                if caching:
                    self._publish(seq, seq.num_computed // bs)
                for _ in range(burst):  # (a list of ``burst`` copies costs more)
                    emitted.append(seq)
            else:
                emitted.append(seq)
            if stateful and seq.pass_tokens:
                self._end_state_step(seq)
            if length + burst >= seq.stop_len:
                self._finish(seq, out)
        out.emitted = emitted

    def _finish(self, seq: SeqState, out: RankPass) -> None:
        del self.running[seq]
        if self.turns is not None and self.turns.keeps(seq.spec):
            known = self.pool.answering(seq.lease, seq.num_published)
            self.turns.remember(seq.spec, seq.generated, seq.hashes, seq.cursor, known)
            seq.hashes, seq.cursor = BlockIds(), (0, 0)  # handed over to the next turn
        self.pool.release(seq.lease)
        if self.state is not None and seq.state is not None:
            self.state.release(seq.state, done=True)
        seq.num_published = 0
        seq.status = FINISHED
        out.finished.append(seq)
        if self.ratio is not None and not self.running:
            self.ratio.reset()  # the rank goes idle

    def _reject(self, seq: SeqState, out: RankPass) -> None:
        self.waiting.popleft()
        seq.status = FINISHED
        out.rejected.append(seq)

    def _ensure_hashes(self, seq: SeqState, n_blocks: int) -> None:
        have = len(seq.hashes)
        if have >= n_blocks:
            return
        if have == 0 and self.turns is not None:
            # A session's next turn: the previous turn's identities, when it continues it.
            taken = self.turns.take(seq.spec.session_id, seq.spec.prompt, seq.spec.extends)
            if taken is not None:
                seq.hashes, seq.cursor, seq.known = taken
                have = len(seq.hashes)
                if have >= n_blocks:
                    return
        bs = self.block_size
        if have * bs >= seq.prompt_len and n_blocks * bs <= seq.prompt_len + seq.generated:
            # Only generated tokens (a decode step completing a block): the generated
            # segment's identities, without walking the prompt to it.
            continues = have > 0 and (have - 1) * bs >= seq.prompt_len
            content = 0 if continues else distinct_content(
                generated_key(seq.spec.request_id), have * bs - seq.prompt_len, bs)
            extend_run(seq.hashes, content, n_blocks - have, continues)
            return
        prompt = seq.spec.prompt
        index, pos = seq.cursor
        skipped = 0  # segments before the cursor, left out of the walk's prompt
        if n_blocks * bs > seq.prompt_len:
            # the segments from the cursor on, then the output (not the whole prompt: a
            # session turn's is the conversation so far)
            skipped = index
            prompt = (*prompt[index:],
                      segment(generated_key(seq.spec.request_id), seq.generated, False))
        index, pos = block_ids(prompt, bs, seq.hashes, n_blocks * bs, have * bs,
                               (index - skipped, pos))
        if index + skipped <= len(seq.spec.prompt):
            seq.cursor = (index + skipped, pos)

    def _unschedulable(self, seq: SeqState, tokens: int) -> ReplayError:
        from servesim.rules import prompt_over_budget

        problem = prompt_over_budget(self.role, seq.spec.request_id, tokens)
        assert problem is not None
        return ReplayError([problem])
