"""Replay speed: wall and CPU seconds and peak RSS of whole replay processes, requests per
wall second, on simple and realistic deployments; the bulk decode advance against the
stepwise reference; and the same cases replayed by NVIDIA Dynamo's mocker, with the ratio.

Each case, mode and tool runs in its own process, measured from outside (the child's
wall time, its CPU time and peak RSS from ``wait4``), so the figures of both tools
include start-up, imports and reading the trace. The replay alone (servesim's
``replay_payload`` call, its own process and CPU time) is printed too. Usage::

    python bench/replay_speed.py                 # the default cases (below), about 2 min
    python bench/replay_speed.py --case pd_r1_mtp_mooncake
    python bench/replay_speed.py --case poisson_10k --mode stepwise
    python bench/replay_speed.py --case sessions_scaling   # 500 to 10,000 turns
    python bench/replay_speed.py --repeat 3      # best of 3 processes per run (noisy hosts)
    python bench/replay_speed.py --case poisson_1m --requests 40000   # a smaller generated run
    python bench/replay_speed.py --mocker-python venv/bin/python      # with the mocker

Cases (``*``: run by default; ``both``: bulk and stepwise modes by default, else bulk):

- ``poisson_10k`` * both, ``mooncake_conversation`` * both (12,031 requests), ``poisson_1k``
  (its first 1,000 requests: start-up weighs most there): one
  aggregated vLLM worker of Qwen3-32B on one H200 (pool from GPU memory), block 64,
  max_batched_tokens 8192, max_sequences 256, prefix caching on, polynomial timing;
- ``mooncake_conversation_mtp`` *: the same with MTP, 3 speculative tokens accepted at
  0.8/0.6/0.4 (the polynomial timing ignores the model, so this isolates what speculation
  costs a replay);
- ``prefix_4_replicas`` *: the prefix-heavy Mooncake synthetic trace (3,993 requests, 64%
  of its blocks seen before) on 4 such workers, placed round-robin; ``mooncake_synthetic``
  the same trace on one;
- ``sessions_1000_turns`` *: one synthetic session of 1,000 turns (8 new prompt tokens and
  2 output tokens a turn, each turn's prompt the whole conversation so far) on one worker;
  ``sessions_scaling`` runs it at 500, 1,000, 2,000, 4,000 and 10,000 turns (the schema's
  maximum: 100,000 tokens) with Llama-3.1-8B (128k tokens of context) in Qwen3-32B's place,
  with the CPU time per turn;
- ``pd_r1_mtp_mooncake``: P/D DeepSeek-R1 with SGLang on H200 on the Mooncake conversation
  trace: 2 prefill workers TP8, a decode worker of 8 attention-DP ranks with EP8, MTP with 3
  speculative tokens (0.8/0.6/0.4), default timing, 50 GB/s KV transfer;
  ``pd_r1_mooncake`` the same without speculation;
- ``pd_mooncake_conversation``: the Mooncake conversation trace on six prefill and three
  decode workers like the aggregated one, joined by a 25 GB/s KV link per prefill worker,
  which the transfers leaving one worker share;
- ``poisson_1m``: 16 aggregated workers on a 1,000,000-request Poisson trace generated here
  deterministically (seeded; never committed), per-request JSONL streamed to a file.

The mocker: ``--mocker-python PATH`` names a Python with ``ai-dynamo`` 1.6.1 installed
(``pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 typing_extensions``,
here or in a separate venv: what its offline replay imports). Each case it can replay is
replayed by ``dynamo.replay.api.run_trace_replay`` offline with what servesim compiled: the
same trace (block 512 hash ids), backend, pool size per rank (``num_gpu_blocks``), block
size, max_num_seqs, max_num_batched_tokens, chunked prefill, prefix caching, preemption
mode, context length, attention-DP ranks, MTP depth and acceptance rates, KV transfer
bandwidth and bytes per token, workers placed round-robin, and the polynomial timing (the
mocker's own curves, which servesim's ``polynomial`` reproduces). Cases it cannot replay
say why: servesim's default timing has no mocker equivalent (``--timing polynomial``
replays every case with polynomial timing, the P/D ones included), and its synthetic
sessions do not carry a turn's conversation into the next prompt. servesim's P/D KV
transfers share their link's bandwidth, the mocker's do not: the comparison says so where
it applies. Under speculation the two ITLs differ by definition: servesim's is the gap
between emissions (a speculative burst is one emission), the mocker's is per token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACES = HERE / "traces"
TRACE_BLOCK_SIZE = 512  # the Mooncake traces' hash-id block
MOCKER_INSTALL = ("pip install --no-deps ai-dynamo==1.6.1 ai-dynamo-runtime==1.6.1 "
                  "typing_extensions (here or in a separate venv), "
                  "then --mocker-python PATH")

# --- the deployments and traffic, as a user writes them -----------------------------------

QWEN_AGGREGATED = """
[engine]
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.aggregated.parallelism]
replicas = {replicas}
[engine.workers.aggregated.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.aggregated.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.aggregated.timing]
type = "{timing}"
"""

R1_DISAGGREGATED = """
[engine]
mode = "disaggregated"
model = "deepseek-ai/DeepSeek-R1"
hardware = "h200_sxm"
backend = "sglang"
[engine.workers.prefill.parallelism]
replicas = 2
tensor = 8
[engine.workers.prefill.timing]
type = "{timing}"
[engine.workers.decode.parallelism]
attention_data = 8
moe_expert = 8
[engine.workers.decode.timing]
type = "{timing}"
[engine.kv_transfer]
bandwidth_gb_per_second = 50.0
"""

QWEN_DISAGGREGATED = """
[engine]
mode = "disaggregated"
model = "Qwen/Qwen3-32B"
hardware = "h200_sxm"
[engine.workers.prefill.parallelism]
replicas = 6
[engine.workers.prefill.scheduler]
max_batched_tokens = 8192
[engine.workers.prefill.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.prefill.timing]
type = "{timing}"
[engine.workers.decode.parallelism]
replicas = 3
[engine.workers.decode.scheduler]
max_batched_tokens = 8192
max_sequences = 256
[engine.workers.decode.kv_cache]
block_size = 64
prefix_caching = true
[engine.workers.decode.timing]
type = "{timing}"
[engine.kv_transfer]
bandwidth_gb_per_second = 25.0
"""

MTP = """
[engine.speculation]
kind = "mtp"
num_speculative_tokens = 3
acceptance_rates = [0.8, 0.6, 0.4]
"""

TRACE_TRAFFIC = """
[traffic.source]
type = "trace"
paths = ["{trace}"]
[traffic.load]
type = "trace_timestamps"
"""

SESSION_TRAFFIC = """
[traffic.source]
type = "synthetic-session"
new_input_tokens_per_turn = 8
output_tokens_per_turn = 2
[traffic.source.session]
turns = {turns}
inter_turn_delay_ms = 0.0
[traffic.load]
type = "poisson"
sessions_per_second = 1.0
[traffic.stop]
sessions = 1
"""

# the same worker with a model of 128k tokens of context: a 10,000-turn session fits
LLAMA_AGGREGATED = QWEN_AGGREGATED.replace("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-8B-Instruct")

DEPLOYMENTS = {"qwen_aggregated": QWEN_AGGREGATED, "qwen_disaggregated": QWEN_DISAGGREGATED,
               "r1_disaggregated": R1_DISAGGREGATED, "llama_aggregated": LLAMA_AGGREGATED}


@dataclass(frozen=True)
class Case:
    deployment: str  # a key of DEPLOYMENTS
    trace: str | None = None  # a file of bench/traces; None: generated or sessions
    replicas: int = 1
    mtp: bool = False
    turns: int = 0  # > 0: one synthetic session of this many turns instead of a trace
    timing: str = "polynomial"
    modes: tuple[str, ...] = ("bulk",)  # the modes run unless --mode says otherwise

    @property
    def generated(self) -> bool:
        """A generated trace (poisson_1m's), its per-request records streamed to a file."""
        return self.trace is None and not self.turns


BOTH = ("bulk", "stepwise")
CASES = {
    "poisson_1k": Case("qwen_aggregated", "poisson_1k.jsonl"),
    "poisson_10k": Case("qwen_aggregated", "poisson_10k.jsonl", modes=BOTH),
    "mooncake_conversation": Case("qwen_aggregated", "mooncake_conversation.jsonl", modes=BOTH),
    "mooncake_conversation_mtp": Case("qwen_aggregated", "mooncake_conversation.jsonl",
                                      mtp=True),
    "mooncake_synthetic": Case("qwen_aggregated", "mooncake_synthetic.jsonl"),
    "prefix_4_replicas": Case("qwen_aggregated", "mooncake_synthetic.jsonl", replicas=4),
    "sessions_1000_turns": Case("qwen_aggregated", turns=1000),
    "pd_mooncake_conversation": Case("qwen_disaggregated", "mooncake_conversation.jsonl"),
    "pd_r1_mooncake": Case("r1_disaggregated", "mooncake_conversation.jsonl", timing="default"),
    "pd_r1_mtp_mooncake": Case("r1_disaggregated", "mooncake_conversation.jsonl", mtp=True,
                               timing="default"),
    "poisson_1m": Case("qwen_aggregated", replicas=16),  # generated trace
}
DEFAULT_CASES = ("poisson_10k", "mooncake_conversation", "mooncake_conversation_mtp",
                 "prefix_4_replicas", "sessions_1000_turns")
SESSION_SCALING_TURNS = (500, 1000, 2000, 4000, 10000)


def config_text(case: Case, trace: Path | None) -> str:
    """The one place a case becomes a servesim config."""
    text = DEPLOYMENTS[case.deployment].format(replicas=case.replicas, timing=case.timing)
    if case.mtp:
        text += MTP
    if case.turns:
        return text + SESSION_TRAFFIC.format(turns=case.turns)
    assert trace is not None
    return text + TRACE_TRAFFIC.format(trace=trace.as_posix())


# The generated trace: 1M requests, Poisson arrivals at 112 requests/s for 16 workers (7 per
# worker per second: busy, stable), prompt and output lengths like poisson_10k's. Prompts
# are a shared system prompt (one of 64) followed by blocks from a 50k-block vocabulary,
# so the trace reader's hash-id table stays bounded.
MILLION = 1_000_000
MILLION_RATE_PER_S = 112.0
MILLION_SEED = 20260101


def generate_million(path: Path, n: int = MILLION) -> None:
    rng = random.Random(MILLION_SEED)
    t = 0.0
    with path.open("w", encoding="utf-8") as f:
        for _ in range(n):
            t += rng.expovariate(MILLION_RATE_PER_S / 1000.0)
            isl = max(16, int(rng.lognormvariate(6.2, 0.6)))
            osl = max(1, int(rng.lognormvariate(5.3, 0.6)))
            blocks = -(-isl // 512)
            ids = [rng.randrange(64)] + [64 + rng.randrange(50_000) for _ in range(blocks - 1)]
            f.write(json.dumps({"timestamp": round(t, 3), "input_length": isl,
                                "output_length": osl, "hash_ids": ids}) + "\n")


def trace_path(case: Case, tmp: Path, requests: int) -> Path | None:
    if case.generated:
        path = tmp / "generated.jsonl"
        generate_million(path, requests)
        return path
    return TRACES / case.trace if case.trace else None


# --- the child processes -------------------------------------------------------------------

SUMMARY_KEYS = ("num_requests", "completed_requests", "total_output_tokens", "duration_ms",
                "mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "output_throughput_tok_s")


def servesim_child(config: Path, mode: str, requests_out: Path | None) -> dict[str, Any]:
    """Compile and replay ``config`` in this process; the report's summary, the replay's
    own wall and CPU time, and what the mocker needs of the compiled payload."""
    import attrs

    from servesim.compiler import compile_text
    from servesim.plugins.manager import EngineRegistry, get_plugin_manager
    from servesim.replay import replay_payload

    registry = EngineRegistry.collect(get_plugin_manager(load_entrypoints=False))
    payload = compile_text(config.read_text(encoding="utf-8"), registry=registry)
    registry.engine_class(payload.engine).bulk_decode = mode == "bulk"  # type: ignore[union-attr]
    cpu0, started = time.process_time(), time.perf_counter()
    report = replay_payload(payload, registry=registry, requests_out=requests_out).report
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    report.pop("trace_sha256", None)  # a generated trace's temporary file
    return {
        **{key: report[key] for key in SUMMARY_KEYS},
        "replay_wall_s": wall, "replay_cpu_s": cpu,
        "report_sha256": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest(),
        "roles": {name: attrs.asdict(role) for name, role in payload.roles.items()},
        "kv_transfer": attrs.asdict(payload.kv_transfer) if payload.kv_transfer else None,
    }


def mocker_child(spec: Path) -> dict[str, Any]:
    """Run the mocker's offline trace replay on ``spec`` (see ``mocker_spec``)."""
    from dynamo.replay.api import run_trace_replay

    kwargs = json.loads(spec.read_text(encoding="utf-8"))
    summary = run_trace_replay(kwargs.pop("trace_files"), **kwargs).summary
    return {key: summary[key] for key in SUMMARY_KEYS}


@dataclass(frozen=True)
class Run:
    """One child process: its own figures (``result``), measured from outside."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    result: dict[str, Any]


QUIET = {"DYN_LOG": "error", "RUST_LOG": "error"}  # the mocker's per-request warnings


def run_child(argv: list[str]) -> Run:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, **QUIET})
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed with exit code {proc.returncode}")
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, json.loads(out))


def best_run(argv: list[str], repeat: int) -> Run:
    """The fastest of ``repeat`` processes: hosts add noise, not speed."""
    return min((run_child(argv) for _ in range(repeat)), key=lambda run: run.wall_s)


# --- the mocker's configuration, from what servesim compiled -------------------------------

def mocker_unsupported(case: Case) -> str | None:
    if case.turns:
        return "its synthetic sessions do not carry a turn's conversation into the next prompt"
    if case.timing != "polynomial":
        return (f"servesim's {case.timing} timing has no mocker equivalent "
                "(--timing polynomial compares both on the polynomial curves)")
    return None


def mocker_engine_args(role: dict[str, Any], kv_transfer: dict[str, Any] | None
                       ) -> dict[str, Any]:
    engine: dict[str, Any] = {
        "backend": role["backend"], "worker_type": role["worker_type"],
        "num_gpu_blocks": role["num_gpu_blocks"], "block_size": role["block_size"],
        "max_num_seqs": role["max_sequences"],
        "max_num_batched_tokens": role["max_batched_tokens"],
        "enable_chunked_prefill": role["enable_chunked_prefill"],
        "enable_prefix_caching": role["prefix_caching"],
        "preemption_mode": role["preemption_mode"], "max_model_len": role["max_model_len"],
        "timing_model": {"type": "polynomial"},
    }
    spec = role["speculation"]
    if spec is not None:
        engine["aic_nextn"] = spec["num_speculative_tokens"]
        engine["aic_nextn_accept_rates"] = ",".join(map(str, spec["acceptance_rates"]))
    if kv_transfer is not None:
        engine["kv_transfer_bandwidth"] = kv_transfer["bandwidth_gb_per_second"]
        engine["kv_transfer_bytes_per_token"] = kv_transfer["bytes_per_token"]
        engine["kv_transfer_timing_mode"] = kv_transfer["timing_mode"]
    return {"engine": engine, "dp_size": role["attention_data"]}


def mocker_spec(trace: Path, servesim: dict[str, Any]) -> dict[str, Any]:
    """``run_trace_replay`` keyword arguments matching servesim's compiled case."""
    roles, kv = servesim["roles"], servesim["kv_transfer"]
    spec: dict[str, Any] = {"trace_files": [trace.as_posix()], "router_mode": "round_robin",
                            "trace_block_size": TRACE_BLOCK_SIZE}
    if "aggregated" in roles:
        return {**spec, "extra_engine_args": mocker_engine_args(roles["aggregated"], None),
                "num_workers": roles["aggregated"]["replicas"]}
    return {**spec, "prefill_engine_args": mocker_engine_args(roles["prefill"], kv),
            "decode_engine_args": mocker_engine_args(roles["decode"], kv),
            "num_prefill_workers": roles["prefill"]["replicas"],
            "num_decode_workers": roles["decode"]["replicas"]}


# --- one case, printed ---------------------------------------------------------------------

HEADER = (f"{'case':26} {'run':9} {'wall s':>7} {'cpu s':>7} {'RSS MB':>7} {'replay s':>8} "
          f"{'done':>7} {'req/s':>7} {'TTFT ms':>8} {'TPOT ms':>8} {'ITL ms':>7} "
          f"{'out tok/s':>9}")


def row(name: str, label: str, run: Run) -> str:
    r = run.result
    replay = f"{r['replay_wall_s']:8.2f}" if "replay_wall_s" in r else f"{'':8}"
    return (f"{name:26} {label:9} {run.wall_s:7.2f} {run.cpu_s:7.2f} {run.peak_rss_mb:7.0f} "
            f"{replay} {r['completed_requests']:7d} {r['num_requests'] / run.wall_s:7.0f} "
            f"{r['mean_ttft_ms']:8.2f} {r['mean_tpot_ms']:8.3f} {r['mean_itl_ms']:7.3f} "
            f"{r['output_throughput_tok_s']:9.1f}")


def comparison(name: str, ours: Run, mocker: Run) -> str:
    def diff(key: str) -> str:
        a, b = ours.result[key], mocker.result[key]
        return f"{100 * (a - b) / b:+.1f}%" if b else "n/a"

    rss = ours.peak_rss_mb / mocker.peak_rss_mb
    kv = ours.result["kv_transfer"]
    shared = kv is not None and kv["sharing"] != "none"
    return (f"{name:26} servesim/mocker: wall {ours.wall_s / mocker.wall_s:.2f}x, "
            f"cpu {ours.cpu_s / mocker.cpu_s:.2f}x, RSS {rss:.2f}x; "
            f"TTFT {diff('mean_ttft_ms')}, "
            f"TPOT {diff('mean_tpot_ms')}, out tok/s {diff('output_throughput_tok_s')}"
            + ("; servesim's KV transfers share their links, the mocker's do not"
               if shared else ""))


def replay_case(case: Case, args: argparse.Namespace) -> tuple[dict[str, Run], Run | str | None]:
    """Replay ``case`` in each mode, then with the mocker (or why not; None: not asked)."""
    modes = BOTH if args.mode == "both" else (args.mode,) if args.mode else case.modes
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        trace = trace_path(case, tmp, args.requests)
        config = tmp / "config.toml"
        config.write_text(config_text(case, trace), encoding="utf-8")
        out = ["--requests-out", str(tmp / "requests.jsonl")] if case.generated else []
        runs = {mode: best_run([sys.executable, __file__, "--servesim-child", str(config),
                                "--mode", mode, *out], args.repeat) for mode in modes}
        return runs, mocker_run(case, trace, next(iter(runs.values())), tmp, args)


def print_case(name: str, runs: dict[str, Run], mocker: Run | str | None) -> None:
    for mode, run in runs.items():
        print(row(name, mode, run))
    if set(BOTH) <= runs.keys():
        bulk, step = runs["bulk"], runs["stepwise"]
        same = bulk.result["report_sha256"] == step.result["report_sha256"]
        print(f"{name:26} stepwise/bulk: wall {step.wall_s / bulk.wall_s:.2f}x, "
              f"replay {step.result['replay_wall_s'] / bulk.result['replay_wall_s']:.2f}x; "
              f"reports {'identical' if same else 'DIFFER'}")
    if isinstance(mocker, Run):
        print(row(name, "mocker", mocker))
        print(comparison(name, runs.get("bulk", next(iter(runs.values()))), mocker))
    elif mocker:
        print(f"{name:26} mocker: n/a ({mocker})")


def run_case(name: str, case: Case, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Replay ``case``; print its runs (a table, or one JSON object each) and return them."""
    runs, mocker = replay_case(case, args)
    records = [{"case": name, "tool": "servesim", "mode": mode, **as_record(run)}
               for mode, run in runs.items()]
    if isinstance(mocker, Run):
        records.append({"case": name, "tool": "mocker", **as_record(mocker)})
    elif mocker:
        records.append({"case": name, "tool": "mocker", "not_replayed": mocker})
    if args.json:
        for record in records:
            print(json.dumps(record))
    else:
        print_case(name, runs, mocker)
    return records


def mocker_run(case: Case, trace: Path | None, servesim: Run, tmp: Path,
               args: argparse.Namespace) -> Run | str | None:
    """The mocker's run of ``case``, or why there is none (None: not asked for)."""
    if args.mocker_python is None:
        return None
    why = mocker_unsupported(case)
    if why is not None:
        return why
    assert trace is not None
    spec = tmp / "mocker.json"
    spec.write_text(json.dumps(mocker_spec(trace, servesim.result)), encoding="utf-8")
    return best_run([args.mocker_python, __file__, "--mocker-child", str(spec)], args.repeat)


def as_record(run: Run) -> dict[str, Any]:
    result = {k: v for k, v in run.result.items() if k not in ("roles", "kv_transfer")}
    return {"wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_rss_mb": run.peak_rss_mb, **result}


def session_scaling(args: argparse.Namespace) -> None:
    """The 1,000-turn session case at 500 to 10,000 turns (the schema's maximum) on a
    model with the context for them: CPU time per turn (constant when a turn costs what
    its new tokens cost)."""
    base = with_timing(replace(CASES["sessions_1000_turns"], deployment="llama_aggregated"),
                       args)
    for turns in SESSION_SCALING_TURNS:
        name = f"sessions_{turns}_turns"
        record = run_case(name, replace(base, turns=turns), args)[0]
        if not args.json:
            print(f"{name:26} per turn: {1000 * record['cpu_s'] / turns:.2f} ms of CPU, "
                  f"{1000 * record['replay_cpu_s'] / turns:.2f} ms in the replay")


def with_timing(case: Case, args: argparse.Namespace) -> Case:
    return replace(case, timing=args.timing) if args.timing else case


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=[*sorted(CASES), "sessions_scaling"],
                        action="append", help="repeatable; default: the cases marked *")
    parser.add_argument("--mode", choices=("bulk", "stepwise", "both"), default=None,
                        help="default: the case's own (bulk and stepwise for poisson_10k and "
                             "mooncake_conversation, else bulk)")
    parser.add_argument("--timing", choices=("polynomial",), default=None,
                        help="replay every case with this timing (default: the case's own)")
    parser.add_argument("--mocker-python", default=None, metavar="PATH",
                        help="a Python with ai-dynamo 1.6.1: also replay each case with the "
                             "Dynamo mocker and print the ratio")
    parser.add_argument("--json", action="store_true", help="print one JSON object per run")
    parser.add_argument("--repeat", type=int, default=1,
                        help="processes per run; the fastest is shown")
    parser.add_argument("--requests", type=int, default=MILLION,
                        help="size of the generated trace of poisson_1m")
    parser.add_argument("--servesim-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--requests-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mocker-child", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args()


def mocker_missing(python: str | None) -> str | None:
    """Why the mocker cannot run (None: it can)."""
    if python is None:
        return f"not run ({MOCKER_INSTALL})"
    check = subprocess.run([python, "-c", "import dynamo.replay.api"], capture_output=True,
                           text=True, check=False)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["failed"])[-1]
        return f"not run: {python} cannot import dynamo.replay.api ({last}); {MOCKER_INSTALL}"
    return None


def compile_bytecode() -> None:
    """Write servesim's bytecode as ``pip install`` does, so that no child process spends
    its start compiling sources (an editable checkout run with PYTHONDONTWRITEBYTECODE
    would do so in every process, about 0.1-0.3 s)."""
    import compileall

    import servesim

    compileall.compile_dir(str(Path(servesim.__file__).parent), quiet=1)


def main() -> None:
    args = parse_args()
    if args.servesim_child:
        print(json.dumps(servesim_child(args.servesim_child, args.mode, args.requests_out)))
        return
    if args.mocker_child:
        print(json.dumps(mocker_child(args.mocker_child)))
        return
    missing = mocker_missing(args.mocker_python)
    if missing is not None:
        args.mocker_python = None
    compile_bytecode()
    if not args.json:
        from servesim.build_info import build

        print(f"servesim: {build()}; whole processes, best of {args.repeat}")
        print(f"mocker: {missing or args.mocker_python}")
        print(HEADER)
    for name in args.case or DEFAULT_CASES:
        if name == "sessions_scaling":
            session_scaling(args)
        else:
            run_case(name, with_timing(CASES[name], args), args)


if __name__ == "__main__":
    main()
