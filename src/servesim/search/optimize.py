"""The search loop: Optuna asks for points, servesim replays them, Optuna is told.

Trials are asked in batches of the number of workers and replayed in parallel by the same
executors as a sweep. A point Optuna proposes again (a categorical space is small) reuses
its row. Each trial keeps its row in the study (``user_attrs``), so a study in SQLite
storage is resumed with every finished row; an interrupted batch is dropped.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from servesim import codes
from servesim.errors import Diagnostic, ServesimError
from servesim.extras import require
from servesim.search.goals import meets
from servesim.search.space import Parameter, Space
from servesim.sweep.executors import Executor
from servesim.sweep.trial import Task

STUDY = "servesim-search"


def import_optuna() -> Any:
    import warnings

    optuna = require("optuna", "search", "servesim search", "servesim search")

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def sampler_for(optuna: Any, space: Space) -> Any:
    name = space.sampler
    if name == "auto":
        name = "nsga2" if len(space.objectives) > 1 else "tpe"
    seed = space.seed
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed,
                                             population_size=max(4, min(50, space.trials // 4)))
    if name in ("random", "grid"):  # a grid's points are queued when the study is made
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed,
                                      n_startup_trials=max(1, min(10, space.trials // 3)))


def open_study(optuna: Any, space: Space, storage: str | None, resume: bool,
               fingerprint: dict[str, str]) -> Any:
    """A new study, or with ``resume`` the one in ``storage`` (made from the same config,
    space and settings: ``fingerprint``)."""
    directions = [o.direction for o in space.objectives]
    sampler = sampler_for(optuna, space)
    if resume:
        try:
            study = optuna.load_study(study_name=STUDY, storage=storage, sampler=sampler)
        except KeyError:
            raise _storage_error(storage, "holds no servesim search to resume") from None
        if study.user_attrs.get("fingerprint") != fingerprint:
            raise _storage_error(storage, "this search was made from another config, space "
                                 "or --set values", "resume with the same inputs, or start "
                                 "a new search without --resume")
        return study
    study = optuna.create_study(study_name=STUDY, storage=storage, sampler=sampler,
                                directions=directions)
    study.set_user_attr("fingerprint", fingerprint)
    if space.sampler == "grid":  # every combination, in order (Optuna's GridSampler stops
        # the study when done, which only works inside study.optimize)
        names = [p.name for p in space.parameters]
        for combo in itertools.product(*(_coded(p.choices) for p in space.parameters)):
            study.enqueue_trial(dict(zip(names, combo, strict=True)))
    return study


def _storage_error(storage: str | None, message: str, hint: str | None = None) -> ServesimError:
    return ServesimError([Diagnostic(code=codes.SEARCH_STORAGE, location=f"--storage {storage}",
                                     message=message, hint=hint)])


def suggest(trial: Any, param: Parameter) -> Any:
    if param.choices:
        coded = _coded(param.choices)
        value = trial.suggest_categorical(param.name, coded)
        return param.choices[coded.index(value)]
    if param.integer:
        return trial.suggest_int(param.name, int(param.low or 0), int(param.high or 0),
                                 log=param.log)
    return trial.suggest_float(param.name, param.low, param.high, log=param.log)


def _coded(choices: Sequence[Any]) -> list[Any]:
    """Choices as Optuna takes them: a table or an array as its JSON text."""
    return [json.dumps(c, sort_keys=True) if isinstance(c, (dict, list)) else c
            for c in choices]


def objective_values(space: Space, row: dict[str, Any]) -> list[float] | None:
    values = [o.value(row) for o in space.objectives]
    if row.get("status") != "ok" or any(v is None for v in values):
        return None
    return [float(v) for v in values if v is not None]


def search(study: Any, space: Space, executor: Executor, *, trials: int,
           on_row: Callable[[dict[str, Any]], None]) -> None:
    """Run trials until the study holds ``trials`` finished ones (Ctrl-C stops early)."""
    optuna = import_optuna()
    seen = {_point_key(t.params): t.user_attrs["row"] for t in study.trials
            if "row" in t.user_attrs}
    while True:
        remaining = trials - finished_trials(study)
        if remaining <= 0:
            return
        batch = [study.ask() for _ in range(min(executor.slots, remaining))]
        points = [tuple((p.key, suggest(t, p)) for p in space.parameters) for t in batch]
        tasks: list[Task] = []
        for trial, point in zip(batch, points, strict=True):
            if _point_key(trial.params) not in seen:
                tasks.append((trial.number, point))
        rows = {}
        try:
            for index, row in executor.run(tasks):
                rows[index] = row
        except KeyboardInterrupt:
            for trial in batch:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise
        for trial in batch:
            key = _point_key(trial.params)
            row = {**(rows.get(trial.number) or seen[key]), "point": trial.number}
            seen.setdefault(key, row)
            _tell(optuna, study, trial, space, row)
            on_row(row)


def _tell(optuna: Any, study: Any, trial: Any, space: Space, row: dict[str, Any]) -> None:
    for constraint in space.constraints:  # the samplers prefer trials meeting them (<= 0)
        violation = constraint.violation(row)
        trial.set_constraint(str(constraint), violation if math.isfinite(violation) else 1e300)
    trial.set_user_attr("row", _json_safe(row))
    values = objective_values(space, row)
    if values is None:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(trial, values)


def _json_safe(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in row.items()}


def _point_key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def finished_trials(study: Any) -> int:
    """Trials with a row (one stopped by Ctrl-C has none: a resumed search runs another)."""
    return sum(1 for t in study.trials if "row" in t.user_attrs)


def rows_of(study: Any) -> list[dict[str, Any]]:
    """Every finished trial's row, in trial order."""
    return [t.user_attrs["row"] for t in sorted(study.trials, key=lambda t: t.number)
            if "row" in t.user_attrs]


def pareto(rows: Sequence[dict[str, Any]], space: Space) -> list[dict[str, Any]]:
    """The feasible rows no other feasible row beats on every objective."""
    signs = [1.0 if o.direction == "maximize" else -1.0 for o in space.objectives]
    scored = []
    for row in rows:
        values = objective_values(space, row)
        if values is not None and meets(row, space.constraints):
            scored.append((row, [s * v for s, v in zip(signs, values, strict=True)]))
    front = []
    for row, v in scored:
        dominated = any(all(a >= b for a, b in zip(w, v, strict=True)) and w != v
                        for _, w in scored)
        if not dominated:
            front.append(row)
    unique: dict[str, dict[str, Any]] = {}
    for row in front:
        unique.setdefault(json.dumps([row.get(o.column) for o in space.objectives]), row)
    return sorted(unique.values(), key=lambda r: [-s * (objective_values(space, r) or [0])[i]
                                                  for i, s in enumerate(signs)])
