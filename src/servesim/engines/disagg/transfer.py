"""KV transfer time between a prefill source and a decode destination."""

from __future__ import annotations

from servesim.payload import KvTransferArgs


def transfer_tokens(kv: KvTransferArgs, prompt_tokens: int, missing_tokens: int) -> int:
    """Tokens whose KV crosses the link: the whole prompt (``full_prompt``) or only the
    tokens the destination does not already hold (``destination_missing``)."""
    return prompt_tokens if kv.timing_mode == "full_prompt" else missing_tokens


def transfer_delay_ms(kv: KvTransferArgs | None, prompt_tokens: int,
                      missing_tokens: int) -> float:
    """``(tokens * bytes_per_token + state_bytes) / bandwidth``, in milliseconds.

    No delay without a link model: no ``kv_transfer``, no (or a non-positive) bandwidth,
    or unknown bytes per token. State bytes are charged once in every timing mode. Each
    transfer is independent (no contention between concurrent transfers).
    """
    if kv is None:
        return 0.0
    bandwidth = kv.bandwidth_gb_per_second
    if bandwidth is None or not bandwidth > 0 or kv.bytes_per_token <= 0:
        return 0.0
    tokens = transfer_tokens(kv, prompt_tokens, missing_tokens)
    nbytes = tokens * kv.bytes_per_token + kv.state_bytes
    # bytes / (GB/s) is nanoseconds; dividing in this order keeps round inputs exact
    # (128 tokens * 1e6 B at 1 GB/s is exactly 128.0 ms, 1500 B at 1e-6 GB/s 1500.0 ms).
    return nbytes / bandwidth / 1e6
