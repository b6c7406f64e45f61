"""Paged KV cache: request slots, token slots and the per-layer K/V buffers.

Slot 0 of the token pool is a padding slot: it is never handed out, holds zeros, and padded
positions of a batched decode read it.
"""

from __future__ import annotations

from typing import Optional, Union

import torch


class ReqToTokenPool:
    """Row r maps each token position of the request in slot r to its KV slot."""

    def __init__(self, size: int, max_context_len: int, device: Union[str, torch.device]) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)  # [R, L] int64
        self.free_slots = list(range(size))

    def alloc(self) -> Optional[int]:
        return self.free_slots.pop(0) if self.free_slots else None

    def free(self, idx: int) -> None:
        self.free_slots.append(idx)

    def available_size(self) -> int:
        return len(self.free_slots)


class TokenToKVPoolAllocator:
    """Hands out KV slots 1..size; the free list lives on the device so alloc/free never sync."""

    def __init__(self, size: int, device: Union[str, torch.device]) -> None:
        self.size = size
        self.device = device
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64, device=device)  # [F] int64
        self._num_free = size  # host-side count, so available_size() does not sync

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n > self._num_free:
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        self._num_free -= n
        return out

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        self.free_slots = torch.cat([self.free_slots, indices.to(self.free_slots.device, torch.int64)])
        self._num_free += indices.numel()

    def available_size(self) -> int:
        return self._num_free


class KVCache:
    """Per-layer K and V buffers [size + 1, num_kv_heads, head_dim]; row 0 is the padding slot."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: Union[str, torch.device],
    ) -> None:
        self.size = size
        self.dtype = dtype
        # torch.empty keeps untouched pages uncommitted; every row is written before it is read,
        # except the zeroed padding row.
        shape = (size + 1, num_kv_heads, head_dim)
        self.k_buffers = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v_buffers = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        for buf in self.k_buffers + self.v_buffers:
            buf[0].zero_()

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """loc [N] int64 slots; k, v [N, num_kv_heads, head_dim]."""
        # index_copy_ copies whole rows; buf[loc] = k (index_put_) goes through the general
        # advanced-indexing kernel, slower per call on CPU.
        self.k_buffers[layer_id].index_copy_(0, loc, k)
        self.v_buffers[layer_id].index_copy_(0, loc, v)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.k_buffers + self.v_buffers)
