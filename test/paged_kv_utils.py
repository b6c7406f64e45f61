"""A shuffled paged KV cache for attention-kernel tests (shared by the CPU and Triton ones)."""

from __future__ import annotations

import torch


def paged_kv_cache(num_kv_heads: int, head_dim: int, lens: list[int], dtype: torch.dtype = torch.float32, seed: int = 0):
    """(k_buf, v_buf [S, Hk, D], req_to_token, req_pool_indices, seq_lens) on the CPU: the slots
    of all requests shuffled over the pool, their req_to_token rows from row 2 on."""
    gen = torch.Generator().manual_seed(seed)
    slots = sum(lens) + 1
    k = torch.randn(slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(slots, num_kv_heads, head_dim, generator=gen).to(dtype)
    perm = torch.randperm(slots - 1, generator=gen) + 1
    req_to_token = torch.zeros(len(lens) + 2, max(lens) + 5, dtype=torch.int64)
    offset = 0
    for row, n in enumerate(lens):
        req_to_token[row + 2, :n] = perm[offset : offset + n]
        offset += n
    pool_indices = torch.arange(len(lens), dtype=torch.int64) + 2
    return k, v, req_to_token, pool_indices, torch.tensor(lens, dtype=torch.int64)
