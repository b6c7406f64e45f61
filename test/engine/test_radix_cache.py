"""RadixCache on its own: matching, splitting, locking, LRU eviction and slot ownership."""

from __future__ import annotations

import torch

from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPoolAllocator
from sglang.srt.mem_cache.radix_cache import RadixCache
from sglang.srt.sampling.sampling_params import SamplingParams

POOL_TOKENS = 64


def _cache(align: int = 1, disable: bool = False) -> RadixCache:
    pool = ReqToTokenPool(8, 64, "cpu")
    return RadixCache(pool, TokenToKVPoolAllocator(POOL_TOKENS), disable=disable, align=align)


def _req(cache: RadixCache, prompt: list[int], limit: int | None = None) -> Req:
    """A request admitted with its cached prefix and its whole prompt prefilled (and cached)."""
    req = Req(f"r{prompt}", prompt, SamplingParams(max_new_tokens=4))
    req.req_pool_idx = cache.req_to_token_pool.alloc()
    req.kv_len = req.cached_tokens = cache.admit(req, len(prompt) - 1 if limit is None else limit)
    _prefill(cache, req, len(prompt) - req.kv_len)
    return req


def _prefill(cache: RadixCache, req: Req, n: int) -> torch.Tensor:
    slots = cache.alloc(n)
    cache.req_to_token_pool.assign([req.req_pool_idx], [req.kv_len], [n], slots)
    req.kv_len += n
    cache.cache_prefill(req)
    return slots


def _free_and_cached(cache: RadixCache) -> tuple[int, int]:
    return cache.allocator.available_size(), cache.total_size()


def test_match_reuses_the_slots_of_the_longest_prefix_and_splits_the_edge() -> None:
    cache = _cache()
    a = _req(cache, [1, 2, 3, 4, 5, 6])
    a_slots = cache.req_to_token_pool.slots_of(a.req_pool_idx, 6).clone()
    b = _req(cache, [1, 2, 3, 9, 9])
    assert b.cached_tokens == 3
    assert torch.equal(cache.req_to_token_pool.slots_of(b.req_pool_idx, 3), a_slots[:3])
    # The edge [1..6] was split at 3: [1,2,3] -> {[4,5,6], [9,9]}.
    upper = cache.root().children[1]
    assert upper.key == [1, 2, 3] and sorted(c.key[0] for c in upper.children.values()) == [4, 9]
    # Only 6 + 2 slots are in use: b's first three are a's.
    assert cache.allocator.available_size() == POOL_TOKENS - 8


def test_the_last_prompt_token_is_never_taken_from_the_cache() -> None:
    cache = _cache()
    _req(cache, [5, 6, 7])
    twin = _req(cache, [5, 6, 7])
    assert twin.cached_tokens == 2  # the limit len - 1: its last token's logits are needed


def test_release_keeps_prompt_and_outputs_and_frees_only_duplicates() -> None:
    cache = _cache()
    a = _req(cache, [1, 2, 3, 4])
    b = _req(cache, [1, 2, 3, 4])  # recomputes token 4 in its own slot
    a.output_ids = [7, 8]
    _prefill(cache, a, 1)  # the decode step of output 7 (8 was sampled last, never forwarded)
    cache.release(a)
    assert cache.prefix_len([1, 2, 3, 4, 7, 8]) == 5
    free_before = cache.allocator.available_size()
    cache.release(b)
    assert cache.allocator.available_size() == free_before + 1  # b's private copy of token 4
    assert cache.evictable_size() == 5 and cache.protected_size() == 0


def test_locked_nodes_survive_eviction_and_lru_leaves_go_first() -> None:
    cache = _cache()
    old = _req(cache, [1, 1, 1, 1])
    new = _req(cache, [2, 2, 2, 2])
    held = _req(cache, [3, 3, 3, 3])
    cache.release(old)
    cache.release(new)
    # Touch [2, ...] so [1, ...] is the least recently used.
    assert cache.prefix_len([2, 2, 2, 2]) == 4
    cache.match_prefix([2, 2])
    assert cache.evict(1) == 4
    assert cache.prefix_len([1, 1, 1, 1]) == 0 and cache.prefix_len([2, 2, 2, 2]) == 4
    assert cache.evict(100) == 4  # the rest of what is unlocked; `held` stays
    assert cache.prefix_len([3, 3, 3, 3]) == 4
    assert cache.evictable_size() == 0 and cache.protected_size() == 4
    cache.release(held)
    cache.flush()
    assert _free_and_cached(cache) == (POOL_TOKENS, 0)


