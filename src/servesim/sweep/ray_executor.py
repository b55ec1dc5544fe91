"""Trials on a Ray cluster (``pip install 'servesim[ray]'``).

The driver puts what every trial shares in Ray's object store once: the config (a
:class:`Base`) and the bytes of the files it names (trace, timing tables). A node fetches
them once and its workers read them from there; a worker writes the files to a local
folder once per process (keyed by their hash), so a node need not share the driver's disk.
A trial sends only its index and overrides.

The cluster is ``address`` (``ray://HEAD:10001``), else ``RAY_ADDRESS``, else a Ray
instance on this machine started for the run.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.extras import require
from servesim.sweep.trial import Base, Task, input_files, registry_for, run_trial

_LOCAL: dict[str, Any] = {}


def import_ray() -> Any:
    return require("ray", "ray", "the Ray executor", "--executor ray")


def shared_files(base: Base) -> dict[str, bytes]:
    """The bytes of every file the config (without a point's overrides) names."""
    out: dict[str, bytes] = {}
    for path in input_files(base, registry_for(base.plugins)):
        try:
            out[path] = Path(path).read_bytes()
        except OSError:
            continue  # the trial's replay names the missing file
    return out


def local_copies(files: dict[str, bytes]) -> dict[str, str]:
    """Where this worker reads each shared file: the driver's path when it holds the same
    bytes, else a copy in the node's temporary folder, named by the bytes' hash (so written
    once per node: the workers of a node share it)."""
    out: dict[str, str] = {}
    for path, data in files.items():
        digest = hashlib.sha256(data).hexdigest()
        if digest not in _LOCAL:
            _LOCAL[digest] = path if _same_bytes(path, data) else _node_copy(path, data, digest)
        out[path] = _LOCAL[digest]
    return out


def _node_copy(path: str, data: bytes, digest: str) -> str:
    copy = Path(tempfile.gettempdir()) / f"servesim-{digest[:32]}" / Path(path).name
    if not _same_bytes(str(copy), data):
        copy.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=copy.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, copy)  # whole or not at all, whichever worker writes it
    return str(copy)


def _same_bytes(path: str, data: bytes) -> bool:
    try:
        return os.path.getsize(path) == len(data) and Path(path).read_bytes() == data
    except OSError:
        return False


def _trial(base: Base, files: dict[str, bytes], task: Task) -> tuple[int, dict[str, Any]]:
    if "registry" not in _LOCAL:
        _LOCAL["registry"] = registry_for(base.plugins)
    return task[0], run_trial(base, task, _LOCAL["registry"], local_copies(files))


class RayExecutor:
    """Ray tasks, one CPU each; connects to (or starts) Ray, and puts the shared inputs in
    its object store once."""

    def __init__(self, base: Base, address: str | None) -> None:
        ray = self.ray = import_ray()
        self.started_here = not ray.is_initialized()
        if self.started_here:
            try:
                ray.init(address=address or os.environ.get("RAY_ADDRESS") or None,
                         log_to_driver=False, include_dashboard=False)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise ServesimError([Diagnostic(
                    code=codes.RAY_CONNECT, location=f"--address {address}" if address
                    else "RAY_ADDRESS", message=f"cannot connect to the Ray cluster: {exc}",
                    hint="give the head's address, e.g. --address ray://HEAD:10001")]) from None
        self.remote = ray.remote(num_cpus=1)(_trial)
        self.base_ref, self.files_ref = ray.put(base), ray.put(shared_files(base))
        self.pending: list[Any] = []
        self.slots = max(1, int(ray.cluster_resources().get("CPU", 1)))

    def __enter__(self) -> RayExecutor:
        return self

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[int, dict[str, Any]]]:
        self.pending = [self.remote.remote(self.base_ref, self.files_ref, task)
                        for task in tasks]
        while self.pending:
            done, self.pending = self.ray.wait(self.pending, num_returns=1)
            yield self.ray.get(done[0])

    def __exit__(self, *exc: object) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        if self.started_here:
            self.ray.shutdown()
