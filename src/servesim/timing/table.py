"""``timing.type = "table"``: measured pass latencies read from a CSV file.

The file (``timing.path``) has a header with at least the columns ``batch_size``,
``prefill_tokens``, ``kv_read_tokens`` and ``latency_ms``; one row per measured pass of
one attention-DP rank:

- prefill rows (``prefill_tokens > 0``): ``batch_size`` prompts computing
  ``prefill_tokens`` new tokens in total after ``kv_read_tokens`` cached-prefix tokens;
- decode rows (``prefill_tokens == 0``): ``batch_size`` decoding requests reading
  ``kv_read_tokens`` KV tokens in total.

Each kind must form a complete rectilinear grid (every combination of its axis values is
present once); a query is interpolated multilinearly inside the grid and refused with an
error naming the point and the measured range outside it.
"""

from __future__ import annotations

import bisect
import csv
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from servesim import codes, limits
from servesim.errors import Diagnostic, ReplayError
from servesim.files import MiB, Unreadable, read_bounded

__all__ = ["TableTimer", "load_table"]

MAX_TABLE_BYTES = 64 * MiB  # a measured grid has thousands of rows, not millions

COLUMNS = ("batch_size", "prefill_tokens", "kv_read_tokens", "latency_ms")


@attrs.frozen
class _Grid:
    """Values on the product of sorted axes, stored row-major."""

    kind: str
    names: tuple[str, ...]
    axes: tuple[tuple[float, ...], ...]
    values: tuple[float, ...]

    def __call__(self, point: Sequence[float], source: str,
                 key: tuple[str, ...] = ()) -> float:
        # locate each coordinate: (lower index, weight of the upper neighbour)
        cells: list[tuple[int, float]] = []
        for name, axis, x in zip(self.names, self.axes, point, strict=True):
            lo, hi = axis[0], axis[-1]
            if not lo <= x <= hi:
                raise ReplayError([Diagnostic(
                    code=codes.TIMING_TABLE_RANGE, path=key,
                    message=f"{self.kind} pass at {self._fmt(point)} is outside the measured "
                    f"table {source}: {name} {x:g} not in [{lo:g}, {hi:g}]",
                    hint="measure more points or use the analytical default timing")])
            if len(axis) == 1:
                cells.append((0, 0.0))
                continue
            i = min(bisect.bisect_right(axis, x) - 1, len(axis) - 2)
            cells.append((i, (x - axis[i]) / (axis[i + 1] - axis[i])))
        total = 0.0
        dims = len(self.axes)
        for corner in range(1 << dims):
            weight = 1.0
            index = 0
            for d in range(dims):
                i, t = cells[d]
                up = (corner >> d) & 1
                if up and len(self.axes[d]) == 1:
                    weight = 0.0
                    break
                weight *= t if up else 1.0 - t
                index = index * len(self.axes[d]) + i + up
            if weight:
                total += weight * self.values[index]
        return total

    def _fmt(self, point: Sequence[float]) -> str:
        return "(" + ", ".join(f"{n}={x:g}" for n, x in zip(self.names, point, strict=True)) + ")"


def _grid(kind: str, names: tuple[str, ...], rows: dict[tuple[float, ...], tuple[float, int]],
          source: str) -> _Grid | None:
    if not rows:
        return None
    axes = tuple(tuple(sorted({key[d] for key in rows})) for d in range(len(names)))
    values: list[float] = []

    def walk(prefix: tuple[float, ...]) -> None:
        d = len(prefix)
        if d == len(axes):
            if prefix not in rows:
                missing = ", ".join(f"{n}={x:g}" for n, x in zip(names, prefix, strict=True))
                raise ReplayError([Diagnostic(
                    code=codes.TIMING_TABLE_GRID, location=source,
                    message=f"{kind} rows do not form a complete grid: no row for ({missing})",
                    hint="measure every combination of the axis values")])
            values.append(rows[prefix][0])
            return
        for x in axes[d]:
            walk((*prefix, x))

    walk(())
    return _Grid(kind=kind, names=names, axes=axes, values=tuple(values))


def _bad(location: str, message: str) -> ReplayError:
    return ReplayError([Diagnostic(code=codes.TIMING_TABLE_INVALID, location=location,
                                   message=message)])


def _csv_rows(text: str, source: str) -> Iterator[tuple[int, list[str]]]:
    """``(line number, cells)`` of each CSV row; a row the csv module refuses (a cell over
    its field limit, an unclosed quote) is a table error at its line."""
    reader = csv.reader(text.splitlines())  # one row per line: line_num is the line
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise _bad(f"{source}:{reader.line_num}", f"not a CSV row: {exc}") from None
        yield reader.line_num, row


