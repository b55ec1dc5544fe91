"""``servesim init --model ID --gpu NAME [--disagg] [--out FILE]``: a commented starter
config that validates as written.

The workers get the fewest GPUs that hold the model: the first of TP 1, 2, 4 ... up to a
node, then pipeline stages of a whole node, whose config compiles.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Console

from servesim import catalog, codes
from servesim.errors import CompileError, Diagnostic, ServesimError
from servesim.files import identity, whole_file
from servesim.plugins.manager import EngineRegistry

MAX_PIPELINE = 8


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Write a starter config (deployment, synthetic traffic, evaluation) "
                     "for MODEL on GPU that validates as written: the workers get the fewest "
                     "GPUs that hold the model. `servesim models` and `servesim gpus` list "
                     "the names.")
    p.add_argument("--model", required=True, metavar="ID",
                   help="a Hugging Face model id, or a folder holding config.json")
    p.add_argument("--gpu", required=True, metavar="NAME", help="a GPU name (servesim gpus)")
    p.add_argument("--disagg", action="store_true",
                   help="prefill and decode on separate workers (disaggregated serving)")
    p.add_argument("--out", metavar="FILE", help="write the config here (default: stdout)")
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def run_init(args: argparse.Namespace, registry: EngineRegistry, out: Console,
             err: Console) -> int:
    target = Path(args.out) if args.out else None
    if target is not None and target.is_dir():
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_PATH, location=f"--out {args.out}",
            message="cannot write this file: it is a folder",
            hint="give the path of a file, such as starter.toml")])
    folder = _folder(args.model)
    model_files = [identity(folder / f) for f in ("config.json", "hf_quant_config.json")] \
        if folder is not None else []
    if target is not None and identity(target) is not None and identity(target) in model_files:
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_PATH, location=f"--out {args.out}",
            message="this is a file of the model folder --model names: writing it would "
            "destroy it", hint="give the path of another file")])
    if target is not None and target.exists() and not args.force:
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_EXISTS, location=f"--out {args.out}",
            message="the file exists; servesim init does not overwrite it",
            hint="give another path, or add --force to replace it")])
    base_dir = (target.resolve().parent if target else Path.cwd())
    problems: list[Diagnostic] = []
    model = _lookup(args.model, "--model", catalog.load_model, problems)
    gpu = _lookup(args.gpu, "--gpu", catalog.load_gpu, problems)
    if problems:
        raise ServesimError(problems)
    text = _fitting_config(args.model, model, gpu, args.disagg, registry, base_dir)
    if target is None:
        out.file.write(text)
        return 0
    try:
        with whole_file(target) as f:
            f.write(text)
    except OSError as exc:
        raise ServesimError([Diagnostic(
            code=codes.OUTPUT_PATH, location=f"--out {args.out}",
            message=f"cannot write this file: {exc.strerror or exc}",
            hint="give the path of a file in a folder you can write")]) from None
    err.print(f"wrote {args.out}: check it with servesim validate {args.out}, run it with "
              f"servesim replay {args.out}")
    return 0


def _lookup(name: str, option: str, load: Any, problems: list[Diagnostic]) -> Any:
    """The model or GPU ``name``; else None, and the compile pass's diagnostic for it in
    ``problems``."""
    try:
        return load(name)
    except catalog.CatalogError as exc:
        code = catalog.error_code(exc, "model" if option == "--model" else "hardware")
        problems.append(Diagnostic(code=code, location=f"{option} {name}", message=str(exc)))
        return None


def _folder(name: str) -> Path | None:
    """The model folder ``name`` names, absolute; None for a model id."""
    try:
        folder = Path(name).expanduser()
        return folder.resolve() if folder.is_dir() else None
    except (OSError, ValueError, RuntimeError):
        return None


def _shapes(gpus_per_node: int) -> list[tuple[int, int]]:
    """(tensor, pipeline) from one GPU up: TP within a node, then whole-node stages."""
    tensors = [t for t in (1, 2, 4, 8, 16, 32, 64, 72) if t <= gpus_per_node]
    pipelines = [p for p in (2, 4, 8) if p <= MAX_PIPELINE]
    return [(t, 1) for t in tensors] + [(tensors[-1], p) for p in pipelines]


def _fitting_config(name: str, model: catalog.ModelInfo, gpu: catalog.GpuSpec, disagg: bool,
                    registry: EngineRegistry, base_dir: Path) -> str:
    from servesim.compiler import compile_source
    from servesim.compiler.source import SourceText

    folder = _folder(name)
    # a folder: named relative to the config's folder, and checked by its absolute path
    # (the config's folder may not exist yet)
    written = name if folder is None else os.path.relpath(folder, base_dir).replace(os.sep, "/")
    checked = name if folder is None else str(folder)
    last: CompileError | None = None
    for tensor, pipeline in _shapes(gpu.num_gpus_per_node):
        try:
            compile_source(SourceText(text=starter_config(
                checked, model, gpu.name, tensor, pipeline, disagg), name="<init>",
                base_dir=base_dir), registry=registry)
        except CompileError as exc:
            last = exc
            continue
        return starter_config(written, model, gpu.name, tensor, pipeline, disagg)
    assert last is not None
    hint = Diagnostic(code=codes.INIT_NO_FIT, location="--gpu",
                      message=f"no deployment of up to {MAX_PIPELINE} nodes of {gpu.name} "
                      "that servesim init tries holds this model; the last one tried fails "
                      "as below", hint="pick a GPU with more memory (servesim gpus)")
    raise ServesimError([hint, *last.diagnostics])


def starter_config(name: str, model: catalog.ModelInfo, gpu: str, tensor: int, pipeline: int,
                   disagg: bool) -> str:
    """The starter config's TOML."""
    gpus = tensor * pipeline
    shape = [f"tensor = {tensor}"] + ([f"pipeline = {pipeline}"] if pipeline > 1 else [])
    kind = "MoE" if model.is_moe else "dense"
    lines = [
        f"# servesim starter config: {name} ({kind}, {model.num_layers} layers) on {gpu}.",
        "# servesim validate FILE checks it; servesim inspect FILE shows every value it",
        "# resolves and where it came from; servesim replay FILE runs it.",
        "# Every key, its default and limits: servesim schema config.",
        "",
        "[engine]",
        f"model = {_toml_string(name)}",
        f"hardware = {_toml_string(gpu)}",
    ]
    if disagg:
        lines += [
            'mode = "disaggregated"  # prefill and decode on separate workers',
            "",
            f"# {gpus} GPU(s) per worker: the fewest that hold the weights and a KV cache",
            "[engine.workers.prefill.parallelism]",
            *shape,
            "replicas = 1",
            "",
            "[engine.workers.decode.parallelism]",
            *shape,
            "replicas = 1",
            "",
            "# KV cache moved from prefill to decode workers over the network",
            "[engine.kv_transfer]",
            "bandwidth_gb_per_second = 25.0",
        ]
    else:
        lines += [
            "",
            f"# {gpus} GPU(s) per worker: the fewest that hold the weights and a KV cache;",
            "# add replicas to serve more traffic",
            "[engine.workers.aggregated.parallelism]",
            *shape,
            "replicas = 1",
        ]
    lines += [
        "",
        "# Synthetic traffic: fixed-length prompts and answers, a closed loop of clients.",
        "# A recorded trace instead: [traffic.source] type = \"trace\", path = \"...\"",
        "[traffic.source]",
        'type = "synthetic"',
        "input_tokens = 1024",
        "output_tokens = 128",
        "",
        "[traffic.load]",
        'type = "concurrency"',
        "concurrency = 8",
        "",
        "[traffic.stop]",
        "requests = 100",
        "",
        "# Latency targets: a request within every number counts toward goodput; a table",
        "# such as { p99 = 100 } is a target on the run's distribution",
        "[evaluation.sla]",
        "ttft_ms = 2000",
        "tpot_ms = 50",
        "itl_ms = { p99 = 100 }",
        "",
    ]
    return "\n".join(lines)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
