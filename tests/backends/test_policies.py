"""The built-in backend policies hold the values the spec gives each backend, and no
module outside servesim.backends tells backends apart by name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servesim import backends
from servesim.backends import BUILTIN, Backend, policy, policy_of

SRC = Path(backends.__file__).resolve().parents[1]


def test_builtin_defaults_follow_the_spec() -> None:
    table = {name: (b.default_block_size, b.default_memory_fraction, b.min_block_size)
             for name, b in BUILTIN.items()}
    assert table == {"vllm": (64, 0.9, 2), "sglang": (1, 0.88, 1), "trtllm": (32, 0.9, 2)}


@pytest.mark.parametrize(("name", "attention_data", "budget"), [
    ("vllm", 4, 8192), ("trtllm", 4, 8192), ("sglang", 4, 2048), ("sglang", 16384, 1)])
def test_token_budget_per_rank(name: str, attention_data: int, budget: int) -> None:
    assert policy_of(name).default_token_budget(attention_data) == budget


def test_scheduler_policy_flags() -> None:
    flags = {name: (b.no_evict, b.new_token_ratio, b.separate_prefill, b.destination_first,
                    b.standalone_prefill_pricing) for name, b in BUILTIN.items()}
    assert flags == {"vllm": (False, False, False, False, False),
                     "sglang": (False, True, True, True, True),
                     "trtllm": (True, False, False, False, False)}


def test_lookup_is_among_the_backends_it_is_given() -> None:
    class Other(Backend):
        NAME = "other"

    registered = {"other": Other()}
    assert policy("other") is None  # the built-ins by default
    assert policy_of("other", registered).NAME == "other"
    assert policy("vllm", registered) is None
    with pytest.raises(KeyError, match="no backend named 'other'"):
        policy_of("other")


def test_no_module_reads_plugins_through_a_context_variable() -> None:
    # the registry is passed explicitly: to the compiler in its context, to an engine by
    # the registry that made it
    found = [str(path.relative_to(SRC)) for path in SRC.rglob("*.py")
             if "ContextVar" in path.read_text(encoding="utf-8")
             and path.name != "audit.py"]  # the invariant checks' on/off switch
    assert found == []


def test_no_module_compares_backend_names() -> None:
    pattern = re.compile(r"backend\s*(==|!=)\s*[\"']|[\"'](vllm|sglang|trtllm)[\"']\s*(==|!=)")
    found = [f"{path.relative_to(SRC)}:{n}" for path in SRC.rglob("*.py")
             if path.parent.name != "backends"
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if pattern.search(line)]
    assert found == []
