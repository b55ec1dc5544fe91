"""A servesim backend plugin: vLLM that never preempts.

vLLM's scheduler admits requests first come, first served as long as their next blocks
fit, and preempts the newest running request when a decode step runs out of blocks. This
variant keeps vLLM's everything (defaults, memory formula, mixed passes, rules, perf
data) and changes only admission: like TensorRT-LLM's GUARANTEED_NO_EVICT, a request is
admitted, still first come first served, only when the blocks of its whole sequence fit
beside what every admitted request may still take, so no request is ever preempted.

Use it with ``servesim --plugin vllm_no_evict replay config.toml`` (this folder on
``PYTHONPATH``), or register the module under ``[project.entry-points.servesim]`` in a
package; select it with ``backend = "vllm-no-evict"`` under ``[engine]``.
"""

from __future__ import annotations

from servesim.backends import Backend
from servesim.backends.vllm import Vllm
from servesim.plugins import hookimpl


class VllmNoEvict(Vllm):
    """vLLM with first-come-first-served admission that never preempts."""

    NAME = "vllm-no-evict"
    DESCRIPTION = "vLLM, admitting a request only when its whole sequence fits: no preemption"
    no_evict = True


@hookimpl
def servesim_register_backends() -> list[type[Backend]]:
    return [VllmNoEvict]
