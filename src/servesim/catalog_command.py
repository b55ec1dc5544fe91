"""``servesim models`` and ``servesim gpus``: what the shipped catalog knows, as a table or
as JSON (``--format json``: one object per row, with the keys the ``--help`` lists)."""

from __future__ import annotations

import argparse
import io
import json
from typing import Any

from rich.console import Console

from servesim import catalog, geometry
from servesim.plugins.manager import EngineRegistry

MODEL_KEYS = {
    "id": "Hugging Face id",
    "alias_of": "the shipped config an alias loads (null: shipped itself)",
    "aliases": "other ids loading the same config at the same precision",
    "model_type": "the config's model_type",
    "parameters_total": "parameters (approximate, from the config's shapes)",
    "parameters_active": "parameters a token runs through (routed experts: top-k only)",
    "layers": "decoder layers",
    "attention": "MHA, GQA, MLA or hybrid-linear (recurrent layers beside attention)",
    "sliding_window_layers": "attention layers with a sliding window",
    "experts": "routed experts (0: dense)",
    "experts_per_token": "routed experts per token",
    "kv_bytes_per_token": "KV cache bytes per token, all layers, one GPU, the model's dtype",
    "precision": "the weights' format (fp8, nvfp4, mxfp4, int4 ...) or dtype (bfloat16)",
    "max_context": "max_position_embeddings (null: unset)",
}
GPU_KEYS = {
    "name": "the name engine.hardware takes",
    "memory_bytes": "HBM per GPU",
    "memory_bandwidth_bytes_per_s": "HBM bandwidth",
    "bf16_flops": "dense BF16 tensor-core peak, FLOP/s",
    "fp8_flops": "dense FP8 peak (null: none)",
    "fp4_flops": "dense FP4 peak (null: none)",
    "gpus_per_node": "GPUs in one node (NVLink domain)",
    "intra_node_bandwidth_bytes_per_s": "GPU-to-GPU bandwidth inside a node",
    "inter_node_bandwidth_bytes_per_s": "bandwidth between nodes",
}


def _keys_help(keys: dict[str, str]) -> str:
    return "\n\n--format json: a list of objects, one per row, sorted by the first key:\n" + \
        "\n".join(f"  {k}: {v}" for k, v in keys.items())


def model_arguments(m: argparse.ArgumentParser) -> None:
    m.description = ("List the model ids servesim knows without a folder or a download.\n"
                     "Any Hugging Face id in the local cache (or downloadable, with "
                     "servesim[hub]) works too." + _keys_help(MODEL_KEYS))
    m.add_argument("match", nargs="?", default="",
                   help="show only ids containing this text (letter case aside)")
    m.add_argument("--format", choices=("text", "json"), default="text")


def gpu_arguments(g: argparse.ArgumentParser) -> None:
    g.description = "List the shipped GPU specs." + _keys_help(GPU_KEYS)
    g.add_argument("--format", choices=("text", "json"), default="text")


def model_rows(match: str = "") -> list[dict[str, Any]]:
    """One row per shipped config, and one per alias that sets its own precision."""
    same: dict[str, list[str]] = {}
    ids: list[tuple[str, str | None]] = [(name, None) for name in catalog.model_names()]
    for alias, target in catalog.model_aliases().items():
        if catalog.load_model(alias).weight_quant == catalog.load_model(target).weight_quant:
            same.setdefault(target, []).append(alias)
        else:
            ids.append((alias, target))
    rows = [_model_row(name, of, same.get(name, [])) for name, of in sorted(ids)]
    needle = match.lower()
    return [r for r in rows if not needle or needle in r["id"].lower()
            or any(needle in a.lower() for a in r["aliases"])]


