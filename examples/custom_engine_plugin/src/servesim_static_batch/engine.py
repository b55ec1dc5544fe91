"""The static-batch engine: its options, its payload checks and its replay entry point."""

from __future__ import annotations

import attrs

from servesim.engines.base import Engine, Progress, ReplayResult, Sink, option
from servesim.engines.kernel.requests import Workload
from servesim.errors import Diagnostic
from servesim.payload import Payload
from servesim_static_batch.batching import StaticBatchReplay


@attrs.frozen
class StaticBatchOptions:
    """Options of the static-batch engine (``[engine.options]``)."""

    max_batch_size: int | None = option(
        None, lo=1, hi=2**20,
        help="requests per batch (default: the role's scheduler.max_sequences)")
    max_wait_ms: float = option(
        0.0, lo=0.0, hi=1e9,
        help="an idle worker waits up to this long for a full batch (0: start at once)")
    pad_to_longest: bool = option(
        True, help="finished requests stay in the batch as padding until it ends")


class StaticBatchEngine(Engine):
    """Static batching: fixed batches, whole-sequence KV reservation, no joins in flight."""

    NAME = "static-batch"
    DESCRIPTION = "static batching: a batch runs to its longest output before the next starts"
    Options = StaticBatchOptions

    def validate_payload(self, payload: Payload) -> list[Diagnostic]:
        out = super().validate_payload(payload)
        for name, role in payload.roles.items():
            path = ("engine", "workers", name)
            if role.attention_data != 1:
                out.append(Diagnostic(code="static-batch-attention-dp", message="static-batch "
                                      "runs one scheduler per worker; attention_data must be 1, "
                                      f"got {role.attention_data}",
                                      path=(*path, "parallelism", "attention_data")))
            if role.speculation is not None or role.state_cache is not None:
                what = "speculative decoding" if role.speculation else "a state cache"
                out.append(Diagnostic(code="static-batch-feature", path=path,
                                      message=f"static-batch does not model {what}"))
        return out

    def replay(self, payload: Payload, workload: Workload, sink: Sink, *,
               progress: Progress | None = None) -> ReplayResult:
        role = payload.roles["aggregated"]
        run = StaticBatchReplay(role, self.options(payload), self.timer(role), workload, sink,
                                progress)
        run.run_loop()
        mean = run.batched / run.batches if run.batches else 0.0
        return run.result({"aggregated": run.now / 1000.0 * role.gpus},
                          {"static_batch": {"batches": run.batches, "mean_batch_size": mean}})
