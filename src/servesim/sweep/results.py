"""A results file: one row per point, in point order, as CSV, JSON or Parquet (by the
file's suffix). Each holds the servesim version and the hashes of the inputs: JSON in its
header object, CSV and Parquet as columns of every row (and Parquet also in the file's
metadata), so that ``pandas.read_csv``/``read_parquet`` load it as is.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.extras import require
from servesim.sweep.metrics import DERIVED

FORMATS = (".csv", ".json", ".parquet")
FIRST = ("point", "status", "error", *DERIVED)


def results_format(path: str) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_PATH, location=f"-o {path}",
            message=f"cannot tell the results format from the suffix {suffix or '(none)'!r}",
            hint="name a .csv, .json or .parquet file")])
    if suffix == ".parquet":
        import_pyarrow()
    return suffix


def import_pyarrow() -> Any:
    require("pyarrow.parquet", "parquet", "a Parquet results file (or write .csv or .json)",
            "*.parquet")
    return require("pyarrow", "parquet", "Parquet", "*.parquet")


def columns(rows: Sequence[Mapping[str, Any]], params: Sequence[str]) -> list[str]:
    """The point, the swept keys, status, derived columns, then the metrics A-Z."""
    seen = {k for row in rows for k in row}
    head = ["point", *params, *FIRST[1:]]
    return head + sorted(seen - set(head))


def _cell(value: Any) -> Any:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


def render(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], params: Sequence[str],
           fmt: str) -> bytes:
    """The file's bytes. ``meta``: servesim version, config and its hash, settings."""
    names = columns(rows, params)
    if fmt == ".json":
        doc = {**meta, "columns": names, "rows": [{k: row.get(k) for k in names} for row in rows]}
        return (json.dumps(doc, indent=2, allow_nan=False, default=str) + "\n").encode()
    flat = [{**{k: _cell(row.get(k)) for k in names}, "servesim_version":
             meta["servesim_version"], "config_sha256": meta["config_sha256"]} for row in rows]
    names = [*names, *(k for k in ("servesim_version", "config_sha256") if k not in names)]
    if fmt == ".csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=names, lineterminator="\n")
        writer.writeheader()
        writer.writerows(flat)
        return buf.getvalue().encode()
    pa = import_pyarrow()
    data = {k: _column(pa, [row[k] for row in flat]) for k in names}
    table = pa.table(data).replace_schema_metadata({"servesim": json.dumps(meta, default=str)})
    sink = pa.BufferOutputStream()
    pa.parquet.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def _column(pa: Any, values: list[Any]) -> Any:
    """A Parquet column; values of mixed kinds (a number and a word) are written as text."""
    kinds = {type(v) for v in values if v is not None}
    if kinds <= {int, float} or len(kinds) <= 1:
        try:
            return pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            pass
    return pa.array([None if v is None else str(v) for v in values], type=pa.string())


def write_atomic(path: Path, data: bytes) -> None:
    """Write the file whole or not at all (through a symbolic link to its target)."""
    target = Path(os.path.realpath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, target.stat().st_mode & 0o7777 if target.exists() else 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_PATH, location=str(path),
            message=f"cannot write this file: {exc.strerror or exc}")]) from None
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_results(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The metadata and rows of a results file ``sweep`` or ``search`` wrote."""
    meta, rows = _read(path)
    if not rows or not all(isinstance(r, dict) and "point" in r and "status" in r
                           for r in rows):
        raise ServesimError([Diagnostic(
            code=codes.RESULTS_FILE, location=path,
            message="no rows with a point and a status: not a results file servesim wrote",
            hint="give the -o file of `servesim sweep` or `servesim search`")])
    return meta, rows


def _read(path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    fmt = results_format(path)
    try:
        if fmt == ".json":
            doc = json.loads(Path(path).read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
                raise ValueError("no list of rows")
            return {k: v for k, v in doc.items() if k != "rows"}, list(doc["rows"])
        if fmt == ".csv":
            with open(path, encoding="utf-8", newline="") as f:
                rows = [{k: _parse_cell(v) for k, v in row.items()} for row in csv.DictReader(f)]
            return {}, rows
        pa = import_pyarrow()
        table = pa.parquet.read_table(path)
        meta = json.loads((table.schema.metadata or {}).get(b"servesim", b"{}"))
        return meta, table.to_pylist()
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ServesimError([Diagnostic(code=codes.RESULTS_FILE, location=path,
                                        message=f"not a results file servesim wrote: {exc}",
                                        hint="give the -o file of `servesim sweep` or "
                                        "`servesim search`")]) from None


def _parse_cell(text: str | None) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text
