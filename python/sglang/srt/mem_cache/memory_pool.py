"""Paged KV cache: request slots, token slots and the per-layer K/V buffers.

Slot 0 of the token pool is a padding slot: it is never handed out, holds zeros, and padded
positions of a batched decode read it. The last slot is never handed out either: the padding
rows of a CUDA-graph batch write their K/V there, so no real slot (nor slot 0) is touched.

The scheduler decides on the host, so what it reads back (free token slots, each request's
slots) lives on the host: the token free list, and a host mirror of req_to_token that every
write goes through. Nothing in scheduling reads the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from sglang.srt.utils import host_to_device


@dataclass(frozen=True)
class KVCacheLayout:
    """What a model stores per token in each of its KV layers, on one TP rank (the model declares
    it: `kv_cache_layout()`)."""

    num_layers: int  # layers that own K/V; a model maps its attention layers onto 0..num_layers-1
    num_kv_heads: int
    head_dim: int  # K's width per head
    # V's width per head; 0: no V buffer, the values are read from the K rows (MLA stores one
    # latent row per token and attends it as both key and value).
    v_head_dim: int

    def bytes_per_token(self, itemsize: int) -> int:
        return self.num_layers * self.num_kv_heads * (self.head_dim + self.v_head_dim) * itemsize


class ReqToTokenPool:
    """Row r maps each token position of the request in slot r to its KV slot. One extra row,
    `padding_row`, is never handed out and stays all zeros: CUDA-graph padding rows point at it."""

    def __init__(self, size: int, max_context_len: int, device: Union[str, torch.device]) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = torch.device(device)
        self.req_to_token = torch.zeros((size + 1, max_context_len), dtype=torch.int64, device=device)  # [R + 1, L] int64
        # The host's copy (the same tensor on CPU).
        self.req_to_token_cpu = self.req_to_token if self.device.type == "cpu" else torch.zeros_like(self.req_to_token, device="cpu")
        self.padding_row = size
        self.free_slots = list(range(size))

    def assign(self, rows: list[int], starts: list[int], lens: list[int], slots: torch.Tensor) -> None:
        """Host table: req_to_token[rows[i], starts[i] : starts[i] + lens[i]] = the next lens[i] of
        `slots` ([sum lens] int64). On CPU that is the only table; on CUDA the device's copy gets
        the same values from the forward batch that uses them (write_forward_batch)."""
        if not lens:
            return
        if all(n == 1 for n in lens):  # decode: one slot per request
            self.req_to_token_cpu[torch.tensor(rows), torch.tensor(starts)] = slots
            return
        lens_t = torch.tensor(lens, dtype=torch.int64)
        row_idx = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), lens_t)  # [N] int64
        # Position of each slot: its request's start plus its rank within the request.
        shift = torch.tensor(starts, dtype=torch.int64) - (torch.cumsum(lens_t, 0) - lens_t)  # [B] int64
        col_idx = torch.repeat_interleave(shift, lens_t) + torch.arange(row_idx.numel())  # [N] int64
        self.req_to_token_cpu[row_idx, col_idx] = slots

    def write_forward_batch(self, req_pool_indices: torch.Tensor, extend_lens: torch.Tensor, positions: torch.Tensor,
                            out_cache_loc: torch.Tensor) -> None:
        """Device table: each new token's slot at its position, from the step's own device tensors
        (no copy from the host beyond the batch's one)."""
        if self.req_to_token is self.req_to_token_cpu:
            return
        rows = req_pool_indices
        if positions.numel() != req_pool_indices.numel():
            rows = torch.repeat_interleave(req_pool_indices, extend_lens, output_size=positions.numel())  # [N] int64
        self.req_to_token.index_put_((rows, positions), out_cache_loc)

    def write_prefix(self, row: int, slots: torch.Tensor) -> None:
        """Positions [0, len(slots)) of request `row` hold `slots` ([M] int64, host): a cached prefix."""
        m = slots.numel()
        self.req_to_token_cpu[row, :m] = slots
        if self.req_to_token is not self.req_to_token_cpu:
            self.req_to_token[row, :m] = host_to_device(slots, self.device)

    def copy_spans(
        self, dst_rows: list[int], src_rows: list[int], starts: list[int], ends: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [starts[i], ends[i]) of each dst row take those of the matching src row, on
        the host and the device, in one indexed copy each (rows may swap: the sources are read
        first). Returns the dst positions' previous and new slots ([T] int64 each, host, T the
        spans' total length)."""
        lengths = torch.tensor(ends, dtype=torch.int64) - torch.tensor(starts, dtype=torch.int64)  # [M]
        dst = torch.tensor(dst_rows, dtype=torch.int64).repeat_interleave(lengths)  # [T]
        src = torch.tensor(src_rows, dtype=torch.int64).repeat_interleave(lengths)  # [T]
        offsets = torch.tensor(starts, dtype=torch.int64) - (torch.cumsum(lengths, 0) - lengths)  # [M]
        cols = torch.arange(dst.numel(), dtype=torch.int64) + offsets.repeat_interleave(lengths)  # [T]
        old = self.req_to_token_cpu[dst, cols]  # [T]
        new = self.req_to_token_cpu[src, cols]  # [T]
        self.req_to_token_cpu[dst, cols] = new
        if self.req_to_token is not self.req_to_token_cpu:
            index = host_to_device(torch.stack([dst, src, cols]), self.device)  # [3, T]
            self.req_to_token[index[0], index[2]] = self.req_to_token[index[1], index[2]]
        return old, new

    def slots_of(self, row: int, length: int) -> torch.Tensor:
        """[length] int64 on the host: the KV slots of positions [0, length) of request `row`."""
        return self.req_to_token_cpu[row, :length]

    def alloc(self) -> Optional[int]:
        return self.free_slots.pop(0) if self.free_slots else None

    def free(self, idx: int) -> None:
        self.free_slots.append(idx)

    def available_size(self) -> int:
        return len(self.free_slots)


class TokenToKVPoolAllocator:
    """Hands out KV slots 1..size, on the host (the scheduler decides with them; the device gets
    them inside each step's one input copy). First freed, first handed out again: the free slots
    are a ring over one buffer, so alloc and free cost O(slots moved), not O(pool)."""

    def __init__(self, size: int, device: Union[str, torch.device] = "cpu") -> None:
        self.size = size
        self.device = device
        self._ring = torch.arange(1, size + 1, dtype=torch.int64)  # [size] int64, host
        self._head = 0  # the next slot handed out; the free ones follow it, wrapping around
        self._num_free = size

    def alloc(self, n: int) -> Optional[torch.Tensor]:
        if n > self._num_free:
            return None
        end = self._head + n
        if end <= self.size:
            out = self._ring[self._head : end].clone()
        else:
            out = torch.cat([self._ring[self._head :], self._ring[: end - self.size]])
        self._head = end % self.size if self.size else 0
        self._num_free -= n
        return out

    def free(self, indices: torch.Tensor) -> None:
        n = indices.numel()
        if n == 0:
            return
        if self._num_free + n > self.size:
            raise RuntimeError(f"Freeing {n} KV slots with {self._num_free} of {self.size} already free.")
        indices = indices.reshape(-1).to("cpu", torch.int64)
        tail = (self._head + self._num_free) % self.size
        first = min(n, self.size - tail)
        self._ring[tail : tail + first] = indices[:first]
        self._ring[: n - first] = indices[first:]
        self._num_free += n

    def available_size(self) -> int:
        return self._num_free


class KVCache:
    """Per-layer K and V buffers [size + 2, num_kv_heads, head_dim]: row 0 is the padding slot
    read by padded positions, row size + 1 the one padding rows write to. With v_head_dim 0
    there is one buffer per layer, returned as both K and V (KVCacheLayout)."""

    def __init__(
        self,
        size: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: Union[str, torch.device],
        v_head_dim: Optional[int] = None,
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.padding_write_slot = size + 1
        # Zeroed, so the whole pool is resident from the start on CPU too (as on a GPU): the
        # server's memory is claimed at launch, where a machine without it fails at once, and
        # does not creep up under traffic as the free list walks through untouched pages (the
        # soak saw +2 GiB that way). Row 0, the padding slot, must be zeros anyway.
        shape = (size + 2, num_kv_heads, head_dim)
        self.k_buffers = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.shared_kv = v_head_dim == 0
        if self.shared_kv:
            self.v_buffers = self.k_buffers
        else:
            v_shape = (size + 2, num_kv_heads, v_head_dim)
            self.v_buffers = [torch.zeros(v_shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @classmethod
    def from_layout(cls, size: int, layout: KVCacheLayout, dtype: torch.dtype,
                    device: Union[str, torch.device]) -> "KVCache":
        return cls(size, layout.num_layers, layout.num_kv_heads, layout.head_dim, dtype, device, layout.v_head_dim)

    def set_kv(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: Optional[torch.Tensor]) -> None:
        """loc [N] int64 slots; k [N, num_kv_heads, head_dim], v [N, num_kv_heads, v_head_dim]
        (None where K and V share the buffer)."""
        # index_copy_ copies whole rows; buf[loc] = k (index_put_) goes through the general
        # advanced-indexing kernel, slower per call on CPU.
        self.k_buffers[layer_id].index_copy_(0, loc, k)
        if not self.shared_kv:
            self.v_buffers[layer_id].index_copy_(0, loc, v)

    def get_kv(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffers[layer_id], self.v_buffers[layer_id]

    def mem_bytes(self) -> int:
        buffers = self.k_buffers if self.shared_kv else self.k_buffers + self.v_buffers
        return sum(b.numel() * b.element_size() for b in buffers)
