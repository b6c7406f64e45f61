"""The KV slot allocator (mem_cache/memory_pool.py): first freed, first handed out again, as a
plain list would; it refuses more than it holds and a free of slots it never gave out."""

from __future__ import annotations

import random

import pytest
import torch

from sglang.srt.mem_cache.memory_pool import TokenToKVPoolAllocator


def test_alloc_and_free_follow_a_fifo_list():
    size, rng = 37, random.Random(0)
    allocator, free, held = TokenToKVPoolAllocator(size), list(range(1, size + 1)), []
    for _ in range(2000):
        if rng.random() < 0.5:
            n = rng.randint(0, len(free))
            assert allocator.alloc(n).tolist() == free[:n]
            held += free[:n]
            free = free[n:]
        else:
            rng.shuffle(held)
            k = rng.randint(0, len(held))
            allocator.free(torch.tensor(held[:k], dtype=torch.int64))
            free += held[:k]
            held = held[k:]
        assert allocator.available_size() == len(free)
        assert allocator.alloc(len(free) + 1) is None


def test_freeing_more_than_was_handed_out_is_an_error():
    allocator = TokenToKVPoolAllocator(4)
    slots = allocator.alloc(2)
    allocator.free(slots)
    with pytest.raises(RuntimeError, match="already free"):
        allocator.free(torch.tensor([1]))
