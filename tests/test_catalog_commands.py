"""``servesim models``, ``servesim gpus`` and ``servesim init``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesim.catalog import load_gpu, load_model, model_aliases, model_names
from servesim.catalog_command import GPU_KEYS, MODEL_KEYS
from servesim.cli import main
from servesim.geometry import kv_bytes_per_token


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_models_json_lists_every_shipped_config_with_stable_keys(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models", "--format", "json"], capsys)
    assert code == 0
    rows = json.loads(out)
    assert all(list(r) == list(MODEL_KEYS) for r in rows)
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids)
    assert set(model_names()) <= set(ids)
    listed = {a for r in rows for a in r["aliases"]} | {r["id"] for r in rows}
    assert listed == set(model_names()) | set(model_aliases())  # every id, once
    assert len(ids) + sum(len(r["aliases"]) for r in rows) == len(listed)


def test_models_rows_hold_the_model_s_figures(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {r["id"]: r for r in json.loads(run(["models", "--format", "json"], capsys)[1])}
    llama = rows["meta-llama/Meta-Llama-3.1-70B"]
    assert "meta-llama/Llama-3.1-70B-Instruct" in llama["aliases"]
    assert (llama["attention"], llama["precision"], llama["layers"]) == ("GQA", "bfloat16", 80)
    assert llama["parameters_total"] == llama["parameters_active"]
    assert 69e9 < llama["parameters_total"] < 72e9
    expected_kv, _ = kv_bytes_per_token(load_model("meta-llama/Meta-Llama-3.1-70B"), tensor=1,
                                        pipeline=1, kv_dtype_bytes=2)
    assert llama["kv_bytes_per_token"] == expected_kv == 2 * 8 * 128 * 80 * 2
    ds = rows["deepseek-ai/DeepSeek-V3"]
    assert (ds["attention"], ds["precision"], ds["experts"]) == ("MLA", "fp8", 256)
    assert ds["parameters_active"] < ds["parameters_total"] / 10
    assert rows["Qwen/Qwen3.5-35B-A3B"]["attention"] == "hybrid-linear"
    assert rows["openai/gpt-oss-20b"]["sliding_window_layers"] > 0
    # an alias with its own precision is a row of its own
    fp8 = rows["nvidia/Llama-3.1-8B-Instruct-FP8"]
    assert (fp8["alias_of"], fp8["precision"]) == ("meta-llama/Meta-Llama-3.1-8B", "fp8")


def test_models_filter_and_text_table_not_cut_when_piped(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["models", "llama-3.1-70b"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["id", "params", "active", "layers", "attention", "KV",
                                "B/token", "precision", "aliases"]
    llama = next(line for line in lines if line.split()[0] == "meta-llama/Meta-Llama-3.1-70B")
    # the whole row on one line (stdout is no terminal here), aliases included
    assert llama.split()[1:7] == ["70.6B", "70.6B", "80", "GQA", "327,680", "bfloat16"]
    assert llama.endswith("meta-llama/Meta-Llama-3.1-70B-Instruct")
    assert all(line == line.rstrip() for line in lines)
    assert "Qwen" not in out
    assert err.startswith("2 ids;")  # and nvidia/Llama-3.1-70B-Instruct-FP8
    code, out, _ = run(["models", "no-such-model", "--format", "json"], capsys)
    assert (code, json.loads(out)) == (0, [])


def test_gpus_json_and_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["gpus", "--format", "json"], capsys)
    rows = json.loads(out)
    assert code == 0 and all(list(r) == list(GPU_KEYS) for r in rows)
    h100 = next(r for r in rows if r["name"] == "h100_sxm")
    spec = load_gpu("h100_sxm")
    assert (h100["memory_bytes"], h100["bf16_flops"], h100["fp8_flops"], h100["fp4_flops"],
            h100["gpus_per_node"]) == (spec.mem_capacity_bytes, spec.bf16_flops,
                                       spec.fp8_flops, None, 8)
    code, out, _ = run(["gpus"], capsys)
    row = next(line for line in out.splitlines() if line.split()[:1] == ["b200_sxm"])
    assert row.split()[1:] == ["180", "7.70", "2,250", "4,500", "9,000", "8"]


def test_help_documents_the_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    for command, keys in (("models", MODEL_KEYS), ("gpus", GPU_KEYS)):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(f"{key}:" in text for key in keys)
        assert "example: servesim" in text


@pytest.mark.parametrize(("model", "gpu"), [
    ("meta-llama/Llama-3.1-8B-Instruct", "h100_sxm"),  # dense
    ("Qwen/Qwen3-30B-A3B", "h200_sxm"),  # MoE
    ("deepseek-ai/DeepSeek-V3.1", "b200_sxm"),  # MLA MoE over several GPUs
])
@pytest.mark.parametrize("disagg", [False, True])
def test_init_writes_a_config_that_validates_as_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], model: str, gpu: str,
        disagg: bool) -> None:
    out = tmp_path / "starter.toml"
    code, stdout, err = run(["init", "--model", model, "--gpu", gpu, "--out", str(out),
                             *(["--disagg"] if disagg else [])], capsys)
    assert (code, stdout) == (0, "")
    assert f"wrote {out}" in err
    text = out.read_text()
    assert f'model = "{model}"' in text and f'hardware = "{gpu}"' in text
    assert text.startswith("# servesim starter config")
    assert ('mode = "disaggregated"' in text) == disagg
    code, stdout, err = run(["validate", str(out)], capsys)
    assert (code, err) == (0, "")
    roles = "prefill, decode" if disagg else "aggregated"
    assert stdout.strip().endswith(f"(engine {'disagg' if disagg else 'vllm'}; roles {roles})")


def test_init_gives_a_big_model_enough_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["init", "--model", "meta-llama/Llama-3.1-70B-Instruct",
                        "--gpu", "h100_sxm"], capsys)
    assert code == 0
    assert "tensor = 2" in out.splitlines()  # 141 GB of BF16 weights on 80 GB GPUs
    code, out, _ = run(["init", "--model", "moonshotai/Kimi-K2-Instruct", "--gpu", "h100_sxm"],
                       capsys)
    assert code == 0
    assert {"tensor = 8", "pipeline = 2"} <= set(out.splitlines())


@pytest.mark.parametrize("name", model_names())
def test_every_shipped_model_compiles_a_starter_config(
        name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["init", "--model", name, "--gpu", "b300_sxm"], capsys)
    assert (code, err) == (0, "")
    assert f'model = "{name}"' in out


def test_init_prints_to_stdout_and_never_overwrites_without_force(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["init", "--model", "Qwen/Qwen3-8B", "--gpu", "h100_sxm"], capsys)
    assert code == 0 and out.startswith("# servesim starter config: Qwen/Qwen3-8B")
    target = tmp_path / "mine.toml"
    target.write_text("# my config\n")
    code, _, err = run(["init", "--model", "Qwen/Qwen3-8B", "--gpu", "h100_sxm", "--out",
                        str(target)], capsys)
    assert code == 1
    assert err.splitlines()[0] == (f"error: --out {target}: the file exists; servesim init "
                                   "does not overwrite it [output-exists]")
    assert target.read_text() == "# my config\n"
    code, _, _ = run(["init", "--model", "Qwen/Qwen3-8B", "--gpu", "h100_sxm", "--out",
                      str(target), "--force"], capsys)
    assert code == 0 and target.read_text().startswith("# servesim starter config")
    code, _, err = run(["init", "--model", "Qwen/Qwen3-8B", "--gpu", "h100_sxm", "--out",
                        str(tmp_path)], capsys)
    assert code == 1 and "it is a folder [output-path]" in err


def test_init_unknown_names_get_the_compile_diagnostics(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["init", "--model", "Qwen/Qwen3-33B", "--gpu", "h100"], capsys)
    assert (code, out) == (1, "")
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines[0].startswith("error: --model Qwen/Qwen3-33B: unknown model 'Qwen/Qwen3-33B'; "
                               "closest known: Qwen/Qwen3-32B")
    assert lines[0].endswith("[unknown-model]")
    assert lines[1] == ("error: --gpu h100: unknown gpu 'h100'; closest known: h100_sxm "
                        "[unknown-hardware]")
    assert "Traceback" not in err


def test_init_model_folder_is_named_relative_to_the_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "models" / "tiny"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
        "vocab_size": 1000, "intermediate_size": 512, "torch_dtype": "bfloat16"}))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "configs" / "tiny.toml"
    code, _, _ = run(["init", "--model", "models/tiny", "--gpu", "l40s", "--out", str(out)],
                     capsys)
    assert code == 0
    assert 'model = "../models/tiny"' in out.read_text()
    assert run(["validate", str(out)], capsys)[0] == 0


def test_init_never_writes_over_the_model_s_own_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
        "vocab_size": 1000, "intermediate_size": 512}))
    before = config.read_text()
    code, _, err = run(["init", "--model", str(tmp_path), "--gpu", "h100_sxm", "--out",
                        str(config), "--force"], capsys)
    assert code == 1
    assert "writing it would destroy it [output-path]" in err
    assert config.read_text() == before


def test_init_a_broken_model_folder_is_a_bad_model_config(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text("{")
    code, _, err = run(["init", "--model", str(tmp_path), "--gpu", "h100_sxm"], capsys)
    assert code == 1
    assert "invalid JSON" in err and err.rstrip().endswith("[bad-model-config]")


def test_init_a_model_no_node_holds_says_so(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(json.dumps({  # some 17T parameters
        "num_hidden_layers": 1000, "hidden_size": 32768, "num_attention_heads": 64,
        "vocab_size": 1000, "intermediate_size": 131072, "torch_dtype": "bfloat16"}))
    code, out, err = run(["init", "--model", str(tmp_path), "--gpu", "l40s"], capsys)
    assert (code, out) == (1, "")
    assert err.startswith("error: --gpu: no deployment of up to 8 nodes of l40s")
    assert "[init-no-fit]" in err
    assert "hint: pick a GPU with more memory" in err
