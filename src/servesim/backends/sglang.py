"""SGLang: separate prompt and decode passes, new_token_ratio admission (spec §5.10)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from typing import TYPE_CHECKING, ClassVar

from servesim import codes
from servesim.backends.base import DEFAULT_TOKEN_BUDGET, Backend
from servesim.errors import Diagnostic, Path, error

if TYPE_CHECKING:
    from servesim.payload import RoleArgs


class Sglang(Backend):
    """SGLang's scheduler: prompt work and decode steps in separate passes; a prompt is
    admitted only beside a share of the running requests' remaining output
    (``new_token_ratio``); a decode step that does not fit retracts the request with the
    least output; single-token pages; ``chunked_prefill_size`` split over attention-DP
    ranks; the decode worker reserves its blocks before the prefill runs."""

    NAME = "sglang"
    perf_backend = "sglang"
    LABEL = "SGLang"
    DESCRIPTION = "SGLang: separate prefill passes, new_token_ratio admission, retraction"
    default_block_size = 1
    min_block_size = 1
    default_memory_fraction = 0.88
    new_token_ratio = True
    separate_prefill = True
    standalone_prefill_pricing = True
    destination_first = True
    scheduler_fields: ClassVar[frozenset[str]] = frozenset({"prefill_decode_interval"})
    chunked_prefill_optional = False
    token_budget_note = "SGLang chunked_prefill_size 8192 / attention_data"

    def default_token_budget(self, attention_data: int) -> int:
        return max(1, DEFAULT_TOKEN_BUDGET // attention_data)

    def kv_budget(self, *, capacity: int, fraction: Fraction, memory_fraction: float,
                  weights: int, activations: int, runtime_overhead: int, comm_overhead: int,
                  cuda_graph: int) -> tuple[int, str]:
        """``(capacity - resident) x fraction - weights - cuda_graph``, ``resident`` the
        runtime and communication overheads; activations are not deducted."""
        resident = runtime_overhead + comm_overhead
        kv = math.floor((capacity - resident) * fraction) - weights - cuda_graph
        return kv, (f"kv_bytes {kv} = ({capacity} - resident {resident}) x {memory_fraction}"
                    f" - weights {weights} - cuda_graph {cuda_graph}")

    def own_rules(self, r: RoleArgs, path: Path) -> Iterator[Diagnostic]:
        if r.prefill_decode_interval != 0:
            # It spaces SGLang's prefill passes, which the replay runs whenever there is
            # prompt work: refused rather than silently ignored.
            yield error(
                codes.NOT_SUPPORTED, (*path, "scheduler", "prefill_decode_interval"),
                "prefill_decode_interval is not supported yet: the replay runs SGLang's "
                "prefill passes whenever there is prompt work",
                "remove it (0, the default, is supported)")
