"""Model configs from Hugging Face: the local hub cache, and the Hub itself when online.

A Hub model id (``org/name``) is looked up in the cache ``huggingface_hub`` fills
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) without importing
it: ``models--{org}--{name}/refs/main`` names the snapshot whose folder holds
``config.json``. A model not cached is downloaded, ``config.json`` and
``hf_quant_config.json`` only, through ``huggingface_hub`` (the ``hub`` extra), which caches
them itself; never when ``HF_HUB_OFFLINE`` is set.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

_OFFLINE_VALUES = ("1", "on", "yes", "true")
PROBE_TIMEOUT_S = 3.0  # a Hub that does not answer a connection in this long is unreachable
# the Hub's repository names: letters, digits, '-', '_', '.', neither first nor last
# '-' or '.', no '--' or '..'; a model id is ``org/name``
_PART = r"[A-Za-z0-9](?:[\w.-]{0,94}[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"{_PART}/{_PART}")


class HubError(Exception):
    """A download that failed: ``message`` says why, for the unknown-model diagnostic."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def is_repo_id(name: str) -> bool:
    """True for a name shaped like a Hub model id, ``org/name``."""
    return bool(_REPO_ID.fullmatch(name)) and "--" not in name and ".." not in name


def cache_dir() -> Path:
    """The hub cache folder, as ``huggingface_hub`` chooses it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _OFFLINE_VALUES


def cached_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot folder of ``repo_id`` holding a ``config.json``, or None (also
    when the cache cannot be read).

    ``refs/main`` names it; without that ref, the newest snapshot that has a config.
    """
    repo = cache_dir() / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    try:
        with open(repo / "refs" / "main", "rb") as f:
            revision = f.read(200).decode("ascii", errors="replace").strip()
    except OSError:
        revision = ""
    try:
        if re.fullmatch(r"[\w.-]+", revision) and revision not in (".", ".."):
            folder = snapshots / revision
            if (folder / "config.json").is_file():
                return folder
        candidates = [p for p in snapshots.iterdir() if (p / "config.json").is_file()]
    except OSError:  # no snapshots, or a folder we may not read
        return None
    return max(candidates, key=_mtime, default=None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def download(repo_id: str) -> Path:
    """Download ``repo_id``'s config files into the hub cache; its snapshot folder.

    Raises :class:`HubError` when offline, without ``huggingface_hub``, or when the Hub
    cannot be reached or has no such model.
    """
    if offline():
        raise HubError("HF_HUB_OFFLINE is set, so it was not downloaded")
    try:
        import huggingface_hub
    except ImportError:
        raise HubError("downloading its config needs huggingface_hub: pip install "
                       "'servesim[hub]'") from None
    _probe()
    try:
        config = huggingface_hub.hf_hub_download(repo_id=repo_id, filename="config.json",
                                                 cache_dir=cache_dir())
    except Exception as exc:  # any failure of the Hub is the unknown-model diagnostic
        raise HubError(_why(exc)) from None
    # a ModelOpt checkpoint's quantization; most models have no such file
    with contextlib.suppress(Exception):
        huggingface_hub.hf_hub_download(repo_id=repo_id, filename="hf_quant_config.json",
                                        cache_dir=cache_dir())
    return Path(config).parent


def _probe() -> None:
    """Fail at once when the Hub's host cannot be reached, instead of after
    huggingface_hub's retries (half a minute). Behind a proxy, huggingface_hub decides."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    url = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http"
                                                                 else 443)
    import socket  # (on first use)

    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise HubError(f"the Hugging Face Hub ({host}) cannot be reached: "
                       f"{getattr(exc, 'strerror', None) or exc}") from None


def _why(exc: Exception) -> str:
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return ("the Hugging Face Hub has no such model, or it is gated (accept its license "
                "on the Hub and log in: hf auth login)")
    if name == "EntryNotFoundError":
        return "the model on the Hugging Face Hub has no config.json"
    first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else name
    return f"downloading its config from the Hugging Face Hub failed ({name}: {first})"
