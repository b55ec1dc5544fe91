"""Where trials run: in this process, in local worker processes, or on a Ray cluster.

``open_executor`` starts the workers once (a search sends them batch after batch);
``run(tasks)`` yields ``(index, row)`` as trials finish, in any order. Callers sort by
index, so the rows do not depend on the executor or the number of workers. Leaving the
``with`` block stops the workers, Ctrl-C included: finished rows are the caller's, running
trials are dropped.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.plugins.manager import EngineRegistry
from servesim.sweep.trial import Base, Task, registry_for, run_trial

EXECUTORS = ("local", "ray")
MAX_JOBS = 1024
Rows = Iterator[tuple[int, dict[str, Any]]]


class Executor(Protocol):
    slots: int  # trials it runs at once

    def run(self, tasks: Sequence[Task]) -> Rows: ...


def default_jobs() -> int:
    """Every core this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def check_jobs(jobs: int) -> int:
    if not 1 <= jobs <= MAX_JOBS:
        raise ServesimError([Diagnostic(
            code=codes.BAD_JOBS, location=f"--jobs {jobs}",
            message=f"expected a number of workers from 1 to {MAX_JOBS}",
            hint="leave --jobs out to use every core")])
    return jobs


@contextlib.contextmanager
def open_executor(base: Base, *, executor: str = "local", jobs: int = 1,
                  address: str | None = None) -> Iterator[Executor]:
    if executor == "ray":
        from servesim.sweep.ray_executor import RayExecutor

        with RayExecutor(base, address) as ray_executor:
            yield ray_executor
    elif jobs == 1:
        yield InProcess(base)
    else:
        with ProcessPool(base, jobs) as pool:
            yield pool


def run_tasks(base: Base, tasks: Sequence[Task], *, executor: str = "local", jobs: int = 1,
              address: str | None = None) -> Rows:
    """Run every task; yield ``(index, row)`` as each finishes."""
    with open_executor(base, executor=executor, jobs=min(jobs, max(1, len(tasks))),
                       address=address) as ex:
        yield from ex.run(tasks)


class InProcess:
    slots = 1

    def __init__(self, base: Base) -> None:
        self.base, self.registry = base, registry_for(base.plugins)

    def run(self, tasks: Sequence[Task]) -> Rows:
        for task in tasks:
            yield task[0], run_trial(self.base, task, self.registry)


_WORKER: dict[str, Any] = {}


def _start_worker(base: Base) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C
    _WORKER["base"], _WORKER["registry"] = base, registry_for(base.plugins)


def _work(task: Task) -> tuple[int, dict[str, Any]]:
    base: Base = _WORKER["base"]
    registry: EngineRegistry = _WORKER["registry"]
    return task[0], run_trial(base, task, registry)


def _context() -> Any:
    """fork where it is safe (Linux, no other thread yet: workers start at once, with
    servesim imported); else forkserver, else spawn (workers import servesim)."""
    methods = multiprocessing.get_all_start_methods()
    if sys.platform == "linux" and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class ProcessPool:
    def __init__(self, base: Base, jobs: int) -> None:
        self.pool = _context().Pool(jobs, initializer=_start_worker, initargs=(base,))
        self.slots = jobs

    def __enter__(self) -> ProcessPool:
        return self

    def run(self, tasks: Sequence[Task]) -> Rows:
        yield from self.pool.imap_unordered(_work, tasks, chunksize=1)

    def __exit__(self, *exc: object) -> None:
        self.pool.terminate()
        self.pool.join()
