"""RequestSpec and RequestRecord: plain classes (native in the compiled build) with the
value semantics engines and plugins rely on."""

from __future__ import annotations

import inspect
from array import array

from servesim.engines.kernel.requests import (
    RECORD_INIT,
    SPEC_FIELDS,
    RequestRecord,
    RequestSpec,
)
from servesim.engines.kernel.tokens import segment


def _spec(**changes: object) -> RequestSpec:
    fields: dict[str, object] = {"request_id": 3, "arrival_ms": 1.5,
                                 "prompt": (segment(7, 64),), "input_length": 64,
                                 "output_length": 5}
    fields.update(changes)
    return RequestSpec(**fields)  # type: ignore[arg-type]


def test_specs_with_the_same_fields_are_equal_and_hash_alike() -> None:
    assert _spec() == _spec()
    assert hash(_spec()) == hash(_spec())
    assert _spec() != _spec(turn_index=1)
    assert len({_spec(), _spec(), _spec(extends=2)}) == 2


def test_a_spec_keeps_its_prompt_canonical() -> None:
    # a list of two segments that continue each other: one tuple of one segment
    split = RequestSpec(0, 0.0, [segment(7, 32), segment(7, 32, offset=32)], 64, 1)
    assert isinstance(split.prompt, tuple)
    assert split == RequestSpec(0, 0.0, (segment(7, 64),), 64, 1)


def test_evolve_changes_only_what_it_is_given() -> None:
    spec = _spec(session_id="s", turn_index=2, extends=1)
    later = spec.evolve(arrival_ms=9.0)
    assert later.arrival_ms == 9.0
    assert later == _spec(arrival_ms=9.0, session_id="s", turn_index=2, extends=1)
    assert spec.evolve(output_length=1).output_length == 1
    assert spec.arrival_ms == 1.5


def test_a_record_is_equal_only_to_itself_and_evolves_field_by_field() -> None:
    record = RequestRecord(1, 0.0, 8, 2, "completed", token_times=array("d", [1.0, 2.0]),
                           decode_worker=0, pass_ends=array("d", [1.0, 2.0]))
    copy = record.evolve(pass_ends=None)
    assert copy != record
    assert copy.pass_ends is None
    assert all(getattr(copy, name) == getattr(record, name)
               for name in RECORD_INIT if name != "pass_ends")
    assert "pass_ends" not in repr(record)
    assert repr(record).startswith("RequestRecord(request_id=1, arrival_ms=0.0")


def test_the_field_lists_name_every_constructor_argument_in_order() -> None:
    # repr and evolve walk these lists: a field added to a constructor must be added there
    assert tuple(inspect.signature(RequestSpec).parameters) == SPEC_FIELDS
    assert tuple(inspect.signature(RequestRecord).parameters) == RECORD_INIT
