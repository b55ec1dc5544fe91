"""``timing.type = "measured"``: pass prices from measured kernel tables.

The `aiconfigurator-core` package (Apache-2.0, an optional extra:
``pip install 'servesim[measured]'``) ships per-GPU, per-framework tables of measured
kernels (GEMMs, attention, MoE, collectives) for A100, H100, H200, B200, GB200, B300,
GB300 and L40S, and composes them into the latency of one forward pass of a model at a
given parallelism and precision. This provider asks it once per role for a grid of pass
latencies and interpolates in the grid during the replay:

- decode passes over ``(batch, mean context)``;
- prefill passes over ``(batch, new tokens per request, cached prefix per request)``.

A query through the package costs tens of microseconds and loads its tables on first use,
so the grid is computed once per role shape and cached on disk (``SERVESIM_CACHE_DIR``,
else the user's cache folder), keyed by everything that changes a price: the package's
version, the model, GPU, backend and its version, the precisions, the parallelism, the
speculative tokens and the grid's axes.

How a pass is split between the two halves of the timer protocol follows the default
timing (:mod:`servesim.timing.analytical`): where prompt work shares a forward with
decode steps (vLLM and TensorRT-LLM aggregated workers), ``decode_ms`` is the whole
forward and ``prefill_ms`` what the prompt tokens add to it, i.e. the prefill forward less
a one-request decode step (weights read and per-pass overhead, which the decode half
already pays); on prefill workers and SGLang, a prefill pass is a forward of its own. The
front end's latency per request is the default timing's. The tables price no drafting:
MTP's draft layers and the verification of ``1 + drafts`` tokens per request are priced as
the package prices them (``nextn``).

Where the tables do not cover a role (a model, GPU, backend, precision or parallelism
the package has no data for), the role is priced by the default timing, and
:attr:`MeasuredTimer.fallback` says what was not covered; ``servesim validate`` and
``servesim replay`` print it as a warning, and the report's ``timing`` names the source
of each role's prices.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from servesim import backends, codes
from servesim.backends import Backend
from servesim.catalog import load_gpu, load_model
from servesim.errors import Diagnostic, ReplayError
from servesim.files import MiB, Unreadable, read_bounded
from servesim.payload import RoleArgs
from servesim.timing.analytical import AnalyticalTimer, timer_from_role

__all__ = ["EXTRA", "MeasuredGrid", "MeasuredTimer", "measured_notes", "measured_timer"]

PACKAGE = "aiconfigurator-core"
EXTRA = "pip install 'servesim[measured]'"
GRID_VERSION = 1  # bump when the axes or the composition change

# servesim's weight precision names -> the package's GEMM and MoE quantisation modes
_GEMM_MODES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8", "fp8_block": "fp8_block",
               "int8": "int8_wo", "w8a16": "int8_wo", "int4": "int4_wo", "int4_wo": "int4_wo",
               "w4a16": "int4_wo", "nvfp4": "nvfp4", "fp4": "nvfp4"}
_MOE_MODES = {**_GEMM_MODES, "mxfp4": "w4a16_mxfp4"}


def _moe_mode(role: RoleArgs, policy: Backend) -> str | None:
    """The tables' MoE mode for the role's expert weights (None: the package reads the
    checkpoint's). MXFP4 experts (gpt-oss's checkpoint) run with MXFP8 activations where
    the backend does so on the GPU (:attr:`Backend.mxfp4_moe_fp8_activations`: a GPU whose
    tensor cores take FP4), else with BF16 activations, as the package reads them."""
    quant = role.timing.moe_quant or load_model(role.model).weight_quant
    if (quant == "mxfp4" and policy.mxfp4_moe_fp8_activations
            and load_gpu(role.hardware).fp4_flops):
        return "w4a8_mxfp4_mxfp8"
    return _MOE_MODES.get(role.timing.moe_quant or "")


def _powers(top: int, *, start: int = 1) -> tuple[int, ...]:
    """1 (or ``start``), 2, 4, ... up to the first power of two at or above ``top``."""
    out = [start]
    while out[-1] < top:
        out.append(out[-1] * 2)
    return tuple(out)


@attrs.frozen
class Axes:
    """The grid's sample points, from the role's limits."""

    batch: tuple[int, ...]
    context: tuple[int, ...]
    new_tokens: tuple[int, ...]
    prefix: tuple[int, ...]

    @classmethod
    def for_role(cls, role: RoleArgs) -> Axes:
        longest = role.max_model_len or 131_072
        per_pass = role.max_batched_tokens if role.enable_chunked_prefill else longest
        return cls(batch=_powers(role.max_sequences),
                   context=_powers(longest),
                   new_tokens=_powers(min(per_pass, longest)),
                   prefix=(0, *_powers(longest, start=64)))


@attrs.frozen
class MeasuredGrid:
    """Pass latencies (ms) on :class:`Axes`, row-major, and where they came from."""

    source: str
    axes: Axes
    decode: tuple[float, ...]  # [batch][context]
    prefill: tuple[float, ...]  # [batch][new_tokens][prefix]
    floor_ms: float  # a decode step of one request over one token

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MeasuredGrid:
        axes = Axes(**{k: tuple(v) for k, v in data["axes"].items()})
        return cls(source=str(data["source"]), axes=axes,
                   decode=tuple(float(x) for x in data["decode"]),
                   prefill=tuple(float(x) for x in data["prefill"]),
                   floor_ms=float(data["floor_ms"]))


# ---------------------------------------------------------------------------------------------
# Interpolation


def _cell(axis: Sequence[float], x: float) -> tuple[int, float]:
    """Lower index and the upper neighbour's weight of ``x`` on ``axis`` (clamped)."""
    if len(axis) == 1 or x <= axis[0]:
        return 0, 0.0
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    i = bisect.bisect_right(axis, x) - 1
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def _lerp(values: Sequence[float], axes: Sequence[Sequence[float]],
          point: Sequence[float]) -> float:
    """Multilinear interpolation of row-major ``values`` on ``axes`` at ``point``."""
    cells = [_cell(a, x) for a, x in zip(axes, point, strict=True)]
    total = 0.0
    for corner in range(1 << len(axes)):
        weight, index = 1.0, 0
        for d, (axis, (i, t)) in enumerate(zip(axes, cells, strict=True)):
            up = (corner >> d) & 1
            if up and len(axis) == 1:
                weight = 0.0
                break
            weight *= t if up else 1.0 - t
            index = index * len(axis) + i + up
        if weight:
            total += weight * values[index]
    return total


