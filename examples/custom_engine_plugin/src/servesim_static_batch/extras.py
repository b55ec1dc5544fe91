"""A timing provider and a trace format, to show the other two plugin hooks.

- ``timing.type = "linear"``: step times linear in the tokens a pass touches.
- ``traffic.source.format = "csv"``: ``arrival_ms,input_tokens,output_tokens`` rows.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator

import attrs

from servesim.engines.base import option
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import Segment, make_prompt
from servesim.errors import Diagnostic, WorkloadError
from servesim.payload import RoleArgs
from servesim.timing import StepTimer, with_options
from servesim.workloads.formats import TraceFile


@attrs.frozen
class LinearOptions:
    """Options of the ``linear`` timing type (``[engine.workers.<role>.timing.options]``)."""

    prefill_base_ms: float = option(5.0, lo=0.0, hi=1e6, help="fixed cost of a prefill pass")
    prefill_ms_per_token: float = option(0.02, lo=0.0, hi=1e3,
                                         help="cost of each computed prompt token")
    decode_base_ms: float = option(4.0, lo=0.0, hi=1e6, help="fixed cost of a decode pass")
    decode_ms_per_kv_token: float = option(1e-4, lo=0.0, hi=1e3,
                                           help="cost of each KV token a decode pass reads")


@attrs.frozen
class LinearTimer:
    """Step times linear in the tokens a pass touches, divided by the tensor-parallel width
    (an illustration, not a calibrated model)."""

    options: LinearOptions
    tensor: int = 1

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        if batch == 0:
            return 0.0
        o = self.options
        return o.prefill_base_ms + o.prefill_ms_per_token * batch * (
            mean_isl - mean_prefix) / self.tensor

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        if batch == 0:
            return 0.0
        o = self.options
        return o.decode_base_ms + o.decode_ms_per_kv_token * active_kv_tokens / self.tensor


@with_options(LinearOptions)
def linear_timer(role: RoleArgs, options: LinearOptions) -> StepTimer:
    """Step time linear in the tokens of a pass (example provider with options)."""
    return LinearTimer(options=options, tensor=role.tensor)


def read_csv(trace: TraceFile) -> Iterator[RequestSpec]:
    """CSV rows ``arrival_ms,input_tokens,output_tokens`` (header required)."""
    with trace.path.open(newline="", encoding="utf-8") as f:
        rows = csv.DictReader(f)
        missing = {"arrival_ms", "input_tokens", "output_tokens"} - set(rows.fieldnames or ())
        if missing:
            raise WorkloadError([Diagnostic(
                code="trace-format", location=f"{trace.name}:1",
                message=f"CSV header lacks {', '.join(sorted(missing))}")])
        for index, row in enumerate(rows):
            if trace.max_requests is not None and index >= trace.max_requests:
                return
            try:
                arrival, isl, osl = (float(row["arrival_ms"]), int(row["input_tokens"]),
                                     int(row["output_tokens"]))
            except (TypeError, ValueError) as exc:
                raise WorkloadError([Diagnostic(
                    code="trace-format", location=f"{trace.name}:{index + 2}",
                    message=f"bad CSV row: {exc}")]) from None
            if isl < 1 or osl < 0 or arrival < 0:
                raise WorkloadError([Diagnostic(
                    code="trace-format", location=f"{trace.name}:{index + 2}",
                    message="need arrival_ms >= 0, input_tokens >= 1, output_tokens >= 0")])
            # every request has its own distinct prompt tokens (no shared prefix)
            prompt = make_prompt([Segment(key=index, length=isl, repeat=False)])
            yield RequestSpec(request_id=index, arrival_ms=arrival, prompt=prompt,
                              input_length=isl, output_length=osl)
