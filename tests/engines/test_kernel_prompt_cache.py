"""Whole-sequence KV reservations with prefix caching of prompts
(servesim.engines.kernel.prompt_cache)."""

from __future__ import annotations

from servesim.engines.kernel.blocks import BlockPool, Lease
from servesim.engines.kernel.prompt_cache import PromptCache

from .conftest import Sim


def _cache(blocks: int = 16, *, caching: bool = True, max_model_len: int | None = None
           ) -> PromptCache:
    return PromptCache(BlockPool(blocks, 4), prefix_caching=caching,
                       max_model_len=max_model_len)


def test_a_reservation_holds_the_whole_sequence_in_fresh_blocks() -> None:
    cache, lease = _cache(), Lease()
    spec = Sim.spec(0, 10, 5)
    assert cache.reserve(spec, 15, lease) == 0
    assert len(lease) == 4 and cache.pool.num_active == 4  # ceil(15 / 4)
    cache.release(lease)
    assert cache.pool.num_active == 0


def test_a_published_prompt_is_reused_up_to_its_last_token() -> None:
    cache = _cache()
    first, lease = Sim.spec(0, Sim.prompt((7, 12)), 4), Lease()
    assert cache.reserve(first, 16, lease) == 0
    cache.publish(first, lease)  # 3 complete prompt blocks become visible
    # the same 12-token prompt: the last token is computed again, so the third block
    # (tokens 9-12) is not reused
    again, other = Sim.spec(1, Sim.prompt((7, 12)), 4), Lease()
    assert cache.reserve(again, 16, other) == 8
    assert other[:2] == lease[:2] and other[2] != lease[2]
    # a longer prompt with the same first 12 tokens reuses all three blocks
    longer, third = Sim.spec(2, Sim.prompt((7, 12), (8, 3)), 1), Lease()
    assert cache.reserve(longer, 16, third) == 12
    assert third[:3] == lease[:3]


def test_nothing_is_published_or_reused_without_prefix_caching() -> None:
    cache = _cache(caching=False)
    spec, lease = Sim.spec(0, Sim.prompt((7, 12)), 4), Lease()
    cache.reserve(spec, 16, lease)
    cache.publish(spec, lease)
    assert cache.pool.cached_identities() == set()
    assert cache.reserve(Sim.spec(1, Sim.prompt((7, 12)), 4), 16, Lease()) == 0


def test_a_reservation_that_does_not_fit_now_changes_nothing() -> None:
    cache = _cache(blocks=6)
    held = Lease()
    assert cache.reserve(Sim.spec(0, 12, 4), 16, held) == 0
    lease = Lease()
    assert cache.reserve(Sim.spec(1, 8, 4), 12, lease) is None  # 3 blocks, 2 free
    assert lease == [] and cache.pool.num_active == 4
    cache.release(held)
    assert cache.reserve(Sim.spec(1, 8, 4), 12, lease) == 0


def test_what_can_ever_be_held_is_bounded_by_the_pool_and_the_context() -> None:
    cache = _cache(blocks=4)
    assert cache.capacity_tokens == 16
    assert cache.can_ever_hold(16) and not cache.can_ever_hold(17)
    limited = _cache(blocks=64, max_model_len=10)
    assert limited.can_ever_hold(10) and not limited.can_ever_hold(11)


def test_of_a_role_takes_its_pool_caching_and_context_limit() -> None:
    role = Sim.role(num_gpu_blocks=32, block_size=8, prefix_caching=False, max_model_len=100)
    cache = PromptCache.of(role)
    assert (cache.pool.num_blocks, cache.pool.block_size, cache.prefix_caching,
            cache.max_model_len) == (32, 8, False, 100)
