"""GPU-hour prices and what a deployment costs.

The shipped table (``catalog/gpu_prices.json``) holds one indicative price per catalog GPU;
the config's ``[evaluation] gpu_hour_usd`` goes over it, as one number for every GPU of the
deployment or as a table by GPU. The resolve pass prices each GPU type the roles run on
(:func:`gpu_hour_price`), the payload carries those prices, and the report (and a sweep's
rows) derive the costs from them (:func:`cost_figures`); each role's GPUs are priced by its
own hardware.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

from servesim import codes
from servesim.catalog import gpu_names
from servesim.converter import check_limits
from servesim.errors import Diagnostic
from servesim.payload import GpuPriceArgs, RoleArgs

PRICE_PATH = ("evaluation", "gpu_hour_usd")
Authored = float | Mapping[str, float] | None


@functools.cache
def shipped_prices() -> dict[str, float]:
    text = resources.files("servesim.catalog").joinpath("gpu_prices.json").read_text("utf-8")
    return {k: float(v) for k, v in json.loads(text).items() if not k.startswith("_")}


def gpu_hour_price(gpu: str, authored: Authored) -> GpuPriceArgs | None:
    """The price of ``gpu``: the config's (its one number, or the GPU's entry), else the
    shipped one, else None (a GPU the catalog does not price)."""
    if isinstance(authored, (int, float)):
        return GpuPriceArgs(usd_per_hour=float(authored), source="config")
    if authored is not None and gpu in authored:
        return GpuPriceArgs(usd_per_hour=float(authored[gpu]), source="config")
    shipped = shipped_prices().get(gpu)
    return None if shipped is None else GpuPriceArgs(usd_per_hour=shipped, source="catalog")


def check_price_names(authored: Authored) -> list[Diagnostic]:
    """Each GPU of an authored price table is a catalog GPU (types and ranges are the
    parse pass's limits)."""
    if authored is None or isinstance(authored, (int, float)):
        return []
    known = gpu_names()
    return [Diagnostic(code=codes.UNKNOWN_HARDWARE, path=(*PRICE_PATH, gpu),
                       message=f"no catalog GPU is named {gpu!r}",
                       hint=f"price one of: {', '.join(known)}; or give one number for "
                       "every GPU (gpu_hour_usd = 2.5)")
            for gpu in authored if gpu not in known]


def check_prices(prices: Mapping[str, GpuPriceArgs],
                 roles: Mapping[str, RoleArgs]) -> list[Diagnostic]:
    """The rule on resolved prices (compile time and payload check): each is a finite price
    in range, for a GPU some role runs on."""
    out: list[Diagnostic] = []
    used = {role.hardware for role in roles.values()}
    for gpu, price in prices.items():
        path = (*PRICE_PATH, gpu)
        out += check_limits(price, path_of=functools.partial(_price_path, path))
        if gpu not in used:
            out.append(Diagnostic(code=codes.UNUSED_PRICE, path=path,
                                  message=f"no role runs on {gpu!r} (the roles run on "
                                  f"{', '.join(sorted(used))})",
                                  hint="price the hardware of the roles, or remove it"))
    return out


def _price_path(path: tuple[str, ...], _field: str) -> tuple[str, ...]:
    """The config key of a GPU's price, whichever field of it is out of range."""
    return path


def cost_figures(roles: Mapping[str, RoleArgs], prices: Mapping[str, GpuPriceArgs],
                 output_tok_s: float, gpu_seconds: Mapping[str, float]) -> dict[str, Any]:
    """What the deployment's GPUs deliver and cost.

    ``gpus`` (every role's replicas x GPUs per worker); output tokens/s per GPU and per
    replica of the role that emits them (aggregated or decode workers); ``usd_per_hour``
    (each role's GPUs at their hardware's price), ``usd_per_million_output_tokens`` (that
    over the output rate), ``gpu_hours_cost_usd`` (the run's GPU-hours of each role at its
    price), and per role the price used and its source. A figure that needs a price a GPU
    lacks is None.
    """
    gpus = sum(role.gpus for role in roles.values())
    emitting = roles.get("decode") or roles.get("aggregated")
    replicas = emitting.replicas if emitting is not None else 0
    priced = {name: prices.get(role.hardware) for name, role in roles.items()}
    known = {name: p.usd_per_hour for name, p in priced.items() if p is not None}
    complete = len(known) == len(roles)
    usd_per_hour = sum(roles[name].gpus * usd for name, usd in known.items()) \
        if complete else None
    cost = sum(float(gpu_seconds[name]) / 3600.0 * usd for name, usd in known.items()) \
        if complete and set(roles) <= set(gpu_seconds) else None
    return {
        "gpus": gpus,
        "output_tok_s_per_gpu": output_tok_s / gpus if gpus else 0.0,
        "output_tok_s_per_replica": output_tok_s / replicas if replicas else 0.0,
        "usd_per_hour": usd_per_hour,
        "usd_per_million_output_tokens": (usd_per_hour / (output_tok_s * 3600 / 1e6)
                                          if usd_per_hour is not None and output_tok_s
                                          else None),
        "gpu_hours_cost_usd": cost,
        "gpu_prices": {name: {"hardware": roles[name].hardware, "gpus": roles[name].gpus,
                              "usd_per_gpu_hour": p.usd_per_hour if p else None,
                              "source": p.source if p else None}
                       for name, p in priced.items()},
    }