def load_table(path: str | Path, *, display: str | None = None) -> tuple[_Grid | None,
                                                                          _Grid | None]:
    """Parse and check a latency table; ``(prefill grid, decode grid)``."""
    source = display or str(path)
    try:
        text = read_bounded(path, "a timing table (CSV)", MAX_TABLE_BYTES).decode("utf-8-sig")
    except Unreadable as exc:
        raise _bad(source, f"cannot read the timing table: {exc.message}") from None
    except UnicodeDecodeError as exc:
        raise _bad(source, f"cannot read the timing table: not UTF-8 text (byte {exc.start})"
                   ) from None
    rows = _csv_rows(text, source)
    header = next(rows, (1, None))[1]
    if header is None:
        raise _bad(f"{source}:1", "empty timing table (expected a header "
                   + ",".join(COLUMNS) + ")")
    header = [h.strip() for h in header]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise _bad(f"{source}:1", f"header lacks column(s) {', '.join(missing)}; expected "
                   + ",".join(COLUMNS))
    idx = [header.index(c) for c in COLUMNS]
    prefill: dict[tuple[float, ...], tuple[float, int]] = {}
    decode: dict[tuple[float, ...], tuple[float, int]] = {}
    for line_no, row in rows:
        if not row or all(not cell.strip() for cell in row):
            continue
        where = f"{source}:{line_no}"
        if len(row) != len(header):
            raise _bad(where, f"expected {len(header)} fields, got {len(row)}")
        values: list[float] = []
        for name, i in zip(COLUMNS, idx, strict=True):
            cell = row[i].strip()
            try:
                value = float(cell)
            except ValueError:
                raise _bad(where, f"{name} {cell!r} is not a number") from None
            if not math.isfinite(value) or value < 0:
                raise _bad(where, f"{name} must be a finite number >= 0, got {cell}")
            values.append(value)
        batch, new, kv, latency = values
        if latency > limits.STEP_MS:
            raise _bad(where, f"latency_ms must be at most {limits.STEP_MS:g} (as a fixed step "
                       f"time), got {row[idx[3]].strip()}")
        if batch < 1 or not batch.is_integer():
            raise _bad(where, f"batch_size must be a positive integer, got {row[idx[0]]}")
        if not new.is_integer() or not kv.is_integer():
            raise _bad(where, "prefill_tokens and kv_read_tokens must be integers")
        key: tuple[float, ...]
        if new > 0:
            target, key = prefill, (batch, new, kv)
        else:
            target, key = decode, (batch, kv)
        if key in target:
            raise _bad(where, f"duplicate point {key} (first on line {target[key][1]})")
        target[key] = (latency, line_no)
    pre = _grid("prefill", ("batch_size", "prefill_tokens", "kv_read_tokens"), prefill, source)
    dec = _grid("decode", ("batch_size", "kv_read_tokens"), decode, source)
    if pre is None and dec is None:
        raise _bad(source, "the timing table has no data rows")
    return pre, dec


class TableTimer:
    """Interpolates a measured latency table (see the module docstring)."""

    __slots__ = ("_decode", "_prefill", "key", "source")

    def __init__(self, path: str | Path, *, display: str | None = None,
                 key: tuple[str, ...] = ()) -> None:
        self.source = display or str(path)
        self.key = key  # the config key naming the table: where its range errors point
        self._prefill, self._decode = load_table(path, display=display)

    def missing(self, kinds: Sequence[str]) -> list[str]:
        """Which of ``kinds`` ("prefill", "decode") the table has no rows of."""
        grids = {"prefill": self._prefill, "decode": self._decode}
        return [kind for kind in kinds if grids[kind] is None]

    def prefill_ms(self, batch: int, mean_isl: float, mean_prefix: float) -> float:
        new = mean_isl - mean_prefix
        if batch <= 0 or new <= 0:
            return 0.0
        point = (float(batch), float(batch) * new, float(batch) * mean_prefix)
        if self._prefill is None:
            raise self._no_rows("prefill", point)
        return self._prefill(point, self.source, self.key)

    def decode_ms(
        self, batch: int, active_kv_tokens: int, mean_context: float, total_kv_tokens: int
    ) -> float:
        if batch <= 0:
            return 0.0
        point = (float(batch), float(active_kv_tokens))
        if self._decode is None:
            raise self._no_rows("decode", point)
        return self._decode(point, self.source, self.key)

    def _no_rows(self, kind: str, point: tuple[float, ...]) -> ReplayError:
        return ReplayError([Diagnostic(
            code=codes.TIMING_TABLE_RANGE, path=self.key,
            message=f"{kind} pass at {point} cannot be priced: the table {self.source} has no "
            f"{kind} rows")])
