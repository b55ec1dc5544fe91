"""GPU-hour prices: the shipped table (``catalog/gpu_prices.json``, one indicative price
per catalog GPU) with the config's ``[evaluation.gpu_hour_usd]`` over it."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from importlib import resources

from servesim import codes
from servesim.catalog import gpu_names
from servesim.errors import Diagnostic

PRICE_PATH = ("evaluation", "gpu_hour_usd")
MAX_PRICE = 1e6


@functools.cache
def shipped_prices() -> dict[str, float]:
    text = resources.files("servesim.catalog").joinpath("gpu_prices.json").read_text("utf-8")
    return {k: float(v) for k, v in json.loads(text).items() if not k.startswith("_")}


def gpu_hour_prices(authored: Mapping[str, float] | None) -> dict[str, float]:
    """The price of each GPU: the shipped table, the config's own prices over it."""
    return {**shipped_prices(), **(authored or {})}


def check_prices(authored: Mapping[str, object] | None) -> list[Diagnostic]:
    """Each authored price names a catalog GPU and is a finite positive number."""
    out: list[Diagnostic] = []
    known = gpu_names()
    for gpu, price in (authored or {}).items():
        path = (*PRICE_PATH, gpu)
        if gpu not in known:
            out.append(Diagnostic(code=codes.UNKNOWN_HARDWARE, path=path,
                                  message=f"no catalog GPU is named {gpu!r}",
                                  hint=f"price one of: {', '.join(known)}"))
        elif isinstance(price, bool) or not isinstance(price, (int, float)):
            out.append(Diagnostic(code=codes.WRONG_TYPE, path=path,
                                  message=f"expected a price in USD per GPU-hour, got {price!r}"))
        elif not math.isfinite(price) or not 0 < price <= MAX_PRICE:
            out.append(Diagnostic(code=codes.OUT_OF_RANGE, path=path,
                                  message=f"expected a price in (0, {MAX_PRICE:g}] USD per "
                                  f"GPU-hour, got {price}"))
    return out