def _log(axis: Sequence[int]) -> tuple[float, ...]:
    return tuple(math.log2(1.0 + x) for x in axis)


class MeasuredTimer:
    """Prices passes of one role from a :class:`MeasuredGrid`, or with the default timing
    where the tables do not cover the role (``fallback`` then says why)."""

    def __init__(self, grid: MeasuredGrid | None, analytical: AnalyticalTimer,
                 *, standalone: bool, fallback: Diagnostic | None = None) -> None:
        self.grid = grid
        self.analytical = analytical
        self.fallback = fallback
        self.standalone = standalone
        self.source = grid.source if grid is not None else "default timing (fallback)"
        if grid is not None:
            a = grid.axes
            self._decode_axes = (_log(a.batch), _log(a.context))
            self._prefill_axes = (_log(a.batch), _log(a.new_tokens), _log(a.prefix))

    def request_ms(self, input_tokens: float) -> float:
        return self.analytical.request_ms(input_tokens)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        if self.grid is None:
            return self.analytical.prefill_ms(batch, mean_isl, mean_prefix)
        new = mean_isl - mean_prefix
        if batch <= 0 or new <= 0:
            return 0.0
        point = (math.log2(1.0 + batch), math.log2(1.0 + new),
                 math.log2(1.0 + max(mean_prefix, 0.0)))
        forward = _lerp(self.grid.prefill, self._prefill_axes, point)
        if self.standalone:
            return forward
        return max(0.0, forward - self.grid.floor_ms)

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        if self.grid is None:
            return self.analytical.prefill_group_ms(batch, mean_isl, mean_prefix, group_tokens)
        return self.prefill_ms(batch, mean_isl, mean_prefix)

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        if self.grid is None:
            return self.analytical.decode_ms(batch, active_kv_tokens, mean_context,
                                             total_kv_tokens)
        if batch <= 0:
            return 0.0
        point = (math.log2(1.0 + batch), math.log2(1.0 + max(mean_context, 1.0)))
        return _lerp(self.grid.decode, self._decode_axes, point)


