"""File paths in a payload file are relative to that file, and absolute once loaded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

from servesim.payload import (
    Payload,
    RoleArgs,
    TimingArgs,
    anchor_paths,
    dump_payload,
    load_payload,
)
from servesim.workloads.spec import TimestampLoad, TraceSource, WorkloadSpec


def test_trace_timing_and_model_paths_round_trip_through_a_payload_file(
        tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    role = RoleArgs(worker_type="aggregated", backend="vllm", model=str(data_dir / "model"),
                    hardware="h",
                    timing=TimingArgs(type="table", path=str(data_dir / "steps.csv")))
    payload = Payload(engine="vllm", mode="aggregated", roles={"aggregated": role},
                      workload=WorkloadSpec(TraceSource(path=str(data_dir / "t.jsonl")),
                                            TimestampLoad()))
    out_dir = tmp_path / "out"
    data = json.loads(dump_payload(payload, relative_to=str(out_dir)))
    assert data["workload"]["source"]["path"] == "../data/t.jsonl"
    assert data["roles"]["aggregated"]["timing"]["path"] == "../data/steps.csv"
    assert data["roles"]["aggregated"]["model"] == "../data/model"
    anchor_paths(data, str(out_dir))
    loaded = load_payload(data)
    assert os.path.normpath(loaded.roles["aggregated"].model) == str(data_dir / "model")
    assert isinstance(loaded.workload.source, TraceSource)
    assert os.path.normpath(loaded.workload.source.path) == str(data_dir / "t.jsonl")
    assert os.path.normpath(loaded.roles["aggregated"].timing.path or "") == str(
        data_dir / "steps.csv")
    assert attrs.evolve(loaded.roles["aggregated"], timing=role.timing,
                        model=role.model) == role
    # a catalog model is a name, not a path
    catalog = attrs.evolve(payload, roles={"aggregated": attrs.evolve(
        role, model="Qwen/Qwen3-32B")})
    data = json.loads(dump_payload(catalog, relative_to=str(out_dir)))
    anchor_paths(data, str(out_dir))
    assert data["roles"]["aggregated"]["model"] == "Qwen/Qwen3-32B"


def test_a_payload_hashes_the_same_wherever_its_files_live(tmp_path: Path) -> None:
    from servesim.replay import provenance

    def payload(folder: Path) -> Payload:
        role = RoleArgs(worker_type="aggregated", backend="vllm", model=str(folder / "model"),
                        hardware="h", timing=TimingArgs(type="table",
                                                        path=str(folder / "steps.csv")))
        return Payload(engine="vllm", mode="aggregated", roles={"aggregated": role},
                       workload=WorkloadSpec())

    here, there = (provenance(payload(tmp_path / d), None)["payload_sha256"]
                   for d in ("a", "b"))
    assert here == there
    other = attrs.evolve(payload(tmp_path / "a"), engine="disagg")
    assert provenance(other, None)["payload_sha256"] != here
