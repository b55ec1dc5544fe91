"""Shared test options: ``--update-goldens`` rewrites golden files instead of comparing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-goldens", action="store_true", default=False,
                     help="rewrite golden files (tests/golden, tests/passes) from current output")


class Golden:
    """Compare text with a committed golden file, or rewrite it with ``--update-goldens``."""

    def __init__(self, update: bool, nodeid: str) -> None:
        self.update = update
        self.test_file = nodeid.split("::", 1)[0]

    def command(self) -> str:
        return f"python -m pytest {self.test_file} --update-goldens"

    def check(self, path: Path, actual: str) -> None:
        rel = path.resolve().relative_to(REPO).as_posix()
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_text(encoding="utf-8") != actual:
                path.write_text(actual, encoding="utf-8")
            return
        if not path.exists():
            pytest.fail(f"golden {rel} is missing; create it with: {self.command()}",
                        pytrace=False)
        expected = path.read_text(encoding="utf-8")
        assert actual == expected, (
            f"golden {rel} is stale; if the change is intended, regenerate with: "
            f"{self.command()}")


@pytest.fixture
def golden(request: pytest.FixtureRequest) -> Golden:
    return Golden(bool(request.config.getoption("--update-goldens")), request.node.nodeid)


# Every replay in the suite runs under the invariant auditor (subprocesses inherit it).
os.environ.setdefault("SERVESIM_CHECK_INVARIANTS", "1")


@pytest.fixture(autouse=True, scope="session")
def _no_hugging_face(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Model ids resolve without the network or this machine's Hugging Face cache: an
    empty cache, and offline (subprocesses inherit both)."""
    os.environ["HF_HUB_CACHE"] = str(tmp_path_factory.mktemp("hf-hub-cache"))
    os.environ["HF_HUB_OFFLINE"] = "1"