# ---------------------------------------------------------------------------------------------
# Building a grid with the package


class NotCovered(Exception):
    """The package has no data for some part of a role; the message says which."""


Engine = Any  # aiconfigurator_core.AicEngine


def _package_version() -> str:
    from importlib import metadata  # (on first use, as logging below: a replay seldom needs them)

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "unknown"


def _engine(role: RoleArgs, policy: Backend) -> tuple[Engine, str]:
    """The package's compiled engine of ``role`` (priced as ``policy.perf_backend``'s) and
    the backend version it resolved."""
    import aiconfigurator_core
    from aiconfigurator_core.sdk.engine import compile_engine

    t = role.timing
    spec = role.speculation
    try:
        blob = compile_engine(
            role.model, role.hardware, policy.perf_backend,
            t.backend_version,
            tp_size=role.tensor, pp_size=role.pipeline, attention_dp_size=role.attention_data,
            moe_tp_size=role.moe_tensor, moe_ep_size=role.moe_expert,
            gemm_quant_mode=_GEMM_MODES.get(t.gemm_quant or ""),
            moe_quant_mode=_moe_mode(role, policy),
            kvcache_quant_mode=t.kv_quant,
            nextn=spec.num_speculative_tokens if spec is not None else 0)
        engine = aiconfigurator_core.AicEngine.from_spec(bytes(blob))
    except Exception as exc:  # the package raises many kinds for what it does not know
        raise NotCovered(_first_line(exc)) from None
    version = t.backend_version or "current"
    return engine, version


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def _query(fn: Callable[..., float], *args: int) -> float:
    try:
        value = float(fn(*args))
    except Exception as exc:
        raise NotCovered(_first_line(exc)) from None
    if not math.isfinite(value) or value < 0:
        raise NotCovered(f"the tables give {value} ms for {fn.__name__}{args}")
    return value


@contextmanager
def _quiet() -> Iterator[None]:
    """The package logs which of its tables it loads; servesim's output stays its own."""
    import logging

    log = logging.getLogger("aiconfigurator_core")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def build_grid(role: RoleArgs, axes: Axes, policy: Backend) -> MeasuredGrid:
    """Ask the package for every point of ``axes`` (:class:`NotCovered` on a gap)."""
    with _quiet():
        engine, version = _engine(role, policy)
        decode = tuple(_query(engine.predict_decode_latency, b, c, 2)
                       for b in axes.batch for c in axes.context)
        prefill = tuple(_query(engine.predict_prefill_latency, b, p + n, p)
                        for b in axes.batch for n in axes.new_tokens for p in axes.prefix)
        floor = _query(engine.predict_decode_latency, 1, 1, 2)
    source = (f"{PACKAGE} {_package_version()}: {role.backend} {version} on {role.hardware}")
    return MeasuredGrid(source=source, axes=axes, decode=decode, prefill=prefill,
                        floor_ms=floor)


