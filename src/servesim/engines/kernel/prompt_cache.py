"""Requests' KV in one rank's :class:`~servesim.engines.kernel.blocks.BlockPool`, with
prefix caching of their prompts.

:class:`PromptCache` is the block pool as a simple engine uses it: it reserves a request's
KV (its prompt plus the output it will hold) all at once, reusing the blocks of the
longest cached prefix of its prompt; it publishes the prompt's complete blocks once they
are computed, so that later requests reuse them; and it releases the reservation when the
request leaves. A block of a released reservation stays cached until the pool evicts it
(least recently released first, see :mod:`servesim.engines.kernel.blocks`).

Reuse follows the built-in engines' recompute rule: a request computes at least the last
token of its prompt (it needs its logits), so a lookup covers the complete blocks of the
prompt's first ``input_length - 1`` tokens.
"""

from __future__ import annotations

from servesim.engines.kernel.blocks import NO_BLOCKS, BlockPool, Lease
from servesim.engines.kernel.requests import RequestSpec
from servesim.engines.kernel.tokens import BlockIds, block_ids
from servesim.payload import RoleArgs


class PromptCache:
    """One rank's block pool, holding whole reservations of requests."""

    def __init__(self, pool: BlockPool, *, prefix_caching: bool,
                 max_model_len: int | None = None) -> None:
        self.pool = pool
        self.prefix_caching = prefix_caching
        self.max_model_len = max_model_len

    @classmethod
    def of(cls, role: RoleArgs) -> PromptCache:
        """A fresh pool of ``role``'s blocks, with its prefix caching and context limit."""
        return cls(BlockPool(role.num_gpu_blocks, role.block_size),
                   prefix_caching=role.prefix_caching, max_model_len=role.max_model_len)

    @property
    def capacity_tokens(self) -> int:
        """Tokens the whole pool holds (a timer's ``total_kv_tokens``)."""
        return self.pool.num_blocks * self.pool.block_size

    def blocks(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.pool.block_size)

    def can_ever_hold(self, tokens: int) -> bool:
        """Whether a reservation of ``tokens`` tokens fits an empty pool and the context
        limit (``max_model_len``); a request for which it does not can never run here."""
        if self.max_model_len is not None and tokens > self.max_model_len:
            return False
        return self.blocks(tokens) <= self.pool.num_blocks

    def reserve(self, spec: RequestSpec, tokens: int, lease: Lease) -> int | None:
        """Grow the empty ``lease`` to hold ``tokens`` tokens of ``spec`` (its prompt first),
        reusing the cached blocks of its prompt's longest cached prefix (prefix caching on).

        Returns the prompt tokens the reused blocks hold (0 without a hit), or ``None`` when
        the blocks are not available now; then the lease stays empty and nothing changes.
        """
        reuse = NO_BLOCKS
        bs = self.pool.block_size
        if self.prefix_caching and spec.input_length > 1:
            hashes = BlockIds()
            block_ids(spec.prompt, bs, hashes, limit=spec.input_length - 1)
            reuse = self.pool.lookup(hashes, len(hashes))
        if not self.pool.allocate(lease, self.blocks(tokens), reuse):
            return None
        return len(reuse) * bs

    def publish(self, spec: RequestSpec, lease: Lease) -> None:
        """``spec``'s prompt was computed into ``lease``: its complete blocks become
        visible to later lookups (prefix caching on; nothing otherwise)."""
        if self.prefix_caching:
            bs = self.pool.block_size
            hashes = BlockIds()
            block_ids(spec.prompt, bs, hashes, limit=spec.input_length)
            self.pool.publish(lease, hashes, 0, spec.input_length // bs)

    def release(self, lease: Lease) -> None:
        """The request holding ``lease`` left: its blocks return to the pool (the published
        ones stay cached until evicted)."""
        self.pool.release(lease)
