"""Numeric limits of config and payload values: one definition, two users.

The parsed config (:mod:`servesim.compiler.model.parsed`) and the payload
(:mod:`servesim.payload`) attach these bounds to their fields as attrs metadata, and
:func:`servesim.converter.check_limits` enforces them: the same bound holds whether a
value comes from a TOML file or a hand-written payload. The bounds keep every replay
finite (a billion replicas is a typo, not a deployment).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

U64_MAX = 2**64 - 1
BIG = 2**53  # largest integer every JSON reader represents exactly

REPLICAS = 4096
PARALLEL = 1024
SCHEDULER = 2**31
BLOCK_SIZE = 2**20
BLOCKS = 2**40
BYTES_PER_TOKEN = 2**40
STEP_MS = 1e9
SECONDS = 1e9
LATENCY_MS = 1e12  # an SLA target, a delay between turns
VIRTUAL_MS = 1e12  # the latest arrival a replay takes (31 years; times keep 0.1 ms steps)
BANDWIDTH_GB_S = (1e-9, 1e9)  # a KV-transfer link: from 1 byte/s (1e-300 overflowed time)
CONTEXT = 2**31
TOKENS = 2**24
COUNT = 2**31
CONCURRENCY = 2**20
RANKS = 2**16  # scheduler ranks of one role (replicas x attention_data): each holds state
CALIBRATION_SCALE = (0.01, 100.0)  # a fitted scale of prompt or decode work
CALIBRATION_MS = 1e6  # a fitted fixed time (per pass, per request)
GPU_HOUR_USD = 1e6  # a GPU-hour's price (above zero)


def bounded(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
            default: Any = None, metadata: Mapping[str, Any] | None = None) -> Any:
    """An attrs field with numeric bounds (``lo_open``: the lower bound is exclusive) and
    any other ``metadata``."""
    return attrs.field(default=default, metadata={**(metadata or {}), "lo": lo, "hi": hi,
                                                  "lo_open": lo_open})