def grid_key(role: RoleArgs, axes: Axes, policy: Backend) -> str:
    """What a grid depends on (priced by ``policy``), hashed: the cache file's name."""
    t = role.timing
    spec = role.speculation
    parts = {
        "grid": GRID_VERSION, "package": _package_version(), "model": role.model,
        "hardware": role.hardware, "backend": role.backend, "version": t.backend_version,
        "perf_backend": policy.perf_backend, "gemm": t.gemm_quant,
        "moe": _moe_mode(role, policy), "kv": t.kv_quant,
        "shape": [role.tensor, role.pipeline, role.attention_data, role.moe_tensor,
                  role.moe_expert],
        "nextn": spec.num_speculative_tokens if spec is not None else 0,
        "axes": attrs.asdict(axes),
    }
    text = json.dumps(parts, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cache_dir() -> Path:
    """``SERVESIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/servesim``, else ``~/.cache/servesim``."""
    explicit = os.environ.get("SERVESIM_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servesim"


def _read_cached(path: Path) -> MeasuredGrid | None:
    try:
        data = read_bounded(path, "a cached table", 64 * MiB)  # a regular file, bounded
        return MeasuredGrid.from_json(json.loads(data.decode("utf-8")))
    except (Unreadable, ValueError, KeyError, TypeError, RecursionError):
        return None  # a damaged or foreign file: computed again and replaced


def _write_cached(path: Path, grid: MeasuredGrid) -> None:
    """Write ``grid`` atomically; a cache that cannot be written is only slower."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(grid.to_json(), sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass


_GRIDS: dict[str, MeasuredGrid | NotCovered] = {}  # per process: one build per role shape


def grid_for(role: RoleArgs, backend: Backend | None = None) -> MeasuredGrid:
    """The role's grid: from this process's memory, the disk cache, or the package."""
    axes = Axes.for_role(role)
    policy = backend or backends.policy_of(role.backend)
    key = grid_key(role, axes, policy)
    known = _GRIDS.get(key)
    if isinstance(known, NotCovered):
        raise known
    if known is not None:
        return known
    path = cache_dir() / f"measured-{key}.json"
    grid = _read_cached(path)
    if grid is None or grid.axes != axes:
        try:
            grid = build_grid(role, axes, policy)
        except NotCovered as exc:
            _GRIDS[key] = exc
            raise
        _write_cached(path, grid)
    _GRIDS[key] = grid
    return grid


def _missing_extra(role: RoleArgs) -> ReplayError:
    return ReplayError([Diagnostic(
        code=codes.TIMING_UNAVAILABLE,
        path=("engine", "workers", role.worker_type, "timing", "type"),
        message=f"measured timing needs the optional package {PACKAGE}, which is not "
                "installed",
        hint=f"{EXTRA}, or use timing.type = \"default\"")])


def measured_timer(role: RoleArgs, backend: Backend | None = None) -> MeasuredTimer:
    """The measured timer of ``role``, whose backend's policy is ``backend`` (by default the
    built-in of its name; see the module docstring)."""
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        raise _missing_extra(role) from None
    policy = backend or backends.policy_of(role.backend)
    analytical = timer_from_role(role, backend=policy)
    standalone = role.worker_type == "prefill" or policy.standalone_prefill_pricing
    try:
        grid = grid_for(role, policy)
    except NotCovered as exc:
        note = Diagnostic(
            code=codes.TIMING_FALLBACK, severity="warning",
            path=("engine", "workers", role.worker_type, "timing", "type"),
            message=f"the measured kernel tables do not cover this role ({exc}); it is "
                    "priced by the default timing",
            hint="check the model, GPU, backend, backend_version and precisions against "
                 f"what {PACKAGE} covers")
        return MeasuredTimer(None, analytical, standalone=standalone, fallback=note)
    return MeasuredTimer(grid, analytical, standalone=standalone)


def measured_notes(roles: Mapping[str, RoleArgs],
                   known: Mapping[str, Backend] = backends.BUILTIN,
                   ) -> tuple[dict[str, str], list[Diagnostic]]:
    """For the roles priced by measured timing (``known``: the registered backends): where
    each one's prices come from (for the report) and the warnings of those the tables do not
    cover."""
    sources: dict[str, str] = {}
    warnings: list[Diagnostic] = []
    for name, role in sorted(roles.items()):
        if role.timing.type != "measured":
            continue
        timer = measured_timer(role, backends.policy_of(role.backend, known))
        sources[name] = timer.source
        if timer.fallback is not None:
            warnings.append(timer.fallback)
    return sources, warnings