def _model_row(name: str, alias_of: str | None, aliases: list[str]) -> dict[str, Any]:
    model = catalog.load_model(name)
    count = geometry.parameter_count(model)
    active = count.non_expert + (count.routed_experts * model.experts_per_token
                                 // model.num_experts if model.num_experts else 0)
    kv, _ = geometry.kv_bytes_per_token(model, tensor=1, pipeline=1,
                                        kv_dtype_bytes=model.dtype_bytes)
    return {
        "id": name, "alias_of": alias_of, "aliases": sorted(aliases),
        "model_type": model.model_type, "parameters_total": count.total,
        "parameters_active": active, "layers": model.num_layers,
        "attention": attention_kind(model),
        "sliding_window_layers": model.layer_types.count("sliding_attention"),
        "experts": model.num_experts, "experts_per_token": model.experts_per_token,
        "kv_bytes_per_token": kv, "precision": model.weight_quant or model.dtype_name
        or "bfloat16", "max_context": model.max_position_embeddings,
    }


def attention_kind(model: catalog.ModelInfo) -> str:
    if model.is_hybrid:
        return "hybrid-linear"
    if model.is_mla:
        return "MLA"
    return "MHA" if model.num_kv_heads == model.num_attention_heads else "GQA"


def gpu_rows() -> list[dict[str, Any]]:
    rows = []
    for name in catalog.gpu_names():
        gpu = catalog.load_gpu(name)
        rows.append({
            "name": name, "memory_bytes": gpu.mem_capacity_bytes,
            "memory_bandwidth_bytes_per_s": gpu.mem_bw, "bf16_flops": gpu.bf16_flops,
            "fp8_flops": gpu.fp8_flops, "fp4_flops": gpu.fp4_flops,
            "gpus_per_node": gpu.num_gpus_per_node,
            "intra_node_bandwidth_bytes_per_s": gpu.intra_node_bw,
            "inter_node_bandwidth_bytes_per_s": gpu.inter_node_bw,
        })
    return rows


def _print(out: Console, table: Any) -> None:
    """``table`` on ``out``: at the terminal's width, or piped, whole (no cell cut, no
    padding at the ends of lines)."""
    if out.is_terminal:
        out.print(table)
        return
    buffer = io.StringIO()
    wide = Console(file=buffer, width=10_000, highlight=False, markup=False,
                   emoji=False, color_system=None)
    wide.print(table)
    lines = [line.rstrip() for line in buffer.getvalue().splitlines()]
    out.file.write("\n".join(line for line in lines if line) + "\n")


def _count(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _flops(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e12:,.0f}"


def run_models(args: argparse.Namespace, registry: EngineRegistry, out: Console,
               err: Console) -> int:
    rows = model_rows(args.match)
    if args.format == "json":
        out.file.write(json.dumps(rows, indent=2) + "\n")
        return 0
    from rich import box
    from rich.table import Table

    table = Table("id", "params", "active", "layers", "attention", "KV B/token", "precision",
                  "aliases", box=box.SIMPLE_HEAD)
    for r in rows:
        aliases = f"alias of {r['alias_of']}" if r["alias_of"] else ", ".join(r["aliases"])
        table.add_row(r["id"], _count(r["parameters_total"]), _count(r["parameters_active"]),
                      str(r["layers"]), r["attention"], f"{r['kv_bytes_per_token']:,}",
                      r["precision"], aliases)
    _print(out, table)
    err.print(f"{len(rows)} ids; also any folder holding a config.json, and any Hugging Face "
              "id in the local cache (servesim[hub] downloads one)")
    return 0


def run_gpus(args: argparse.Namespace, registry: EngineRegistry, out: Console,
             err: Console) -> int:
    rows = gpu_rows()
    if args.format == "json":
        out.file.write(json.dumps(rows, indent=2) + "\n")
        return 0
    from rich import box
    from rich.table import Table

    table = Table("name", "memory GiB", "bandwidth TB/s", "BF16 TFLOPS", "FP8 TFLOPS",
                  "FP4 TFLOPS", "GPUs/node", box=box.SIMPLE_HEAD)
    for r in rows:
        table.add_row(r["name"], f"{r['memory_bytes'] / 2**30:.0f}",
                      f"{r['memory_bandwidth_bytes_per_s'] / 1e12:.2f}",
                      _flops(r["bf16_flops"]), _flops(r["fp8_flops"]), _flops(r["fp4_flops"]),
                      str(r["gpus_per_node"]))
    _print(out, table)
    return 0