def test_alloc_evicts_when_the_allocator_runs_short() -> None:
    cache = _cache()
    a = _req(cache, list(range(10, 40)))  # 30 tokens
    cache.release(a)
    assert cache.available_size() == POOL_TOKENS
    slots = cache.alloc(POOL_TOKENS - 10)
    assert slots is not None and slots.numel() == POOL_TOKENS - 10
    assert cache.total_size() < 30  # evicted what the allocation needed


def test_eviction_of_a_split_parent_keeps_the_locked_child_path() -> None:
    cache = _cache()
    a = _req(cache, [1, 2, 3, 4, 5])
    b = _req(cache, [1, 2, 3, 8, 8])
    cache.release(a)
    cache.evict(100)
    # b holds [1,2,3] and [8,8]; a's own tail [4,5] went.
    assert cache.prefix_len([1, 2, 3, 4, 5]) == 3 and cache.prefix_len([1, 2, 3, 8, 8]) == 5
    cache.release(b)
    cache.flush()
    assert _free_and_cached(cache) == (POOL_TOKENS, 0)


def test_every_slot_returns_once_everything_is_released_and_flushed() -> None:
    cache = _cache()
    gen = torch.Generator().manual_seed(0)
    reqs = []
    for i in range(6):
        prompt = torch.randint(0, 3, (int(torch.randint(2, 9, (1,), generator=gen)),), generator=gen).tolist()
        reqs.append(_req(cache, prompt))
        if i % 2:
            cache.release(reqs.pop(0))
    for req in reqs:
        cache.release(req)
    assert cache.protected_size() == 0
    cache.flush()
    assert _free_and_cached(cache) == (POOL_TOKENS, 0)
    assert int(cache.slot_refs.sum()) == 0


def test_aligned_mode_caches_whole_chunks_only_and_no_decode_tokens() -> None:
    cache = _cache(align=4)
    a = _req(cache, list(range(1, 11)))  # 10 tokens: chunks [0, 4) and [4, 8) are cacheable
    assert cache.total_size() == 8
    a.output_ids = [50, 51]
    _prefill(cache, a, 1)
    cache.release(a)
    assert cache.total_size() == 8
    b = _req(cache, list(range(1, 8)))  # 7 tokens, limit 6: the aligned match is 4
    assert b.cached_tokens == 4


def test_disabled_cache_shares_nothing_and_frees_everything() -> None:
    cache = _cache(disable=True)
    a = _req(cache, [1, 2, 3, 4])
    b = _req(cache, [1, 2, 3, 4])
    assert b.cached_tokens == 0 and cache.total_size() == 0
    cache.release(a)
    cache.release(b)
    assert cache.allocator.available_size() == POOL_TOKENS


def test_namespaces_share_nothing_and_vanish_when_evicted() -> None:
    cache = _cache()
    plain = _req(cache, [1, 2, 3, 4])
    salted = Req("salted", [1, 2, 3, 4], SamplingParams(max_new_tokens=4))
    salted.extra_key = "salt-a"
    salted.req_pool_idx = cache.req_to_token_pool.alloc()
    salted.kv_len = salted.cached_tokens = cache.admit(salted, 3)
    assert salted.cached_tokens == 0  # another namespace's prefix is not visible
    _prefill(cache, salted, 4)
    twin = Req("twin", [1, 2, 3, 9], SamplingParams(max_new_tokens=4))
    twin.extra_key = "salt-a"
    twin.req_pool_idx = cache.req_to_token_pool.alloc()
    twin.kv_len = cache.admit(twin, 3)
    assert twin.kv_len == 3
    for req in (plain, salted, twin):
        cache.release(req)
    assert set(cache.roots) == {None, "salt-a"}
    cache.flush()
    assert set(cache.roots) == set() and cache.allocator.available_size() == POOL_TOKENS
