"""Paged attention over the KV cache with torch SDPA.

Each request's new queries attend causally to all of its tokens [0, seq_len), whose KV slots
are read through req_to_token. Decode reads the slots in place with a kernel where there is one
(the C kernel on CPU in float32; the Triton kernel on CUDA in batch-invariant mode), and otherwise
runs one batched SDPA over a padded gather (per request in batch-invariant mode); extend runs one
SDPA per request, since prompt chunks differ widely in length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sgl_kernel_ext.attention.decode_attention_cpu import cpu_decode_attention_available, decode_attention_cpu
from sglang.srt.layers.batch_invariant import is_batch_invariant
from sglang.srt.model_executor.forward_batch_info import ForwardBatch


class GatherWorkspace:
    """Reused destination of the per-layer K/V gathers: on CPU a fresh multi-MB tensor in every
    layer costs more in page faults than the copy itself. Grows, never shrinks."""

    def __init__(self, num_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> None:
        self.k = torch.empty((0, num_kv_heads, head_dim), dtype=dtype, device=device)
        self.v = torch.empty_like(self.k)

    def take(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Two [rows, Hk, D] buffers, valid until the next step's take."""
        if rows > self.k.shape[0]:
            size = max(rows, 2 * self.k.shape[0])
            self.k = self.k.new_empty((size, *self.k.shape[1:]))
            self.v = torch.empty_like(self.k)
        return self.k[:rows], self.v[:rows]


@dataclass
class DecodeMetadata:
    kv_indices: torch.Tensor  # [B * L] int64 KV slots, padding -> slot 0
    max_len: int  # L
    mask: torch.Tensor  # [B, 1, 1, L] additive, model dtype: 0 = attend, -inf = padding
    k_out: torch.Tensor  # [B * L, Hk, D] gather destination, shared by the layers
    v_out: torch.Tensor


@dataclass
class ExtendMetadata:
    token_starts: list[int]  # offset of each request's first new token in the batch
    extend_lens: list[int]
    kv_indices: list[torch.Tensor]  # per request [S_i] int64 KV slots of positions [0, S_i)
    masks: list[Optional[torch.Tensor]]  # per request [n_i, S_i] bool; None = plain causal (no prefix)
    k_out: torch.Tensor  # [max S_i, Hk, D] gather destination, shared by requests and layers
    v_out: torch.Tensor


@dataclass
class PagedDecodeMetadata:
    """Decode by a kernel that reads each request's slots itself; its rows never depend on the
    batch, so it also serves batch-invariant mode."""

    req_to_token: torch.Tensor  # [R, C] int64
    req_pool_indices: torch.Tensor  # [B] int64
    seq_lens: torch.Tensor  # [B] int64


AttentionMetadata = DecodeMetadata | ExtendMetadata | PagedDecodeMetadata


def build_attention_metadata(
    forward_batch: ForwardBatch, req_to_token: torch.Tensor, workspace: GatherWorkspace
) -> AttentionMetadata:
    """Computed once per step and shared by every layer."""
    if forward_batch.forward_mode.is_decode() and _paged_decode_kernel_applies(req_to_token, workspace.k.dtype):
        return PagedDecodeMetadata(req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens)
    max_len = max(forward_batch.seq_lens_cpu)
    rows = req_to_token[forward_batch.req_pool_indices, :max_len]  # [B, L] int64
    # The padded batched decode reduces over the batch's longest length, so a row's bits would
    # depend on its batch-mates; batch-invariant mode attends each request on its own instead
    # (on CUDA in one kernel launch, above).
    if forward_batch.forward_mode.is_decode() and not is_batch_invariant():
        valid = torch.arange(max_len, device=rows.device) < forward_batch.seq_lens.unsqueeze(1)  # [B, L] bool
        # Padding reads the zeroed slot 0: stale slots could hold anything, and 0 * NaN is NaN.
        k_out, v_out = workspace.take(rows.numel())
        # Additive, built once for all layers: SDPA would convert a bool mask in every layer.
        bias = torch.zeros(valid.shape, dtype=k_out.dtype, device=rows.device).masked_fill_(~valid, float("-inf"))
        return DecodeMetadata((rows * valid).view(-1), max_len, bias[:, None, None, :], k_out, v_out)
    starts, kv_indices, masks = [], [], []
    start = 0
    for i, (prefix, n) in enumerate(zip(forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu)):
        starts.append(start)
        start += n
        kv_indices.append(rows[i, : prefix + n])
        masks.append(_prefix_causal_mask(prefix, n, rows.device) if prefix else None)
    k_out, v_out = workspace.take(max_len)
    return ExtendMetadata(starts, forward_batch.extend_seq_lens_cpu, kv_indices, masks, k_out, v_out)


