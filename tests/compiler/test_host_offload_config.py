"""``[engine.workers.<role>.kv_cache.host_offload]``: the host (G2) KV tier's config,
resolved values, provenance and every refusal, with the config path it names."""

from __future__ import annotations

import attrs
import pytest

from servesim import catalog
from servesim.compiler import compile_source, compile_text
from servesim.compiler.source import SourceText
from servesim.errors import CompileError
from servesim.payload import HostOffloadArgs, Payload
from servesim.plugins.manager import EngineRegistry, get_plugin_manager
from servesim.rules import check_payload

REGISTRY = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
KV = "engine.workers.aggregated.kv_cache"
BASE = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"

[engine.workers.aggregated.parallelism]
tensor = 2

[engine.workers.aggregated.kv_cache]
block_size = 64
capacity = { type = "fixed", blocks = 100 }
"""


def compile_ok(text: str) -> Payload:
    return compile_text(text, name="case.toml", registry=REGISTRY)


def errors(text: str) -> list[str]:
    with pytest.raises(CompileError) as info:
        compile_ok(text)
    return [d.render() for d in info.value.diagnostics]


def test_capacity_in_gb_is_whole_blocks_and_the_link_defaults_to_the_gpus_pcie() -> None:
    # Qwen3-32B at TP2: 2 x 4 KV heads x 128 x 64 layers x 2 B = 131072 B per token;
    # a 64-token block is 8 MiB: floor(1e9 / 8388608) = 119 blocks per GB.
    text = BASE + "host_offload = { capacity_gb = 1 }\n"
    host = compile_ok(text).roles["aggregated"].host_offload
    assert host == HostOffloadArgs(capacity_blocks=119, bandwidth_gb_per_second=64.0,
                                   write_back="on_evict")
    resolved = compile_source(SourceText(text=text, name="case.toml"), registry=REGISTRY,
                              stop_after="resolve")
    prov = resolved.provenance
    assert prov[f"{KV}.host_offload.capacity_blocks"].origin == "derived"
    assert "= 119" in str(prov[f"{KV}.host_offload.capacity_blocks"].formula)
    assert prov[f"{KV}.host_offload.bandwidth_gb_per_second"].origin == "derived"
    assert prov[f"{KV}.host_offload.write_back"].origin == "defaulted"


def test_authored_blocks_and_bandwidth_are_kept() -> None:
    host = compile_ok(BASE + "host_offload = { capacity_blocks = 5000, "
                      "bandwidth_gb_per_second = 900 }\n").roles["aggregated"].host_offload
    assert host == HostOffloadArgs(capacity_blocks=5000, bandwidth_gb_per_second=900.0)


def test_no_host_offload_leaves_the_payload_without_one() -> None:
    assert compile_ok(BASE).roles["aggregated"].host_offload is None
    assert "host_offload" not in compile_ok(BASE).to_data()["roles"]["aggregated"]


@pytest.mark.parametrize("table", ["{}", "{ capacity_blocks = 4, capacity_gb = 1 }"])
def test_exactly_one_capacity(table: str) -> None:
    assert errors(BASE + f"host_offload = {table}\n") == [
        f"{KV}.host_offload: host_offload needs exactly one of capacity_blocks or "
        "capacity_gb [host-offload-capacity]\n  hint: e.g. host_offload = { capacity_gb = 256 }"]


def test_a_capacity_below_one_block_is_refused() -> None:
    assert errors(BASE + "host_offload = { capacity_gb = 0.001 }\n") == [
        f"{KV}.host_offload.capacity_gb: 0.001 GB holds no KV block of 8388608 bytes (64 "
        "tokens x 131072 B) [host-offload-capacity]\n"
        "  hint: raise capacity_gb or give capacity_blocks"]


@pytest.mark.parametrize(("entry", "key"), [
    ("capacity_blocks = 0", "capacity_blocks"),
    ("capacity_blocks = -3", "capacity_blocks"),
    ("capacity_gb = 0", "capacity_gb"),
    ("capacity_blocks = 4, bandwidth_gb_per_second = 0", "bandwidth_gb_per_second"),
    ("capacity_blocks = 4, bandwidth_gb_per_second = nan", "bandwidth_gb_per_second"),
])
def test_out_of_range_values_name_their_key(entry: str, key: str) -> None:
    (message,) = errors(BASE + f"host_offload = {{ {entry} }}\n")
    assert message.startswith(f"{KV}.host_offload.{key}: ")


def test_unknown_keys_and_write_back_policies_are_refused() -> None:
    (message,) = errors(BASE + "host_offload = { capacity_blocks = 4, num_host_blocks = 4 }\n")
    assert message.startswith(f"{KV}.host_offload.num_host_blocks: unknown key")
    (message,) = errors(BASE + 'host_offload = { capacity_blocks = 4, write_back = "never" }\n')
    assert message.startswith(f"{KV}.host_offload.write_back: ")
    assert "on_evict" in message


def test_host_offload_needs_prefix_caching() -> None:
    assert errors(BASE + "prefix_caching = false\nhost_offload = { capacity_blocks = 4 }\n") == [
        f"{KV}.host_offload: host_offload requires prefix_caching = true: the host tier holds "
        "cached prefix blocks [host-offload-conflict]\n"
        "  hint: remove host_offload or enable prefix_caching"]


def test_the_link_bandwidth_is_required_where_the_catalog_has_none(monkeypatch) -> None:
    real = catalog.load_gpu

    def no_pcie(name: str, *args, **kwargs):  # type: ignore[no-untyped-def]
        return attrs.evolve(real(name, *args, **kwargs), pcie_bw=None)

    monkeypatch.setattr(catalog, "load_gpu", no_pcie)
    assert errors(BASE + "host_offload = { capacity_blocks = 4 }\n") == [
        f"{KV}.host_offload.bandwidth_gb_per_second: the catalog gives h100_sxm no PCIe "
        "bandwidth to default to [host-offload-bandwidth]\n"
        "  hint: set bandwidth_gb_per_second (e.g. 64 for PCIe 5.0 x16)"]


def test_the_payload_check_applies_the_same_rules() -> None:
    payload = compile_ok(BASE + "host_offload = { capacity_blocks = 4 }\n")
    role = attrs.evolve(payload.roles["aggregated"], prefix_caching=False,
                        host_offload=HostOffloadArgs(capacity_blocks=0,
                                                     bandwidth_gb_per_second=64.0))
    bad = attrs.evolve(payload, roles={"aggregated": role})
    rendered = sorted(d.render().split(" [")[0] for d in check_payload(bad))
    assert any(r.startswith(f"{KV}.host_offload.capacity_blocks: ") for r in rendered)
    assert any("requires prefix_caching = true" in r for r in rendered)


@pytest.mark.parametrize("backend", ["sglang", "trtllm"])
def test_host_offload_needs_a_vllm_style_scheduler(backend: str) -> None:
    assert errors(BASE.replace('hardware = "h100_sxm"\n', f'hardware = "h100_sxm"\nbackend = '
                               f'"{backend}"\n') + "host_offload = { capacity_blocks = 4 }\n") == [
        f"{KV}.host_offload: host_offload requires backend=vllm, got backend={backend} "
        "[host-offload-conflict]"]


def test_a_disaggregated_role_takes_its_own_host_tier() -> None:
    text = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h100_sxm"
[engine.workers.prefill.kv_cache]
host_offload = { capacity_blocks = 100, bandwidth_gb_per_second = 32 }
[engine.workers.decode]
"""
    roles = compile_ok(text).roles
    assert roles["prefill"].host_offload == HostOffloadArgs(capacity_blocks=100,
                                                            bandwidth_gb_per_second=32.0)
    assert roles["decode"].host_offload is None
