"""Where trials run: in this process, in local worker processes, or on a Ray cluster.

Every executor yields ``(index, row)`` as trials finish, in any order; callers sort by
index, so the rows do not depend on the executor or the number of workers. Stopping the
iteration (Ctrl-C) stops the workers: finished rows are kept by the caller, running trials
are dropped.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections.abc import Iterator, Sequence
from typing import Any

from servesim.errors import Diagnostic, ServesimError
from servesim.plugins.manager import EngineRegistry
from servesim.sweep.trial import Base, Task, registry_for, run_trial

EXECUTORS = ("local", "ray")
MAX_JOBS = 1024


def default_jobs() -> int:
    """Every core this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def check_jobs(jobs: int) -> int:
    if not 1 <= jobs <= MAX_JOBS:
        raise ServesimError([Diagnostic(
            code="bad-jobs", location=f"--jobs {jobs}",
            message=f"expected a number of workers from 1 to {MAX_JOBS}",
            hint="leave --jobs out to use every core")])
    return jobs


def run_tasks(base: Base, tasks: Sequence[Task], *, executor: str = "local", jobs: int = 1,
              address: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Run every task; yield ``(index, row)`` as each finishes."""
    if executor == "ray":
        from servesim.sweep.ray_executor import run_on_ray

        yield from run_on_ray(base, tasks, address=address)
    elif jobs == 1 or len(tasks) <= 1:
        registry = registry_for(base.plugins)
        for task in tasks:
            yield task[0], run_trial(base, task, registry)
    else:
        yield from _run_in_processes(base, tasks, jobs)


_WORKER: dict[str, Any] = {}


def _start_worker(base: Base) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the pool on Ctrl-C
    _WORKER["base"], _WORKER["registry"] = base, registry_for(base.plugins)


def _work(task: Task) -> tuple[int, dict[str, Any]]:
    base: Base = _WORKER["base"]
    registry: EngineRegistry = _WORKER["registry"]
    return task[0], run_trial(base, task, registry)


def _run_in_processes(base: Base, tasks: Sequence[Task],
                      jobs: int) -> Iterator[tuple[int, dict[str, Any]]]:
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
    pool = context.Pool(min(jobs, len(tasks)), initializer=_start_worker, initargs=(base,))
    try:
        yield from pool.imap_unordered(_work, tasks, chunksize=1)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