def _paged_decode_kernel_applies(req_to_token: torch.Tensor, kv_dtype: torch.dtype) -> bool:
    if req_to_token.is_cuda:
        # Batch-invariant mode only: the padded batched SDPA is faster on a GPU.
        return is_batch_invariant()
    return kv_dtype == torch.float32 and cpu_decode_attention_available()


def _prefix_causal_mask(prefix: int, n: int, device: torch.device) -> torch.Tensor:
    """[n, prefix + n] bool: new token q sits at position prefix + q and sees keys up to it."""
    key_pos = torch.arange(prefix + n, device=device)
    query_pos = torch.arange(prefix, prefix + n, device=device)
    return key_pos.unsqueeze(0) <= query_pos.unsqueeze(1)


class Attention(nn.Module):
    """Stores this step's K/V into the cache (unless the caller has), then attends over the cached K/V."""

    def __init__(self, layer_id: int, num_heads: int, num_kv_heads: int, head_dim: int, scaling: float) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scaling = scaling

    def forward(
        self, q: torch.Tensor, k: Optional[torch.Tensor], v: Optional[torch.Tensor], forward_batch: ForwardBatch
    ) -> torch.Tensor:
        """q [N, Hq, D]; k, v [N, Hk, D], or None where the caller has already stored this step's
        K/V in the cache -> [N, Hq * D]."""
        kv_cache = forward_batch.kv_cache
        if k is not None:
            kv_cache.set_kv(self.layer_id, forward_batch.out_cache_loc, k, v)
        k_buf, v_buf = kv_cache.get_kv(self.layer_id)
        meta = forward_batch.attn_metadata
        if isinstance(meta, PagedDecodeMetadata):
            out = self._paged_decode(q, k_buf, v_buf, meta)  # [B, Hq, D]
        elif isinstance(meta, DecodeMetadata):
            out = self._decode(q, k_buf, v_buf, meta)
        else:
            out = self._extend(q, k_buf, v_buf, meta)
        return out.reshape(q.shape[0], self.num_heads * self.head_dim)  # [N, Hq * D]

    def _paged_decode(
        self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: PagedDecodeMetadata
    ) -> torch.Tensor:
        args = (q, k_buf, v_buf, meta.req_to_token, meta.req_pool_indices, meta.seq_lens, self.scaling)
        if not q.is_cuda:
            return decode_attention_cpu(*args)
        # Imported here: triton is only a GPU (and test) dependency.
        from sgl_kernel_ext.attention.decode_attention import decode_attention_triton

        return decode_attention_triton(*args)

    def _decode(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: DecodeMetadata) -> torch.Tensor:
        batch = q.shape[0]
        shape = (batch, meta.max_len, self.num_kv_heads, self.head_dim)
        k = torch.index_select(k_buf, 0, meta.kv_indices, out=meta.k_out).view(shape).transpose(1, 2)  # [B, Hk, L, D]
        v = torch.index_select(v_buf, 0, meta.kv_indices, out=meta.v_out).view(shape).transpose(1, 2)  # [B, Hk, L, D]
        # The single query of each row, grouped under its KV head: GQA without repeating K/V.
        q = q.view(batch, self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim)  # [B, Hk, G, D]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask, scale=self.scaling)  # [B, Hk, G, D]

    def _extend(self, q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, meta: ExtendMetadata) -> torch.Tensor:
        outs = []
        for start, n, slots, mask in zip(meta.token_starts, meta.extend_lens, meta.kv_indices, meta.masks):
            qi = q[start : start + n].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
            seq = slots.shape[0]
            ki = torch.index_select(k_buf, 0, slots, out=meta.k_out[:seq]).transpose(0, 1).unsqueeze(0)  # [1, Hk, S, D]
            vi = torch.index_select(v_buf, 0, slots, out=meta.v_out[:seq]).transpose(0, 1).unsqueeze(0)  # [1, Hk, S, D]
            o = F.scaled_dot_product_attention(
                qi, ki, vi, attn_mask=mask, is_causal=mask is None, scale=self.scaling, enable_gqa=True
            )  # [1, Hq, n, D]
            outs.append(o[0].transpose(0, 1))  # [n, Hq, D]
        return torch.cat(outs)
