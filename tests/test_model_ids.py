"""Model ids as people type them: a folder, a shipped id or alias, the Hugging Face cache,
and a download of the config files from the Hub."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

import pytest

from servesim.catalog import (
    MAX_MODEL_CONFIG_BYTES,
    CatalogError,
    ModelConfigError,
    catalog_id,
    hub,
    load_model,
    model_aliases,
    model_names,
)
from servesim.cli import main
from servesim.compiler import compile_text
from servesim.errors import CompileError
from servesim.payload import anchor_paths, dump_payload
from servesim.testing import rendered, small_config

TINY = {"model_type": "qwen3", "num_hidden_layers": 4, "hidden_size": 256,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16",
        "max_position_embeddings": 4096}
FP8 = {"producer": {"name": "modelopt"},
       "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}


@pytest.mark.parametrize(("name", "target", "quant"), [
    ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B", None),
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B", None),
    ("meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B", None),
    ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", None),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai/DeepSeek-V3", "fp8"),
    ("nvidia/Llama-3.1-8B-Instruct-FP8", "meta-llama/Meta-Llama-3.1-8B", "fp8"),
    ("nvidia/Llama-3.1-70B-Instruct-FP8", "nvidia/Llama-3.1-70B-Instruct-FP8", "fp8"),
])
def test_todays_ids_load_their_architecture_at_their_own_precision(
        name: str, target: str, quant: str | None) -> None:
    model, shipped = load_model(name), load_model(target)
    assert model.name == name
    assert model.weight_quant == quant
    assert (model.num_layers, model.hidden_size, model.num_kv_heads, model.num_experts) == (
        shipped.num_layers, shipped.hidden_size, shipped.num_kv_heads, shipped.num_experts)


def test_a_hf_quant_config_json_sets_a_shipped_checkpoint_s_precision() -> None:
    # the config.json of these ModelOpt checkpoints names no quantization; the file beside it
    assert load_model("nvidia/DeepSeek-V3.1-NVFP4").weight_quant == "nvfp4"
    assert load_model("nvidia/Qwen3-235B-A22B-NVFP4").weight_quant == "nvfp4"


def test_ids_ignore_letter_case_and_name_the_shipped_spelling() -> None:
    assert load_model("qwen/qwen3-32b").name == "Qwen/Qwen3-32B"
    assert catalog_id("META-LLAMA/LLAMA-3.1-8B-INSTRUCT") == "meta-llama/Llama-3.1-8B-Instruct"
    assert catalog_id("Qwen/Qwen3-23B") is None


@pytest.mark.parametrize("alias", sorted(model_aliases()))
def test_an_alias_never_changes_the_precision_of_the_weights(alias: str) -> None:
    target = model_aliases()[alias]
    assert target in model_names()
    model = load_model(alias)
    announced = {"FP8": "fp8", "NVFP4": "nvfp4"}
    marker = next((q for tag, q in announced.items() if alias.endswith(f"-{tag}")), None)
    if marker is not None:
        assert model.weight_quant == marker
    else:  # a BF16 release, or one that ships in its config's own format
        assert model.weight_quant == load_model(target).weight_quant
        assert not target.endswith(("-FP8", "-NVFP4"))


def test_the_suggestion_for_a_bf16_id_is_not_an_fp8_checkpoint() -> None:
    with pytest.raises(CatalogError) as info:
        load_model("meta-llama/Llama-3.1-70B-Instruct-v2")
    close = str(info.value).split("closest known: ")[1].split(". ")[0].split(", ")
    assert close[0] == "meta-llama/Llama-3.1-70B-Instruct"
    assert not any(c.endswith("FP8") for c in close)
    with pytest.raises(CatalogError) as info:
        load_model("nvidia/Llama-3.1-70B-Instruct-FP16")
    assert "FP8" not in str(info.value).split("closest known: ")[1].split(", ")[0]


def test_an_unknown_id_offline_says_how_to_make_it_known() -> None:
    with pytest.raises(CatalogError) as info:
        load_model("Qwen/Qwen3-23B")
    msg = str(info.value)
    assert msg.startswith("unknown model 'Qwen/Qwen3-23B'; closest known: Qwen/Qwen3-32B")
    assert "HF_HUB_OFFLINE is set" in msg
    assert "huggingface-cli download Qwen/Qwen3-23B config.json" in msg
    assert "a folder holding its config.json" in msg
    with pytest.raises(CatalogError, match=r"servesim models lists the \d+ known ids"):
        load_model("zzzz")


def _snapshot(cache: Path, repo_id: str, files: dict[str, Any], *, rev: str = "abc123",
              ref: bool = True) -> Path:
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    folder = repo / "snapshots" / rev
    folder.mkdir(parents=True)
    for name, content in files.items():
        data = content if isinstance(content, (str, bytes)) else json.dumps(content)
        (folder / name).write_bytes(data.encode() if isinstance(data, str) else data)
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
    return folder


def test_a_model_in_the_hugging_face_cache_loads_by_its_id(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    # as huggingface_hub lays it out: the snapshot's file a link to a blob
    folder = _snapshot(tmp_path, "acme/Tiny-1B", {})
    blob = tmp_path / "models--acme--Tiny-1B" / "blobs" / "0123abcd"
    blob.parent.mkdir()
    blob.write_text(json.dumps(TINY))
    (folder / "config.json").symlink_to(Path("..", "..", "blobs", "0123abcd"))
    model = load_model("acme/Tiny-1B")
    assert (model.name, model.num_layers, model.head_dim, model.weight_quant) == (
        "acme/Tiny-1B", 4, 32, None)
    # the quantization of a ModelOpt checkpoint is read from hf_quant_config.json
    _snapshot(tmp_path, "acme/Tiny-1B-FP8", {"config.json": TINY,
                                             "hf_quant_config.json": FP8})
    assert load_model("acme/Tiny-1B-FP8").weight_quant == "fp8"


def test_the_cache_folder_follows_hf_home_and_the_environment_of_each_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    _snapshot(tmp_path / "home" / "hub", "acme/Tiny-1B", {"config.json": TINY})
    assert load_model("acme/Tiny-1B").num_layers == 4
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))  # nothing cached there
    with pytest.raises(CatalogError, match="not in the local Hugging Face cache"):
        load_model("acme/Tiny-1B")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"


def test_without_refs_main_the_newest_snapshot_with_a_config_is_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _snapshot(tmp_path, "acme/Tiny-1B", {"config.json": TINY}, ref=False)
    (tmp_path / "models--acme--Tiny-1B" / "snapshots" / "empty").mkdir()
    assert load_model("acme/Tiny-1B").num_layers == 4
    # a ref naming no snapshot, or a path, is not followed out of the cache
    refs = tmp_path / "models--acme--Tiny-1B" / "refs"
    refs.mkdir()
    (refs / "main").write_text("../../../elsewhere")
    assert load_model("acme/Tiny-1B").num_layers == 4


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "invalid JSON"),
    ("", "invalid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (" " * (MAX_MODEL_CONFIG_BYTES + 1), "file is over"),
    ({**TINY, "num_hidden_layers": "four"}, "'num_hidden_layers' must be an integer"),
    ({**TINY, "torch_dtype": 7}, "is not a dtype servesim knows"),
    ({"model_type": "qwen3"}, "no integer num_hidden_layers"),
])
def test_a_broken_cached_config_is_reported_by_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: Any, message: str) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    folder = _snapshot(tmp_path, "acme/Broken-1B", {"config.json": content})
    with pytest.raises(ModelConfigError, match=message) as info:
        load_model("acme/Broken-1B")
    if not isinstance(content, dict):
        assert str(folder / "config.json") in str(info.value)


def test_an_unreadable_cache_is_a_model_not_cached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    for cache in (tmp_path / "file", tmp_path / "missing"):
        monkeypatch.setenv("HF_HUB_CACHE", str(cache))
        with pytest.raises(CatalogError, match="not in the local Hugging Face cache"):
            load_model("acme/Tiny-1B")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _snapshot(tmp_path, "acme/Tiny-1B", {"config.json": TINY}, ref=False)

    def denied(self: Path) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "iterdir", denied)  # snapshots/ unreadable
    with pytest.raises(CatalogError, match="not in the local Hugging Face cache"):
        load_model("acme/Tiny-1B")


@pytest.mark.parametrize(("hf_quant", "message"), [
    ({"quantization": "FP8"}, "'quantization' must be a table"),
    ({"quantization": {"quant_algo": "INT3"}}, "modelopt with quant_algo = 'INT3'"),
    ("{", "hf_quant_config.json: invalid JSON"),
])
def test_a_broken_hf_quant_config_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              hf_quant: Any, message: str) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    _snapshot(tmp_path, "acme/Tiny-1B", {"config.json": TINY, "hf_quant_config.json": hf_quant})
    with pytest.raises(ModelConfigError, match=message):
        load_model("acme/Tiny-1B")


def test_a_broken_cached_config_is_a_compile_diagnostic(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _snapshot(tmp_path / "cache", "acme/Broken-1B", {"config.json": "{"})
    config = tmp_path / "c.toml"
    config.write_text(small_config().replace("Qwen/Qwen3-32B", "acme/Broken-1B"))
    assert main(["validate", str(config)]) == 1
    err = capsys.readouterr().err
    assert "engine.model:" in err and "invalid JSON" in err and "[bad-model-config]" in err
    assert "Traceback" not in err


class FakeHub:
    """huggingface_hub.hf_hub_download writing into the cache as the library does."""

    def __init__(self, files: dict[str, dict[str, Any]], error: Exception | None = None):
        self.files, self.error = files, error
        self.calls: list[tuple[str, str]] = []

    def __call__(self, *, repo_id: str, filename: str, cache_dir: Path) -> str:
        self.calls.append((repo_id, filename))
        if self.error is not None:
            raise self.error
        if filename not in self.files.get(repo_id, {}):
            raise type("EntryNotFoundError", (Exception,), {})(filename)
        repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
        folder = repo / "snapshots" / "rev1"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / filename).write_text(json.dumps(self.files[repo_id][filename]))
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text("rev1")
        return str(folder / filename)


@pytest.fixture
def online(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("huggingface_hub")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub, "_probe", lambda: None)
    return tmp_path / "cache"


def test_an_id_not_cached_is_downloaded_once_config_files_only(
        online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    fake = FakeHub({"acme/Tiny-1B-FP8": {"config.json": TINY, "hf_quant_config.json": FP8}})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    model = load_model("acme/Tiny-1B-FP8")
    assert (model.num_layers, model.weight_quant) == (4, "fp8")
    assert fake.calls == [("acme/Tiny-1B-FP8", "config.json"),
                          ("acme/Tiny-1B-FP8", "hf_quant_config.json")]
    assert load_model("acme/Tiny-1B-FP8").num_layers == 4  # from the cache now
    assert len(fake.calls) == 2
    # a model without hf_quant_config.json downloads too
    fake.files["acme/Tiny-1B"] = {"config.json": TINY}
    assert load_model("acme/Tiny-1B").weight_quant is None


@pytest.mark.parametrize(("error", "message"), [
    (ConnectionError("Name or service not known"), "failed (ConnectionError: Name or service"),
    (type("RepositoryNotFoundError", (Exception,), {})("404"), "has no such model, or it is "
     "gated"),
    (TimeoutError(), "failed (TimeoutError: TimeoutError)"),
])
def test_a_failed_download_is_the_unknown_model_diagnostic(
        online: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, message: str) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", FakeHub({}, error))
    with pytest.raises(CatalogError) as info:
        load_model("acme/Missing-1B")
    msg = str(info.value)
    assert msg.startswith("unknown model 'acme/Missing-1B'")
    assert message in msg
    assert "huggingface-cli download acme/Missing-1B config.json" in msg


def test_offline_nothing_is_downloaded(online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    fake = FakeHub({"acme/Tiny-1B": {"config.json": TINY}})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CatalogError, match="HF_HUB_OFFLINE is set"):
        load_model("acme/Tiny-1B")
    assert fake.calls == []


def test_an_unreachable_hub_fails_at_once(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    fake = FakeHub({"acme/Tiny-1B": {"config.json": TINY}})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)

    def refuse(address: tuple[str, int], timeout: float) -> socket.socket:
        assert timeout == hub.PROBE_TIMEOUT_S
        raise OSError(111, "Connection refused")

    monkeypatch.setattr(socket, "create_connection", refuse)
    with pytest.raises(CatalogError, match=r"the Hugging Face Hub \(huggingface.co\) cannot be "
                       "reached: Connection refused"):
        load_model("acme/Tiny-1B")
    assert fake.calls == []


def test_without_huggingface_hub_the_message_names_the_extra(
        online: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(CatalogError, match=r"pip install 'servesim\[hub\]'"):
        load_model("acme/Tiny-1B")


def test_a_name_that_is_no_id_is_not_looked_up_on_the_hub(online: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    fake = FakeHub({})
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    for name in ("llama", "a/b/c", "../models/x", "acme/-bad", "acme/x..y"):
        with pytest.raises(CatalogError, match=r"Name a folder holding its config\.json, or a "
                           "Hugging Face model id"):
            load_model(name)
    assert fake.calls == []


def test_a_cached_id_compiles_and_replays_from_a_payload_file_elsewhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    _snapshot(tmp_path / "cache", "acme/Tiny-1B", {"config.json": TINY})
    config = tmp_path / "c.toml"
    config.write_text(small_config(requests=4).replace("Qwen/Qwen3-32B", "acme/Tiny-1B"))
    payload_file = tmp_path / "out" / "p.json"
    assert main(["compile", str(config), "-o", str(payload_file)]) == 0
    data = json.loads(payload_file.read_text())
    assert data["roles"]["aggregated"]["model"] == "acme/Tiny-1B"
    capsys.readouterr()
    # the replay loads the model by its id again, wherever the payload file is
    assert main(["replay", str(payload_file), "--format", "json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["completed_requests"] == 4


def test_a_payload_keeps_ids_as_names_and_folders_as_paths(tmp_path: Path) -> None:
    payload = compile_text(small_config().replace("Qwen/Qwen3-32B",
                                                  "meta-llama/Llama-3.1-8B-Instruct"))
    data = json.loads(dump_payload(payload, relative_to=str(tmp_path)))
    anchor_paths(data, str(tmp_path))
    assert data["roles"]["aggregated"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    (tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct").mkdir(parents=True)  # a folder wins
    data = json.loads(dump_payload(payload, relative_to=str(tmp_path)))
    anchor_paths(data, str(tmp_path))
    assert data["roles"]["aggregated"]["model"] == str(
        tmp_path / "meta-llama" / "Llama-3.1-8B-Instruct")


def test_an_unknown_id_is_a_compile_diagnostic_at_engine_model() -> None:
    with pytest.raises(CompileError) as info:
        compile_text(small_config().replace("Qwen/Qwen3-32B", "meta-llama/Llama-3.1-7B"))
    (line,) = [d for d in rendered(info.value) if d.startswith("engine.model")]
    assert line.startswith("engine.model: unknown model 'meta-llama/Llama-3.1-7B'; closest "
                           "known: ")
    assert "meta-llama/Llama-3.1-8B," in line
    assert line.endswith("[unknown-model]")
