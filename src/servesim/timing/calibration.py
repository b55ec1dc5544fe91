"""Calibration files: the corrections ``servesim calibrate`` fits, and the timer that
applies them.

A calibration file is a small JSON document (``format = "servesim-calibration"``,
``version`` 1) with, per worker role, the timing type it was fitted against and the fitted
values (:class:`servesim.payload.CalibrationArgs`), and its provenance: the servesim
version, the config and measurement files (name and SHA-256), and the fit's errors. A
role's ``timing = { type = "default", calibration = "calibrated.json" }`` reads the
role's entry when the config compiles; the values travel in the payload, so a replay
does not read the file again.

:class:`CalibratedTimer` wraps any step timer: ``prefill_ms`` (and ``prefill_group_ms``)
times ``prefill_scale``; ``decode_ms`` times ``decode_scale`` plus ``decode_step_ms``;
``request_ms`` plus ``front_end_ms`` and ``front_end_ms_per_1k_tokens`` per 1,000 prompt
tokens. Each result is clamped at 0 (a negative fitted offset shortens, never reverses,
time).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from servesim import codes
from servesim.errors import Diagnostic
from servesim.payload import CalibrationArgs
from servesim.timing.base import StepTimer, prefill_group_ms

FORMAT = "servesim-calibration"
VERSION = 1
MAX_BYTES = 1 << 20  # a calibration file is a few kB; this bounds an endless device
VALUE_FIELDS: tuple[str, ...] = tuple(
    f.name for f in attrs.fields(CalibrationArgs) if f.name not in ("file", "sha256"))


class CalibrationFileError(Exception):
    """The calibration file cannot be used; ``diagnostic`` says why."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        self.diagnostic = diagnostic
        super().__init__(diagnostic.render())


def _problem(message: str, hint: str | None = None) -> CalibrationFileError:
    return CalibrationFileError(Diagnostic(code=codes.TIMING_CALIBRATION, message=message,
                                           hint=hint))


_REFIT = "rerun servesim calibrate to write it again"


def read_calibration(path: Path, role: str, timing_type: str) -> CalibrationArgs:
    """The values the calibration file at ``path`` holds for ``role``, fitted against
    ``timing_type`` timing; a :class:`CalibrationFileError` naming what is wrong."""
    data, digest = _load(path)
    if data.get("format") != FORMAT:
        raise _problem(f"{path.name} is not a servesim calibration file (its \"format\" is "
                       f"{data.get('format')!r:.40}, expected {FORMAT!r})",
                       "give the file servesim calibrate -o wrote")
    version = data.get("version")
    if version != VERSION or isinstance(version, bool):
        raise _problem(f"{path.name} has calibration format version {version!r:.20}; this "
                       f"servesim reads version {VERSION}", _REFIT)
    roles = data.get("roles")
    if not isinstance(roles, dict) or not roles:
        raise _problem(f"{path.name} has no \"roles\" object with fitted values", _REFIT)
    entry = roles.get(role)
    if entry is None:
        raise _problem(f"{path.name} holds no values for the {role!r} role (it has: "
                       f"{', '.join(sorted(map(str, roles)))})",
                       "calibrate with a config that has this role, or name the file only "
                       "in the roles it was fitted for")
    where = f"{path.name}: roles.{role}"
    if not isinstance(entry, dict):
        raise _problem(f"{where} must be an object")
    fitted_for = entry.get("timing_type")
    if fitted_for != timing_type:
        raise _problem(f"{where} was fitted for {fitted_for!r:.40} timing, but this role uses "
                       f"{timing_type!r} timing: its corrections would apply to another "
                       "model", f"set timing.type = {fitted_for!r} or recalibrate")
    values = entry.get("values")
    if not isinstance(values, dict):
        raise _problem(f"{where}.values must be an object of fitted values", _REFIT)
    unknown = sorted(set(values) - set(VALUE_FIELDS))
    if unknown:
        raise _problem(f"{where}.values has unknown key {unknown[0]!r:.40}; expected some of "
                       + ", ".join(VALUE_FIELDS), _REFIT)
    out: dict[str, float] = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value):
            raise _problem(f"{where}.values.{key} must be a finite number, got {value!r:.40}",
                           _REFIT)
        out[key] = float(value)
    args = CalibrationArgs(**out, file=path.name, sha256=digest)
    from servesim.converter import check_limits

    bad = check_limits(args)
    if bad:
        raise _problem(f"{where}.values.{bad[0].path[-1]} {bad[0].message}", _REFIT)
    return args


def _load(path: Path) -> tuple[dict[str, Any], str]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise _problem(f"calibration file {str(path)!r} not found",
                       "the path is relative to the config's folder") from None
    except OSError as exc:
        raise _problem(f"cannot read calibration file {str(path)!r}: "
                       f"{exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise _problem(f"{path.name} is over {MAX_BYTES} bytes; a calibration file is a few "
                       "kB", "give the file servesim calibrate -o wrote")
    if not raw.strip():
        raise _problem(f"{path.name} is empty", _REFIT)
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise _problem(f"{path.name} is not JSON: {exc}", _REFIT) from None
    if not isinstance(data, dict):
        raise _problem(f"{path.name} must hold a JSON object", _REFIT)
    return data, hashlib.sha256(raw).hexdigest()


def describe(c: CalibrationArgs) -> str:
    """Provenance line of calibrated values: the file and the start of its hash."""
    return f"fitted by servesim calibrate, from {c.file} (sha256 {(c.sha256 or '')[:12]})"


def calibration_document(roles: Mapping[str, tuple[str, CalibrationArgs, list[str]]],
                         provenance: Mapping[str, Any]) -> dict[str, Any]:
    """A calibration file's JSON object: per role ``(timing type, values, the names of
    the values fitted)``, and the ``provenance`` (inputs, version, fit errors)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        **provenance,
        "roles": {
            name: {"timing_type": timing_type, "fitted": list(fitted),
                   "values": {k: getattr(values, k) for k in VALUE_FIELDS}}
            for name, (timing_type, values, fitted) in sorted(roles.items())},
    }


class CalibratedTimer:
    """``inner``'s step times with the corrections of ``calibration`` applied."""

    def __init__(self, inner: StepTimer, calibration: CalibrationArgs) -> None:
        self.inner = inner
        self.prefill_scale = calibration.prefill_scale
        self.decode_scale = calibration.decode_scale
        self.decode_step_ms = calibration.decode_step_ms
        self.front_end_ms = calibration.front_end_ms
        self.front_end_per_token_ms = calibration.front_end_ms_per_1k_tokens * 1e-3
        self._inner_front_end = getattr(inner, "request_ms", None)

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        return self.inner.prefill_ms(batch, mean_isl, mean_prefix) * self.prefill_scale

    def prefill_group_ms(self, batch: int, mean_isl: float, mean_prefix: float,
                         group_tokens: int) -> float:
        return prefill_group_ms(self.inner, batch, mean_isl, mean_prefix,
                                group_tokens) * self.prefill_scale

    def decode_ms(self, batch: int, active_kv_tokens: int, mean_context: float,
                  total_kv_tokens: int) -> float:
        if batch <= 0:
            return 0.0
        base = self.inner.decode_ms(batch, active_kv_tokens, mean_context, total_kv_tokens)
        return max(0.0, base * self.decode_scale + self.decode_step_ms)

    def request_ms(self, input_tokens: int) -> float:
        base = self._inner_front_end(input_tokens) if self._inner_front_end else 0.0
        return max(0.0, base + self.front_end_ms
                   + self.front_end_per_token_ms * max(input_tokens, 0))
