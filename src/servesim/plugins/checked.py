"""What a third-party engine hands back, checked before servesim uses it.

An engine's ``validate_payload`` must return diagnostics; its ``replay`` a
:class:`~servesim.engines.base.ReplayResult` of finite numbers and JSON values; its sink
must receive one :class:`~servesim.engines.kernel.requests.RequestRecord` with finite
times for each request the workload handed it, and none for any other. Anything else is
a :class:`~servesim.plugins.manager.PluginError` naming the plugin and the hook, never a
traceback, a report with ``NaN`` in it, or requests counted twice or not at all.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from servesim.engines.base import ReplayResult, Sink
from servesim.engines.kernel.requests import RequestRecord, RequestSpec, Workload
from servesim.errors import Diagnostic
from servesim.plugins.manager import PluginSource, plugin_bug, reported_as

STATUSES = ("completed", "rejected", "incomplete")


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def diagnostics(source: PluginSource, hook: str, value: Any) -> list[Diagnostic]:
    """``value``, the return of ``hook``, as a list of diagnostics."""
    with reported_as(source, hook):
        items = list(value) if isinstance(value, list | tuple) else None
    if items is None or not all(isinstance(d, Diagnostic) for d in items):
        raise plugin_bug(source, f"{hook} returned {_shown(value)}; it returns a list of "
                         "servesim.errors.Diagnostic (empty when the payload is accepted)")
    return items


def result(source: PluginSource, hook: str, value: Any) -> ReplayResult:
    """``value``, the return of ``hook``, as a ReplayResult of plain, finite values."""
    if not isinstance(value, ReplayResult):
        raise plugin_bug(source, f"{hook} returned {_shown(value)}; it returns a "
                         "servesim.engines.base.ReplayResult")
    with reported_as(source, f"{hook} result"):
        gpu = dict(value.gpu_seconds) if isinstance(value.gpu_seconds, Mapping) else None
        extra = dict(value.extra) if isinstance(value.extra, Mapping) else None
    if gpu is None or not all(isinstance(k, str) and _finite(v) and v >= 0
                              for k, v in gpu.items()):
        raise plugin_bug(source, f"{hook} returned gpu_seconds {_shown(value.gpu_seconds)}; "
                         "it is a mapping of role name to a finite number >= 0")
    if not _finite(value.end_ms):
        raise plugin_bug(source, f"{hook} returned end_ms {_shown(value.end_ms)}; it is a "
                         "finite number of ms")
    try:
        extra = json.loads(json.dumps(extra, allow_nan=False, sort_keys=True))
    except (TypeError, ValueError, RecursionError) as exc:
        raise plugin_bug(source, f"{hook} returned extra {_shown(value.extra)}, which is no "
                         f"JSON object of finite values ({exc})") from None
    if not isinstance(extra, dict):
        raise plugin_bug(source, f"{hook} returned extra {_shown(value.extra)}; it is a "
                         "mapping of report key to JSON value")
    return ReplayResult(end_ms=float(value.end_ms), gpu_seconds={k: float(v) for k, v in
                                                                 gpu.items()},
                        passes=value.passes, extra=extra)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and \
        math.isfinite(value)


class Ledger:
    """The requests a plugin engine was handed, and the records it sent for them."""

    def __init__(self, source: PluginSource, hook: str, sink: Sink) -> None:
        self.source, self.hook, self._sink = source, hook, sink
        self.handed: set[int] = set()
        self.recorded: set[int] = set()

    def workload(self, workload: Workload) -> Workload:
        return _CountedWorkload(workload, self.handed)

    def sink(self, record: Any) -> None:
        problem = self._problem(record)
        if problem:
            raise plugin_bug(self.source, f"{self.hook} sent {problem}")
        self.recorded.add(record.request_id)
        self._sink(record)

    def _problem(self, record: Any) -> str | None:
        if not isinstance(record, RequestRecord):
            return f"{_shown(record)} to the sink; it takes a RequestRecord per request"
        rid = record.request_id
        if rid in self.recorded:
            return f"a second record of request {rid}; each request has one"
        if rid not in self.handed:
            return f"a record of request {_shown(rid)}, which the workload never handed it"
        if record.status not in STATUSES:
            return f"request {rid} with status {_shown(record.status)}; it is one of " \
                f"{', '.join(STATUSES)}"
        times = [record.arrival_ms, *(t for t in (record.first_admit_ms, record.terminal_ms)
                                      if t is not None)]
        try:
            times += list(record.token_times)
        except Exception:
            return f"request {rid} with token_times {_shown(record.token_times)}"
        if not all(_finite(t) for t in times):
            return f"request {rid} with a time that is no finite number of ms"
        return None

    def check_complete(self) -> None:
        """Every request handed out has its record."""
        missing = sorted(self.handed - self.recorded)
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise plugin_bug(self.source, f"{self.hook} returned without a record of "
                             f"{len(missing)} request(s) it was handed ({shown}); each "
                             "request ends with one record (status incomplete when unfinished)")


class _CountedWorkload:
    """A workload that notes the id of every request it hands out."""

    def __init__(self, workload: Workload, handed: set[int]) -> None:
        self._workload, self._handed = workload, handed

    @property
    def max_time_ms(self) -> float | None:
        return self._workload.max_time_ms

    def start(self) -> Iterator[RequestSpec]:
        for spec in self._workload.start():
            self._handed.add(spec.request_id)
            yield spec

    def on_terminal(self, request: RequestSpec, time_ms: float) -> list[RequestSpec]:
        specs = self._workload.on_terminal(request, time_ms)
        self._handed.update(spec.request_id for spec in specs)
        return specs

    def __getattr__(self, name: str) -> Any:  # anything else a workload offers
        return getattr(self._workload, name)
