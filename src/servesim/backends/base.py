"""What a serving backend is to servesim: one policy object, read by every layer.

A :class:`Backend` holds everything that differs between vLLM, SGLang and TensorRT-LLM
(spec §3, §5, §6): the defaults the compiler resolves (block size, memory fraction, token
budget, context length), the memory formula, the scheduler's admission and victim policy
and pass composition (as plain flags the rank scheduler copies once per rank), how the
default timing prices its prompt passes, the P/D handoff order, and the rules about the
fields only some backends take. Modules ask the policy; none compares a backend's name.

A backend is registered by the ``servesim_register_backends`` hook; a variant subclasses
a built-in and changes what differs (see ``docs/backends.md``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from servesim import codes
from servesim.errors import Diagnostic, Path, error

if TYPE_CHECKING:
    from servesim.payload import RoleArgs

DEFAULT_TOKEN_BUDGET = 8192  # vLLM/TRT-LLM max_num_batched_tokens, SGLang chunked_prefill_size

# the scheduler fields only some backends take (``[engine.workers.<role>.scheduler]``)
BACKEND_ONLY_FIELDS = ("prefill_schedule_interval", "attention_dp_balance",
                       "prefill_decode_interval")


class Backend:
    """A serving backend's policy. Subclass it and override what differs.

    Every attribute is a class-level constant: the rank scheduler copies the flags into
    plain attributes when a rank is built, so the replay loop reads no method per token.
    """

    NAME: ClassVar[str] = ""  # the value of ``engine.backend``; unique across plugins
    LABEL: ClassVar[str] = ""  # how messages name it ("vLLM")
    DESCRIPTION: ClassVar[str] = ""  # one line for ``servesim plugins``

    # the backend whose performance data prices this one (the measured kernel tables, the
    # default timing's fitted overheads, calibration measurements): a variant of a built-in
    # inherits its base's; "" for none (the default timing's generic constants)
    perf_backend: ClassVar[str] = ""
    # MXFP4 experts (gpt-oss) run with MXFP8 activations on GPUs whose tensor cores take FP4
    # (TensorRT-LLM's TRTLLM and CUTLASS MoE backends on Blackwell); else with BF16
    # activations (weight-only kernels): which tables of measured MoE kernels price them
    mxfp4_moe_fp8_activations: ClassVar[bool] = False

    # -- defaults the compiler resolves (spec §3.1, §3.3) ---------------------------------
    default_block_size: ClassVar[int] = 64
    min_block_size: ClassVar[int] = 2  # the smallest page it allocates
    default_memory_fraction: ClassVar[float] = 0.9
    # ``context_length = "max"``: the model's maximum (True) or unlimited (False)
    context_max_from_model: ClassVar[bool] = False

    # -- admission and victim choice (spec §5) --------------------------------------------
    # admit a request only when its whole sequence fits beside what every admitted request
    # may still take, so nothing is preempted (TensorRT-LLM's GUARANTEED_NO_EVICT)
    no_evict: ClassVar[bool] = False
    # admit prompts beside a share of the running requests' remaining output
    # (SGLang's new_token_ratio) and retract the request with the least output
    new_token_ratio: ClassVar[bool] = False

    # -- pass composition ------------------------------------------------------------------
    # prompt work and decode steps run in separate passes (SGLang)
    separate_prefill: ClassVar[bool] = False
    # the default timing prices an aggregated worker's prompt passes as a prefill worker's
    standalone_prefill_pricing: ClassVar[bool] = False

    # -- P/D handoff (spec §6) ------------------------------------------------------------
    # the decode worker reserves its blocks before the prefill runs (SGLang)
    destination_first: ClassVar[bool] = False

    # -- the fields only some backends take -----------------------------------------------
    scheduler_fields: ClassVar[frozenset[str]] = frozenset()  # of BACKEND_ONLY_FIELDS
    chunked_prefill_optional: ClassVar[bool] = True  # enable_chunked_prefill = false allowed
    state_cache: ClassVar[bool] = False  # kv_cache.state_cache (hybrid models)
    ngram_speculation: ClassVar[bool] = False

    def default_token_budget(self, attention_data: int) -> int:
        """Per-rank ``max_batched_tokens`` default (spec §1.4)."""
        return DEFAULT_TOKEN_BUDGET

    # the provenance of the default above (None: a plain default)
    token_budget_note: ClassVar[str | None] = None

    def kv_budget(self, *, capacity: int, fraction: Fraction, memory_fraction: float,
                  weights: int, activations: int, runtime_overhead: int, comm_overhead: int,
                  cuda_graph: int) -> tuple[int, str]:
        """KV bytes per GPU and the formula, from the memory terms (spec §3.3); may be <= 0.

        ``fraction`` is ``memory_fraction`` as the exact decimal the user wrote. The base
        formula is vLLM's: ``capacity x fraction - non_kv``.
        """
        non_kv = weights + activations + runtime_overhead + comm_overhead + cuda_graph
        kv = math.floor(capacity * fraction) - non_kv
        return kv, f"kv_bytes {kv} = {capacity} x {memory_fraction} - non_kv {non_kv}"

    def rules(self, r: RoleArgs, path: Path, registered: Sequence[Backend],
              ) -> Iterator[Diagnostic]:
        """The backend-specific rules on a resolved role (spec V10-V12).

        ``registered`` (every registered backend) lets a message name the backends that do
        take a field. Called by :func:`servesim.rules.backend_fields`, so the compiler's
        validate pass and an engine's payload check run this one implementation.
        """
        if r.block_size < self.min_block_size:
            smaller = _labels([b for b in registered if b.min_block_size < self.min_block_size])
            fussy = _labels([b for b in registered if b.min_block_size >= self.min_block_size])
            yield error(codes.BLOCK_SIZE_TOO_SMALL, (*path, "kv_cache", "block_size"),
                        f"{'/'.join(fussy)} require{'s' if len(fussy) == 1 else ''} block_size "
                        f">= {self.min_block_size}, got {r.block_size}",
                        f"{'/'.join(smaller)} is the only backend with single-token pages"
                        if len(smaller) == 1 else None)
        neutral = {"prefill_schedule_interval": 1, "attention_dp_balance": False,
                   "prefill_decode_interval": 0}
        for field in BACKEND_ONLY_FIELDS:
            if getattr(r, field) != neutral[field] and field not in self.scheduler_fields:
                takers = [b for b in registered if field in b.scheduler_fields]
                yield error(codes.BACKEND_FIELD, (*path, "scheduler", field),
                            f"{field} is supported only for {names_of(takers)}, got "
                            f"backend={r.backend}", _FIELD_HINTS.get(field))
        yield from self.own_rules(r, path)
        if not r.enable_chunked_prefill and not self.chunked_prefill_optional:
            yield error(codes.BACKEND_FIELD, ("engine", "enable_chunked_prefill"),
                        f"enable_chunked_prefill = false is not supported for backend={r.backend}")

    def own_rules(self, r: RoleArgs, path: Path) -> Iterator[Diagnostic]:
        """Rules of this backend alone (none in the base)."""
        return iter(())


_FIELD_HINTS = {"attention_dp_balance": "vLLM spaces prefills across attention-DP ranks with "
                "prefill_schedule_interval"}


def _labels(backends: Sequence[Backend]) -> list[str]:
    return list(dict.fromkeys(b.LABEL or b.NAME for b in backends))


def names_of(backends: Sequence[Backend]) -> str:
    """``backend=vllm`` (or ``backend=a or backend=b``) for a message."""
    return " or ".join(f"backend={b.NAME}" for b in backends) or "no registered backend"
