"""KV transfers between a prefill source and a decode destination, and the links they share.

Which transfers share one link (``engine.kv_transfer.sharing``):

* ``prefill_worker`` (the default): the transfers leaving one prefill worker share its
  ``bandwidth_gb_per_second``, the worker's NIC egress, where a burst of finished prompts
  queues in real deployments;
* ``decode_worker``: the transfers arriving at one decode worker share it (its ingress);
* ``none``: every transfer has the whole bandwidth to itself, however many overlap.

A link shares its bandwidth by processor sharing
(:class:`~servesim.engines.kernel.links.SharedLink`): ``n`` transfers on it move at
``bandwidth / n`` each, so a transfer that overlaps no other takes the uncontended
``bytes / bandwidth``.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from servesim.engines.kernel.events import EventQueue
from servesim.engines.kernel.links import SharedLink, Transfer
from servesim.engines.kernel.metrics import percentile
from servesim.payload import KvTransferArgs


def transfer_tokens(kv: KvTransferArgs, prompt_tokens: int, missing_tokens: int) -> int:
    """Tokens whose KV crosses the link: the whole prompt (``full_prompt``) or only the
    tokens the destination does not already hold (``destination_missing``)."""
    return prompt_tokens if kv.timing_mode == "full_prompt" else missing_tokens


def transfer_bytes(kv: KvTransferArgs | None, prompt_tokens: int, missing_tokens: int) -> int:
    """``tokens * bytes_per_token + state_bytes``, the bytes a transfer sends; 0 without a
    link model: no ``kv_transfer``, no (or a non-positive) bandwidth, or unknown bytes per
    token. State bytes are charged once in every timing mode."""
    if kv is None:
        return 0
    bandwidth = kv.bandwidth_gb_per_second
    if bandwidth is None or not bandwidth > 0 or kv.bytes_per_token <= 0:
        return 0
    tokens = transfer_tokens(kv, prompt_tokens, missing_tokens)
    return tokens * kv.bytes_per_token + kv.state_bytes


def transfer_delay_ms(kv: KvTransferArgs | None, prompt_tokens: int,
                      missing_tokens: int) -> float:
    """The uncontended transfer time, ``bytes / bandwidth`` in milliseconds (0 without a
    link model)."""
    nbytes = transfer_bytes(kv, prompt_tokens, missing_tokens)
    if kv is None or not nbytes:
        return 0.0
    assert kv.bandwidth_gb_per_second is not None
    # bytes / (GB/s) is nanoseconds; dividing in this order keeps round inputs exact
    # (128 tokens * 1e6 B at 1 GB/s is exactly 128.0 ms, 1500 B at 1e-6 GB/s 1500.0 ms).
    return nbytes / kv.bandwidth_gb_per_second / 1e6


class KvLinks:
    """The KV links of one P/D run: each transfer's link by the sharing mode (a link is
    created when a transfer first needs it and dropped when it empties), and the run's
    transfer times."""

    def __init__(self, events: EventQueue[Any], kv: KvTransferArgs | None) -> None:
        self.events = events
        self.kv = kv
        self.busy: dict[int, SharedLink] = {}  # the links in use, by key
        self.durations = array("d")  # every transfer's time, zero-byte ones included
        self.uncontended_ms = 0.0  # their sum had each been alone on its link
        self.peak = 0  # most transfers on one link at once

    def start(self, now: float, request_id: int, ends: tuple[int, int], nbytes: int,
              on_done: Callable[[], None]) -> None:
        """Send ``nbytes`` for ``request_id`` from prefill worker ``ends[0]`` to decode
        worker ``ends[1]``; ``on_done()`` runs when they arrived (inline for zero bytes)."""
        if not nbytes:
            self.durations.append(0.0)
            on_done()
            return
        kv = self.kv
        assert kv is not None and kv.bandwidth_gb_per_second is not None
        key = self._key(kv, request_id, ends)
        link = self.busy.get(key)
        if link is None:
            link = self.busy[key] = SharedLink(self.events, kv.bandwidth_gb_per_second)

        def done(transfer: Transfer) -> None:
            self.durations.append(transfer.duration_ms)
            self.uncontended_ms += transfer.uncontended_ms
            if not link.active:
                del self.busy[key]
            on_done()

        link.start(now, request_id, nbytes, done)
        self.peak = max(self.peak, len(link.active))

    def labelled(self) -> list[tuple[str, SharedLink]]:
        """The links in use, each with what it is (for the invariant auditor)."""
        kv = self.kv
        if kv is None:
            return []
        what = {"prefill_worker": "prefill worker {}", "decode_worker": "decode worker {}",
                "none": "request {}"}[kv.sharing]
        return [(f"the KV link of {what.format(key)}", link) for key, link in self.busy.items()]

    @staticmethod
    def _key(kv: KvTransferArgs, request_id: int, ends: tuple[int, int]) -> int:
        if kv.sharing == "prefill_worker":
            return ends[0]
        if kv.sharing == "decode_worker":
            return ends[1]
        return request_id  # a link of its own

    def report(self) -> dict[str, Any]:
        """The report's transfer figures: count, mean/median/p99/max time, the mean time
        had each been alone on its link, and the most transfers one link carried at once."""
        n = len(self.durations)
        ordered = sorted(self.durations)
        return {
            "kv_transfers": n,
            "mean_kv_transfer_ms": sum(self.durations) / n if n else 0.0,
            "median_kv_transfer_ms": percentile(ordered, 50.0) if n else 0.0,
            "p99_kv_transfer_ms": percentile(ordered, 99.0) if n else 0.0,
            "max_kv_transfer_ms": ordered[-1] if n else 0.0,
            "mean_kv_transfer_uncontended_ms": self.uncontended_ms / n if n else 0.0,
            "max_concurrent_kv_transfers": self.peak,
        }
