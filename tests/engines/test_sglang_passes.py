"""SGLang's separate prefill passes (spec §5.10): a pass either extends prompts or
decodes; an extend pass runs whenever there is prompt work, the decoding requests wait
it out, and the first tokens it completes come out of it without decode time.

Fixed timing: a pass with prompt work costs P = 10 ms, a decode step D = 1 ms.
"""

from __future__ import annotations

from array import array
from typing import Any

from servesim.payload import SpeculationArgs


def test_a_prompt_arriving_mid_decode_gets_its_own_pass(sim: Any) -> None:
    # Request 0 decodes 5 tokens; request 1 arrives at 2.5 with a one-token output.
    specs = [sim.spec(0, 4, 5), sim.spec(1, 4, 1, arrival=2.5)]
    sglang, _, _ = sim.run(sim.role(backend="sglang"), specs)
    # extend 0 -> 10 (first token, no decode time); extend for request 1 at 10 -> 20
    # while request 0 waits; then decode steps of 1 ms.
    assert sglang[0].token_times == array("d", [10.0, 21.0, 22.0, 23.0, 24.0])
    assert sglang[1].token_times == array("d", [20.0])
    # vLLM mixes the prompt into the decode pass: P + D for both, every pass.
    vllm, _, _ = sim.run(sim.role(), specs)
    assert vllm[0].token_times == array("d", [11.0, 22.0, 23.0, 24.0, 25.0])
    assert vllm[1].token_times == array("d", [22.0])


def test_chunked_prompts_extend_pass_after_pass_before_any_decode(sim: Any) -> None:
    # A 12-token prompt over a 4-token budget takes three extend passes; request 0,
    # decoding, waits for all of them.
    role = sim.role(backend="sglang", max_batched_tokens=4)
    specs = [sim.spec(0, 4, 3), sim.spec(1, 12, 1, arrival=5.0)]
    records, _, _ = sim.run(role, specs)
    assert records[1].token_times == array("d", [40.0])
    assert records[0].token_times == array("d", [10.0, 41.0, 42.0])


def test_an_extend_pass_emits_one_token_per_request_even_with_speculation(sim: Any) -> None:
    # MTP drafts accepted every time: decode steps emit bursts of 3, the extend pass
    # that completes the prompt only its first token.
    spec = SpeculationArgs(kind="mtp", num_speculative_tokens=2, acceptance_rates=(1.0, 1.0))
    records, _, _ = sim.run(sim.role(backend="sglang", speculation=spec), [sim.spec(0, 4, 7)])
    assert records[0].token_times == array("d", [10.0, 11.0, 11.0, 11.0, 12.0, 12.0, 12.0])
