"""The points of a sweep: ``--set KEY=V1,V2,...`` settings, crossed or zipped.

A setting with one value applies to every point; one with several values is an axis.
The points are the cartesian product of the axes (the last axis varying fastest), or with
``zip`` the axes taken side by side (all of the same length).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from servesim import codes
from servesim.compiler.overrides import (
    Override,
    format_key,
    parse_value,
    split_assignment,
    split_values,
)
from servesim.errors import CompileError, Diagnostic

MAX_POINTS = 1_000_000


@attrs.frozen
class Axis:
    key: tuple[str, ...]
    values: tuple[object, ...]

    @property
    def name(self) -> str:
        return format_key(self.key)


def parse_settings(settings: Sequence[str]) -> tuple[tuple[Override, ...], tuple[Axis, ...]]:
    """The fixed overrides and the axes of ``--set`` settings, in the order given."""
    fixed: list[Override] = []
    axes: list[Axis] = []
    for text in settings:
        key, values_text = split_assignment(text)
        values = tuple(parse_value(v) for v in split_values(values_text))
        if any(isinstance(v, str) and not v for v in values):
            raise CompileError([Diagnostic(
                code=codes.BAD_OVERRIDE, location=f"--set {text}",
                message="an empty value between commas", hint="remove the extra comma")])
        if len(values) == 1:
            fixed.append((key, values[0]))
        else:
            axes.append(Axis(key, values))
    names = [a.name for a in axes]
    for name in names:
        if names.count(name) > 1:
            raise CompileError([Diagnostic(
                code=codes.BAD_OVERRIDE, location=f"--set {name}=...",
                message="this key is swept twice", hint="give all its values in one --set")])
    return tuple(fixed), tuple(axes)


def points(axes: Sequence[Axis], *, zipped: bool = False) -> list[tuple[Override, ...]]:
    """Every point's overrides, in a fixed order."""
    if not axes:
        return [()]
    if zipped:
        lengths = {a.name: len(a.values) for a in axes}
        if len(set(lengths.values())) > 1:
            raise CompileError([Diagnostic(
                code=codes.BAD_OVERRIDE, location="--zip",
                message="zipped keys need the same number of values; got "
                + ", ".join(f"{k}: {n}" for k, n in lengths.items()),
                hint="give each swept key as many values, or drop --zip for every combination")])
        combos: list[tuple[object, ...]] = list(zip(*(a.values for a in axes), strict=True))
    else:
        total = 1
        for a in axes:
            total *= len(a.values)
        if total > MAX_POINTS:
            raise CompileError([Diagnostic(
                code=codes.BAD_OVERRIDE, location="--set",
                message=f"the sweep has {total} points, more than {MAX_POINTS}",
                hint="sweep fewer values, or use `servesim search` for a large space")])
        combos = list(itertools.product(*(a.values for a in axes)))
    return [tuple((a.key, v) for a, v in zip(axes, combo, strict=True)) for combo in combos]
